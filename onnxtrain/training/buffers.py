"""Contiguous parameter buffers: the parameters flattened and concatenated in model order, and back.

ONNX Runtime's ``get_contiguous_parameters`` and ``copy_buffer_to_parameters``
(and the C++ ``ToBuffer`` and ``FromBuffer``), over the tensors of a
:class:`~onnxtrain.training.store.StateStore`, through host memory. One
buffer holds one dtype: parameters of several dtypes go in
``{dtype name: buffer}``, each in model order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from onnxtrain.training import values
from onnxtrain.training.device import Device
from onnxtrain.training.store import StateStore, StateTensor

#: A contiguous parameter buffer: one array/OrtValue, or ``{dtype name: buffer}`` for mixed dtypes.
Buffer = np.ndarray | ort.OrtValue | Mapping[str, np.ndarray | ort.OrtValue]

#: ONNX Runtime's sentence for reading the buffer of a nominal state.
NOMINAL_COPY = "Cannot copy parameters from a nominal checkpoint state."


def buffers_per_dtype(store: StateStore, names: Sequence[str], device: Device) -> dict[str, ort.OrtValue]:
    """``{dtype name: buffer}``: per dtype, the parameters ``names`` of that dtype flattened and concatenated
    in that order, on ``device``. ``NominalStateError`` while some hold no value."""
    store.check_loaded(names, NOMINAL_COPY)
    store.settle()
    groups: dict[str, list[np.ndarray]] = {}
    for name in names:
        tensor = store.tensors[name]
        groups.setdefault(str(tensor.dtype), []).append(tensor.numpy().ravel())
    return {
        kind: values.parameter_buffer(values.from_numpy(np.concatenate(parts), device))
        for kind, parts in groups.items()
    }


def one_buffer(store: StateStore, names: Sequence[str], device: Device) -> ort.OrtValue:
    """The parameters ``names`` in one buffer of their dtype; ``TypeError`` for parameters of several dtypes."""
    store.check_loaded(names, NOMINAL_COPY)
    kinds = list(dict.fromkeys(str(store.tensors[name].dtype) for name in names))
    if len(kinds) > 1:
        raise TypeError(
            f"the parameters have several dtypes {kinds}, and one buffer holds one dtype; use "
            "get_contiguous_parameters_per_dtype(), which returns {dtype: buffer}"
        )
    return buffers_per_dtype(store, names, device).get(kinds[0] if kinds else "float32") or (
        values.parameter_buffer(values.from_numpy(np.zeros(0, np.float32), device))
    )


def copy_into_parameters(store: StateStore, names: Sequence[str], buffer: Buffer, trainable_only: bool) -> None:
    """Write ``buffer`` (one buffer, or ``{dtype name: buffer}``) into the parameters ``names``.

    Everything is checked before anything is written: the dtypes, and each
    buffer's size against its parameters' (``ValueError``, ``TypeError``).
    ``trainable_only`` names the parameters in the messages.
    """
    groups: dict[str, list[tuple[str, StateTensor]]] = {}
    for name in names:
        tensor = store.tensors[name]
        groups.setdefault(str(tensor.dtype), []).append((name, tensor))
    if isinstance(buffer, Mapping):
        given = {str(kind): _host_array(value, f"buffer[{kind!r}]") for kind, value in buffer.items()}
    else:
        array = _host_array(buffer, "buffer")
        if len(groups) > 1:
            raise TypeError(
                f"the parameters have several dtypes {list(groups)}; pass {{dtype name: buffer}} as "
                "get_contiguous_parameters_per_dtype() gives"
            )
        given = {next(iter(groups), str(array.dtype)): array}
    if set(given) != set(groups):
        raise ValueError(f"the buffers are for dtypes {sorted(given)}; the parameters have {sorted(groups)}")
    which = "trainable parameters" if trainable_only else "parameters"
    for kind, members in groups.items():
        array, expected = given[kind], sum(t.size for _, t in members)
        if str(array.dtype) != kind:
            raise TypeError(f"the buffer is {array.dtype}, but the {which} are {kind}")
        if array.size != expected:
            raise ValueError(
                f"the buffer has {array.size} {kind} elements, but the {which} have {expected} "
                f"(get_parameters_size(trainable_only={trainable_only}))"
            )
    store.settle()
    for kind, members in groups.items():  # all checked: now write
        flat, offset = given[kind].reshape(-1), 0
        for name, tensor in members:
            tensor.write(flat[offset : offset + tensor.size].reshape(tensor.shape), f"parameter {name!r}")
            store.unloaded.discard(name)
            offset += tensor.size


def _host_array(value: Any, what: str) -> np.ndarray:
    if isinstance(value, ort.OrtValue):
        return values.to_numpy(value)
    if isinstance(value, np.ndarray):
        return value
    raise TypeError(f"{what} must be an onnxruntime.OrtValue or a numpy.ndarray, not {type(value).__name__}")


__all__ = ["NOMINAL_COPY", "Buffer", "buffers_per_dtype", "copy_into_parameters", "one_buffer"]
