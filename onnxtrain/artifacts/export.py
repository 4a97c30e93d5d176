"""Export for inference: the eval model with the current parameter values baked in."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import onnx
from onnx import numpy_helper

from onnxtrain import checkpoint
from onnxtrain.artifacts.metadata import (
    PRECISION_KEY,
    drop_metadata,
    drop_training_metadata,
    inference_outputs,
    set_metadata,
)
from onnxtrain.checkpoint import CheckpointState
from onnxtrain.graph import dtypes
from onnxtrain.graph.builder import GraphBuilder, describe_type
from onnxtrain.graph.passes import autocast, prune_unused_nodes


@runtime_checkable
class Snapshots(Protocol):
    """A runtime's state (``onnxtrain.api.CheckpointState``): it gives a checkpoint of its values."""

    def to_checkpoint(self, include_optimizer_state: bool = True) -> CheckpointState: ...


def export_model_for_inferencing(
    eval_model: onnx.ModelProto | str | os.PathLike[str],
    parameters: CheckpointState | Snapshots | Mapping[str, Any] | str | os.PathLike[str],
    output_names: Sequence[str],
    *,
    precision: str | None = None,
) -> onnx.ModelProto:
    """An inference model from ``eval_model``: outputs ``output_names``, parameters as initializers.

    Every graph input that names a parameter becomes an initializer holding its
    value from ``parameters``: a checkpoint (``onnxtrain.checkpoint.CheckpointState``,
    or a checkpoint file's path), the runtime's state (``onnxtrain.api.CheckpointState``),
    or ``{name: array}`` (``state.parameters`` too). ``eval_model`` is a model or a path. Nodes
    the requested outputs do not need are removed, and so are the inputs they
    do not read (the labels and targets of the loss), and the metadata that
    describes training (:mod:`onnxtrain.artifacts.metadata`). ``eval_model`` is not changed.
    Raises ``ValueError`` for unknown outputs, a nominal checkpoint or a value
    of another shape than its input's, ``TypeError`` for another element type.

    ``precision``: ``None`` computes as the eval model does (in a half type
    where it was generated with one); ``"fp32"`` computes in float32
    throughout (the autocast casts removed); ``"bf16"`` or ``"fp16"``
    computes in that type where the autocast policy says, with the weights
    that only half nodes read stored in it (half the file).
    """
    if isinstance(output_names, str) or not output_names:
        raise ValueError(f"output_names must be a non-empty list of value names, not {output_names!r}")
    if isinstance(eval_model, (str, os.PathLike)):
        eval_model = onnx.load(os.fspath(eval_model))
    elif not isinstance(eval_model, onnx.ModelProto):
        raise TypeError(
            f"eval_model must be an onnx.ModelProto or the eval model's path, not {type(eval_model).__name__}"
        )
    values = _values(parameters)
    half = None if precision is None else autocast.check_precision(precision)
    model = onnx.ModelProto()
    model.CopyFrom(eval_model)
    drop_training_metadata(model)
    if precision is not None:
        autocast.strip_autocast(model)
    graph = model.graph
    message = unknown_outputs(eval_model, output_names, model)
    if message:
        raise ValueError(f"{message}: name those (or any value the eval model computes)")
    inputs = [value for value in graph.input if value.name not in values]
    baked = [value.name for value in graph.input if value.name in values]
    for value in graph.input:
        if value.name in values:
            _check_value(value, np.asarray(values[value.name]))
    del graph.input[:]
    graph.input.extend(inputs)
    graph.initializer.extend(numpy_helper.from_array(np.asarray(values[name]), name) for name in baked)
    if half is not None:
        autocast.autocast(model, half)
    builder = GraphBuilder(model)
    builder.set_outputs(list(output_names))
    prune_unused_nodes(model)
    if half is not None:
        autocast.half_parameters(model)
        set_metadata(model, {PRECISION_KEY: str(precision)})
    elif precision is not None:
        drop_metadata(model, PRECISION_KEY)
    read = {name for node in graph.node for name in node.input} | set(output_names)
    kept = [value for value in graph.input if value.name in read]
    del graph.input[:]
    graph.input.extend(kept)
    return GraphBuilder(model).finalize()


def unknown_outputs(eval_model: onnx.ModelProto, names: Sequence[str], searched: onnx.ModelProto | None = None) -> str:
    """``""``, or the start of an error naming those of ``names`` that ``searched`` (default: the eval model)
    computes no value of, and the outputs an inference model of the eval model has (the forward model's, not the
    loss)."""
    graph = eval_model.graph
    found = (searched or eval_model).graph
    computed = {name for node in found.node for name in node.output} | {value.name for value in found.input}
    unknown = [name for name in names if name not in computed]
    if not unknown:
        return ""
    try:
        available = inference_outputs(eval_model)
    except ValueError:  # artifacts without the metadata: the eval model's outputs but the loss
        available = [value.name for value in graph.output[1:]]
    listed = ", ".join(repr(name) for name in available) or "none besides the loss"
    return f"the model computes no {', '.join(repr(name) for name in unknown)}; its outputs are {listed}"


def _values(parameters: Any) -> dict[str, np.ndarray]:
    """``{name: array}`` of the parameters :func:`export_model_for_inferencing` takes, in whichever form."""
    if isinstance(parameters, (str, os.PathLike)):
        parameters = checkpoint.load(parameters)
    elif isinstance(parameters, Snapshots):
        if getattr(parameters, "is_nominal", False):
            raise ValueError("the state is nominal (no values); load the full checkpoint to export")
        parameters = parameters.to_checkpoint(include_optimizer_state=False)
    if isinstance(parameters, CheckpointState):
        if parameters.is_nominal:
            raise ValueError("a nominal checkpoint holds no parameter values; load the full checkpoint to export")
        return dict(parameters.trainable) | dict(parameters.frozen)
    if not isinstance(parameters, Mapping):
        raise TypeError(
            "parameters must be a checkpoint (onnxtrain.checkpoint.CheckpointState or its path), the runtime's "
            f"state (onnxtrain.api.CheckpointState) or {{name: array}}, not {type(parameters).__name__}"
        )
    return {name: np.asarray(value) for name, value in parameters.items()}


def _check_value(value: onnx.ValueInfoProto, array: np.ndarray) -> None:
    """``TypeError``/``ValueError`` unless ``array`` fits the graph input ``value`` it replaces."""
    tensor = value.type.tensor_type
    expected = dtypes.to_numpy_dtype(tensor.elem_type)
    if array.dtype != expected:
        raise TypeError(
            f"parameter {value.name!r} is {array.dtype}, but the eval model takes {describe_type(value.type)}; "
            f"pass it as {expected}"
        )
    if tensor.HasField("shape"):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        if len(dims) != array.ndim or any(d is not None and d != n for d, n in zip(dims, array.shape, strict=True)):
            raise ValueError(
                f"parameter {value.name!r} has shape {list(array.shape)}, but the eval model takes "
                f"{describe_type(value.type)}"
            )
