"""What the runtime reads from the artifacts: models from paths or bytes, and their inputs and outputs.

The training model's inputs are, in order (docs/artifacts.md): the user
inputs, every parameter, ``<p>_grad.accumulation.buffer`` per trainable
parameter and ``lazy_reset_grad``; its outputs the loss, the additional
outputs, ``<p>_grad.accumulation.out`` per trainable parameter and
``<stat>.updated`` per BatchNormalization running statistic. As in ONNX
Runtime, inputs are classified by name against the checkpoint: a checkpoint
parameter is a parameter, the rest are user inputs. Every mismatch between
the checkpoint and a model raises ``ValueError`` here, before anything runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from onnxtrain.artifacts.generate import INITIAL_STATE_KEY, PROTOBUF_LIMIT
from onnxtrain.artifacts.ort_training import to_standard_accumulation
from onnxtrain.autodiff.accumulation import LAZY_RESET_GRAD, accumulated_name, buffer_name
from onnxtrain.graph import dtypes, external
from onnxtrain.optim.base import grad_name, state_name, updated_name
from onnxtrain.optim.emit import LEARNING_RATE, STEP
from onnxtrain.training.values import cast_hint, dtype_text, is_string

#: A model as the runtime takes it: a path, the serialized bytes, or a ModelProto.
ModelSource = str | os.PathLike[str] | bytes | onnx.ModelProto

#: A dimension: a fixed size, a symbolic name, or ``None`` (unknown).
Dim = int | str | None


@dataclass(frozen=True)
class LoadedModel:
    """A model's graph (external data not loaded) and what onnxruntime loads it from."""

    proto: onnx.ModelProto
    source: str | bytes
    path: Path | None = None

    def with_data(self) -> onnx.ModelProto:
        """The full model, external data included (read from beside the file)."""
        if self.path is None:
            return self.proto
        return onnx.load(os.fspath(self.path))


def load_model(source: ModelSource, what: str) -> LoadedModel:
    """``source`` as a :class:`LoadedModel`; ``what`` names the argument in errors.

    ONNX Runtime's in-place accumulators (``com.microsoft::InPlaceAccumulatorV2``,
    artifacts of ``target="onnxruntime-training"``) are rewritten in standard
    operators (:func:`onnxtrain.artifacts.ort_training.to_standard_accumulation`).
    """
    return _in_standard_operators(_load_model(source, what))


def _in_standard_operators(model: LoadedModel) -> LoadedModel:
    """``model``, or its translation when it accumulates gradients with ONNX Runtime's kernel."""
    translated = to_standard_accumulation(model.proto)
    if translated is model.proto:
        return model
    if model.path is not None and external.has_external_data(translated):
        translated = to_standard_accumulation(model.with_data())
    data = translated.SerializeToString()
    return LoadedModel(translated, data)


def _load_model(source: ModelSource, what: str) -> LoadedModel:
    """``source`` as read: its graph (external data not loaded) and what onnxruntime loads."""
    if isinstance(source, onnx.ModelProto):
        if source.ByteSize() > PROTOBUF_LIMIT:
            raise ValueError(
                f"{what} is a ModelProto over protobuf's 2 GiB limit; save it with external data and pass the path"
            )
        _check_no_external_data(source, what)
        data = source.SerializeToString()
        return LoadedModel(onnx.load_from_string(data), data)
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        try:
            proto = onnx.load_from_string(data)
        except Exception as error:  # protobuf's DecodeError
            raise ValueError(f"{what}: the bytes are not a serialized ONNX model ({error})") from error
        _check_no_external_data(proto, what)
        return LoadedModel(proto, data)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"{what}: no ONNX model at {str(path)!r}")
        try:
            proto = onnx.load(os.fspath(path), load_external_data=False)
        except Exception as error:
            raise ValueError(f"{what}: {str(path)!r} is not a readable ONNX model ({error})") from error
        try:  # onnxruntime reads the data itself: only files inside the model's folder, of the declared sizes
            external.check_model_data(proto, path.resolve().parent)
        except ValueError as error:
            raise ValueError(f"{what} {str(path)!r}: {error}") from None
        return LoadedModel(proto, os.fspath(path), path.resolve())
    raise TypeError(f"{what} must be a path, the model's bytes or an onnx.ModelProto, not {type(source).__name__}")


def _check_no_external_data(model: onnx.ModelProto, what: str) -> None:
    """``ValueError`` when a model given without its path refers to data files (found nowhere safe)."""
    if external.has_external_data(model):
        raise ValueError(
            f"{what} refers to external data files, and a model given in memory has no folder to find them in: "
            "pass the path of the .onnx file instead"
        )


# --------------------------------------------------------------------- tensors


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output: name, NumPy dtype and dimensions (``None``: unknown rank)."""

    name: str
    dtype: np.dtype
    dims: tuple[Dim, ...] | None
    note: str = field(default="", compare=False)  # the value's doc_string: where its shape comes from

    @classmethod
    def of(cls, value: onnx.ValueInfoProto, model: str) -> TensorSpec:
        if not value.type.HasField("tensor_type"):
            raise ValueError(
                f"the {model}'s {value.name!r} is a {value.type.WhichOneof('value')}; only tensors are supported"
            )
        tensor = value.type.tensor_type
        dims = None
        if tensor.HasField("shape"):
            dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim)
        return cls(value.name, dtypes.to_numpy_dtype(tensor.elem_type), dims, value.doc_string)

    @property
    def static(self) -> bool:
        """Whether every dimension is a fixed size (the tensor's shape is known before running)."""
        return self.dims is not None and all(d.__class__ is int for d in self.dims)

    @property
    def shape(self) -> tuple[int, ...]:
        """The fixed shape of a :attr:`static` spec."""
        if not self.static or self.dims is None:
            raise ValueError(f"{self.name!r} ({self.describe()}) has no fixed shape")
        return tuple(int(d) for d in self.dims if d is not None)

    @property
    def is_string(self) -> bool:
        """Whether this is an ONNX STRING tensor (NumPy ``object`` arrays of ``str``)."""
        return is_string(self.dtype)

    def describe(self) -> str:
        """``float32[batch, 784]``; ``string[batch]`` for a STRING tensor."""
        if self.dims is None:
            return f"{dtype_text(self.dtype)}[...]"
        return f"{dtype_text(self.dtype)}[{', '.join('?' if d is None else str(d) for d in self.dims)}]"

    def fits(self, dtype: np.dtype, shape: Sequence[int]) -> bool:
        """Whether a tensor of ``dtype`` and ``shape`` may be fed here (symbolic dimensions take any size)."""
        if dtype != self.dtype:
            return False
        dims = self.dims
        if dims is None:
            return True
        if len(shape) != len(dims):
            return False
        for d, n in zip(dims, shape):  # noqa: B905, SIM110 (lengths checked; a loop is faster than all())
            if d.__class__ is int and d != n:
                return False
        return True


def _class_scores_for_labels(spec: TensorSpec, dtype: np.dtype, shape: Sequence[int]) -> bool:
    """Whether a float array of ``shape`` given for integer labels ``spec`` has one more (trailing) axis: one
    column per class, which ``.astype`` cannot turn into labels."""
    return (
        spec.dtype.kind in "iu"
        and dtype.kind == "f"
        and spec.dims is not None
        and len(shape) == len(spec.dims) + 1
        and shape[-1] > 1
    )


def _array_signature(args: Sequence[Any]) -> tuple[tuple[np.dtype, tuple[int, ...]], ...] | None:
    """``(dtype, shape)`` per argument when all are C-contiguous native ``numpy.ndarray``s (which the
    check passes through unchanged), else None."""
    signature = []
    for value in args:
        if value.__class__ is not np.ndarray:
            return None
        flags = value.flags
        if not flags.c_contiguous or not value.dtype.isnative:
            return None
        signature.append((value.dtype, value.shape))
    return tuple(signature)


def _shape_text(shape: Sequence[int]) -> str:
    return f"[{', '.join(str(d) for d in shape)}]"


def _string_array(value: np.ndarray, what: str) -> np.ndarray:
    """``value`` as the runtime feeds a STRING tensor: a C-contiguous object array of ``str``.

    ``<U`` arrays are converted; ``S`` arrays and ``bytes`` elements are decoded
    as UTF-8 (onnxruntime reads an ``S`` element that fills its width past its
    end, and feeds a ``bytes`` object as its repr). ``ValueError`` for bytes
    that are not UTF-8, ``TypeError`` for an element that is neither ``str``
    nor ``bytes``; ``what`` names the input.
    """
    kind = value.dtype.kind
    if kind == "U":
        return np.ascontiguousarray(value.astype(object))
    if kind == "S":
        try:
            return np.ascontiguousarray(np.char.decode(value, "utf-8").astype(object))
        except UnicodeDecodeError as error:
            raise ValueError(f"{what}: the bytes are not UTF-8 ({error}); decode them to str first") from None
    flat = value.ravel()
    if all([element.__class__ is str for element in flat]):  # a list: faster than a generator here
        return np.ascontiguousarray(value)
    converted = np.empty(flat.shape, object)
    for i, element in enumerate(flat):
        if isinstance(element, str):
            converted[i] = element
        elif isinstance(element, (bytes, np.bytes_)):
            try:
                converted[i] = bytes(element).decode("utf-8")
            except UnicodeDecodeError as error:
                at = [int(d) for d in np.unravel_index(i, value.shape)] if value.ndim else []
                raise ValueError(f"{what}: the bytes at {at} are not UTF-8 ({error}); decode them first") from None
        else:
            at = [int(d) for d in np.unravel_index(i, value.shape)] if value.ndim else []
            raise TypeError(
                f"{what} is a string tensor, so each element must be a str (or UTF-8 bytes); the element at {at} "
                f"is {type(element).__name__} ({element!r}): convert the array with .astype(str)"
            )
    return converted.reshape(value.shape)


class UserInputs:
    """The user inputs of a model: checks what the caller passes, in one place, before anything runs."""

    def __init__(self, specs: Sequence[TensorSpec], model: str) -> None:
        self.specs = tuple(specs)
        self.names = tuple(spec.name for spec in self.specs)
        self._model = model
        self._index = {name: i for i, name in enumerate(self.names)}
        # per input, its symbolic dimensions as (axis, name): sizes must agree across inputs
        self._symbolic = tuple(
            tuple((axis, d) for axis, d in enumerate(spec.dims or ()) if isinstance(d, str)) for spec in self.specs
        )
        # (dtype, shape) per input of the last positional call whose inputs were all plain C-contiguous
        # native NumPy arrays and passed the check: the same signature again skips the check (never for a
        # model with string inputs: their arrays are converted, and their elements checked, on every call)
        self._passed: tuple[tuple[np.dtype, tuple[int, ...]], ...] | None = None
        #: Whether some input is a STRING tensor; onnxruntime's IOBinding cannot bind those.
        self.strings = any(spec.is_string for spec in self.specs)

    def signature(self) -> str:
        return ", ".join(f"{spec.name}: {spec.describe()}" for spec in self.specs) or "no inputs"

    def collect(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[np.ndarray | ort.OrtValue]:
        """The inputs in model order, from positional and keyword arguments, each checked.

        Inputs with the dtypes and shapes of the last call that passed (all
        plain C-contiguous NumPy arrays, by position) are not checked again.
        """
        if not kwargs and len(args) == len(self.specs):
            signature = _array_signature(args)
            if signature is not None and signature == self._passed:
                return list(args)
            values = args
        else:
            signature, values = None, self._arrange(args, kwargs)
        sizes: dict[str, tuple[int, str]] = {}
        checked = [self._check(i, value, sizes) for i, value in enumerate(values)]
        if signature is not None and not self.strings:
            self._passed = signature
        return checked

    def _arrange(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
        if len(args) > len(self.specs):
            raise TypeError(
                f"the {self._model} takes {len(self.specs)} user input(s) ({self.signature()}); got {len(args)}"
            )
        values: list[Any] = list(args) + [None] * (len(self.specs) - len(args))
        given = [True] * len(args) + [False] * (len(self.specs) - len(args))
        for name, value in kwargs.items():
            index = self._index.get(name)
            if index is None:
                raise TypeError(
                    f"the {self._model} has no input {name!r}; its user inputs are {list(self.names)} "
                    f"({self.signature()})"
                )
            if given[index]:
                raise TypeError(f"input {name!r} of the {self._model} is given twice (by position and by name)")
            values[index], given[index] = value, True
        missing = [self.specs[i] for i, ok in enumerate(given) if not ok]
        if missing:
            listed = ", ".join(f"{spec.name!r} ({spec.describe()})" for spec in missing)
            raise TypeError(f"missing input {listed} of the {self._model}; it takes {self.signature()}")
        return values

    def _check(self, index: int, value: Any, sizes: dict[str, tuple[int, str]]) -> np.ndarray | ort.OrtValue:
        spec = self.specs[index]
        if value.__class__ is np.ndarray and value.flags.c_contiguous and value.dtype.isnative:
            dtype, shape = value.dtype, value.shape
        elif isinstance(value, ort.OrtValue):
            if not value.is_tensor():
                raise TypeError(f"input {spec.name!r} of the {self._model} must be a tensor OrtValue")
            dtype, shape = dtypes.to_numpy_dtype(value.element_type()), tuple(value.shape())
        elif isinstance(value, (np.ndarray, np.generic)):
            value = np.ascontiguousarray(value)
            if not value.dtype.isnative:
                value = value.astype(value.dtype.newbyteorder("="))
            dtype, shape = value.dtype, value.shape
        else:
            raise TypeError(
                f"input {spec.name!r} of the {self._model} must be a numpy.ndarray or an onnxruntime.OrtValue "
                f"({spec.describe()}), not {type(value).__name__}"
            )
        if spec.is_string and not isinstance(value, ort.OrtValue) and dtype.kind in "USO":
            value = _string_array(value, f"input {spec.name!r} of the {self._model}")
            dtype = value.dtype
        if not spec.fits(dtype, shape):
            if spec.is_string:
                hint = ": cast it with .astype(str) (arrays of str or bytes, and object arrays of str, are taken)"
            elif _class_scores_for_labels(spec, dtype, shape):
                hint = (
                    ": these look like one-hot labels or class probabilities (one more axis than the labels); "
                    f"pass the class indices, labels.argmax(axis=-1).astype({cast_hint(spec.dtype)}), or train "
                    "with a loss that takes probabilities as targets"
                )
            else:
                hint = f": cast it with .astype({cast_hint(spec.dtype)})"
            hint = hint if dtype != spec.dtype else ""
            raise (TypeError if dtype != spec.dtype else ValueError)(
                f"input {spec.name!r} of the {self._model} is {spec.describe()}; got "
                f"{dtype_text(dtype)}{_shape_text(shape)}{hint}"
            )
        for axis, dim in self._symbolic[index]:
            size = shape[axis]
            seen = sizes.setdefault(dim, (size, spec.name))
            if seen[0] != size:
                notes = "".join(
                    f"; {s.name!r}: {s.note}" for s in self.specs if s.name in (spec.name, seen[1]) and s.note
                )
                raise ValueError(
                    f"input {spec.name!r} of the {self._model} has {dim} = {size}, but input {seen[1]!r} has "
                    f"{dim} = {seen[0]} ({self.signature()}){notes}"
                )
        return value


# ------------------------------------------------------------------ parameters


@dataclass(frozen=True)
class ParameterInfo:
    """A checkpoint parameter as the models must see it."""

    requires_grad: bool
    dtype: np.dtype
    shape: tuple[int, ...]


def _check_parameter(spec: TensorSpec, info: ParameterInfo, model: str) -> None:
    if not spec.fits(info.dtype, info.shape):
        raise ValueError(
            f"the checkpoint's parameter {spec.name!r} is {info.dtype}{_shape_text(info.shape)}, but the {model} "
            f"takes {spec.describe()}: the checkpoint does not belong to this model"
        )


def _parameters(
    specs: Sequence[TensorSpec], state: Mapping[str, ParameterInfo], model: str, reserved: set[str]
) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Split the inputs into (user inputs, parameters); errors for parameters missing from either side."""
    users, params = [], []
    for spec in specs:
        if spec.name in reserved:
            continue
        if spec.name in state:
            _check_parameter(spec, state[spec.name], model)
            params.append(spec)
        elif params:  # the artifacts put every parameter after the user inputs
            raise ValueError(
                f"the {model} takes {spec.name!r} ({spec.describe()}) among its parameters, but the checkpoint has "
                f"no parameter of that name; the checkpoint has {sorted(state)}"
            )
        else:
            users.append(spec)
    return users, params


# --------------------------------------------------------------- training model


@dataclass(frozen=True)
class TrainingModelIO:
    """The training model's interface, checked against the checkpoint."""

    inputs: UserInputs
    parameters: tuple[str, ...]  # every parameter input, in model order
    trainable: tuple[str, ...]  # in model order
    buffers: Mapping[str, str]  # param -> <p>_grad.accumulation.buffer
    flag: str
    outputs: tuple[str, ...]  # the loss, then the additional outputs
    gradients: Mapping[str, str]  # param -> <p>_grad.accumulation.out
    statistics: Mapping[str, str]  # param -> <p>.updated (BatchNorm running statistics)
    output_specs: tuple[TensorSpec, ...]  # of the user outputs, in order

    @property
    def strings(self) -> bool:
        """Whether a user input or output is a STRING tensor, which onnxruntime's IOBinding cannot bind."""
        return self.inputs.strings or any(spec.is_string for spec in self.output_specs)


def training_io(model: onnx.ModelProto, state: Mapping[str, ParameterInfo]) -> TrainingModelIO:
    """Classify the training model's inputs and outputs; ``ValueError`` where model and checkpoint disagree."""
    what = "training model"
    specs = [TensorSpec.of(value, what) for value in model.graph.input]
    names = {spec.name for spec in specs}
    if LAZY_RESET_GRAD not in names:
        raise ValueError(
            f"the {what} has no {LAZY_RESET_GRAD!r} input, so it is not a training model written by "
            "onnxtrain.artifacts.generate_artifacts (ONNX Runtime's com.microsoft training models do not run on "
            "stock onnxruntime); regenerate the artifacts with onnxtrain"
        )
    suffix = buffer_name("")
    buffers = {spec.name[: -len(suffix)]: spec.name for spec in specs if spec.name.endswith(suffix)}
    users, params = _parameters(specs, state, what, {LAZY_RESET_GRAD, *buffers.values()})
    in_model = {spec.name for spec in params}
    extra = [name for name in state if name not in in_model]
    if extra:
        raise ValueError(
            f"the checkpoint has parameter(s) {extra} that the {what} does not take; its parameters are "
            f"{[spec.name for spec in params]}: the checkpoint does not belong to this model"
        )
    for param in buffers:
        if param not in state:
            raise ValueError(
                f"the {what} trains {param!r}, but the checkpoint has no such parameter; it has {sorted(state)}"
            )
        if not state[param].requires_grad:
            raise ValueError(
                f"the {what} trains {param!r}, but the checkpoint has it frozen: the checkpoint does not belong "
                "to this model"
            )
    trainable = tuple(spec.name for spec in params if spec.name in buffers)
    untrained = [name for name, info in state.items() if info.requires_grad and name not in buffers]
    if untrained:
        raise ValueError(
            f"the checkpoint has {untrained} trainable, but the {what} computes no gradient for them (they are "
            "frozen there): the checkpoint does not belong to this model"
        )
    outputs = [value.name for value in model.graph.output]
    gradients = {p: accumulated_name(p) for p in trainable}
    missing = [name for name in gradients.values() if name not in outputs]
    if missing:
        raise ValueError(f"the {what} lacks the accumulated-gradient output(s) {missing}; regenerate the artifacts")
    statistics = {
        name[: -len(".updated")]: name
        for name in outputs
        if name.endswith(".updated") and name[: -len(".updated")] in state
    }
    hidden = set(gradients.values()) | set(statistics.values())
    user_outputs = [value for value in model.graph.output if value.name not in hidden]
    return TrainingModelIO(
        inputs=UserInputs(users, what),
        parameters=tuple(spec.name for spec in params),
        trainable=trainable,
        buffers={p: buffers[p] for p in trainable},
        flag=LAZY_RESET_GRAD,
        outputs=tuple(value.name for value in user_outputs),
        gradients=gradients,
        statistics=statistics,
        output_specs=tuple(TensorSpec.of(value, what) for value in user_outputs),
    )


# ------------------------------------------------------------------- eval model


@dataclass(frozen=True)
class EvalModelIO:
    """The eval model's interface: user inputs, parameter inputs, outputs."""

    inputs: UserInputs
    parameters: tuple[str, ...]
    outputs: tuple[str, ...]
    output_specs: tuple[TensorSpec, ...] = ()  # of the outputs, in order

    @property
    def strings(self) -> bool:
        """Whether a user input or output is a STRING tensor, which onnxruntime's IOBinding cannot bind."""
        return self.inputs.strings or any(spec.is_string for spec in self.output_specs)


def eval_io(model: onnx.ModelProto, state: Mapping[str, ParameterInfo]) -> EvalModelIO:
    """Classify the eval model's inputs; ``ValueError`` where it and the checkpoint disagree."""
    what = "eval model"
    specs = [TensorSpec.of(value, what) for value in model.graph.input]
    users, params = _parameters(specs, state, what, set())
    return EvalModelIO(
        inputs=UserInputs(users, what),
        parameters=tuple(spec.name for spec in params),
        outputs=tuple(value.name for value in model.graph.output),
        output_specs=tuple(TensorSpec.of(value, what) for value in model.graph.output),
    )


# -------------------------------------------------------------- optimizer model


@dataclass(frozen=True)
class OptimizerModelIO:
    """The optimizer model's interface for the trainable parameters."""

    trainable: tuple[str, ...]
    num_states: int
    initial_values: tuple[float, ...]  # one per state tensor


def optimizer_io(
    model: onnx.ModelProto, trainable: Sequence[str], state: Mapping[str, ParameterInfo]
) -> OptimizerModelIO:
    """Check the optimizer model against the module's trainable parameters; read its state layout."""
    what = "optimizer model"
    inputs = [value.name for value in model.graph.input]
    specs = {value.name: TensorSpec.of(value, what) for value in model.graph.input}
    if inputs[:2] != [LEARNING_RATE, STEP]:
        raise ValueError(
            f"the {what}'s first inputs are {inputs[:2]}, not [{LEARNING_RATE!r}, {STEP!r}]: it is not an "
            "optimizer model written by onnxtrain (ONNX Runtime's com.microsoft optimizers do not run on stock "
            "onnxruntime)"
        )
    params = [name for name in inputs[2:] if name in state]
    if sorted(params) != sorted(trainable):
        raise ValueError(
            f"the {what} updates {params}, but the training model trains {list(trainable)}: the artifacts do "
            "not belong together"
        )
    first = trainable[0]
    num_states = 0
    while state_name(first, num_states) in specs:
        num_states += 1
    outputs = {value.name for value in model.graph.output}
    for param in trainable:
        _check_parameter(specs[param], state[param], what)
        expected = [grad_name(param)] + [state_name(param, i) for i in range(num_states)]
        absent = [name for name in expected if name not in specs]
        absent += [
            name
            for name in (updated_name(param), *(updated_name(state_name(param, i)) for i in range(num_states)))
            if name not in outputs
        ]
        if absent:
            raise ValueError(f"the {what} lacks {absent} for parameter {param!r}; regenerate the artifacts")
    metadata = {entry.key: entry.value for entry in model.metadata_props}
    initial: tuple[float, ...] = (0.0,) * num_states
    if INITIAL_STATE_KEY in metadata:
        try:
            initial = tuple(float(v) for v in json.loads(metadata[INITIAL_STATE_KEY]))
        except (ValueError, TypeError) as error:
            raise ValueError(
                f"the {what}'s metadata {INITIAL_STATE_KEY!r} is not a JSON list of numbers: {error}"
            ) from None
        if len(initial) != num_states:
            raise ValueError(
                f"the {what}'s metadata {INITIAL_STATE_KEY!r} lists {len(initial)} initial values, but the model "
                f"keeps {num_states} state tensor(s) per parameter"
            )
    return OptimizerModelIO(tuple(trainable), num_states, initial)


__all__ = [
    "EvalModelIO",
    "LoadedModel",
    "ModelSource",
    "OptimizerModelIO",
    "ParameterInfo",
    "TensorSpec",
    "TrainingModelIO",
    "UserInputs",
    "eval_io",
    "load_model",
    "optimizer_io",
    "training_io",
]
