"""The checkpoint state: parameters, optimizer state and properties, immutable.

A :class:`CheckpointState` mirrors what ONNX Runtime's on-device training
checkpoint holds:

- ``trainable`` and ``frozen``: parameter name -> array (ORT's
  ``requires_grad_params`` and ``frozen_params``); names are unique across both;
- ``optimizer``: one :class:`OptimizerState` (ORT's group ``group0``): the step,
  the initial learning rate and, per trainable parameter, its moments
  (``momentum0``, ``momentum1``, ... in the file), or ``None``;
- ``properties``: name -> ``int`` (int64), ``float`` (float32 in the file) or
  ``str``; one namespace for the three kinds, as in ORT's property bag;
- ``is_nominal``: a nominal checkpoint holds names, dtypes and shapes only.

Arrays are copied once into read-only, native-byte-order NumPy arrays; the
mappings are read-only. Float values (properties, learning rate) are rounded to
float32 on construction, because that is what the file stores: a state loaded
from its own saved file compares equal to it. Equality compares arrays bit for
bit (dtype, shape and bytes; NaNs with the same bits are equal).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.external_data_helper import uses_external_data

from onnxtrain.checkpoint.dtypes import elem_type, native
from onnxtrain.checkpoint.errors import CheckpointError
from onnxtrain.checkpoint.sources import InitializerSource, LazyArrays, source_of
from onnxtrain.graph import external

#: A property value: int64, float32 or string.
PropertyValue = int | float | str

#: ORT's name of the only optimizer group its runtime uses.
GROUP_NAME = "group0"

#: ORT's initial learning rate when a checkpoint has no optimizer state.
DEFAULT_LEARNING_RATE = 1e-3

#: The most bytes that may be allocated, in all, from the shapes a nominal checkpoint declares (1 GiB).
#: Loading a nominal checkpoint allocates nothing whatever it declares (:func:`placeholder`); the
#: runtime allocates a nominal parameter that holds no value yet only where it must (a ``Module``
#: placing the parameters on its device, ``parameter.data``), and checks this limit first
#: (:func:`check_nominal_allocation`). Read at each check: raise it for a nominal checkpoint you trust.
MAX_NOMINAL_BYTES = 2**30

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True, eq=False)
class OptimizerState:
    """ORT's optimizer group ``group0``: step, initial learning rate, moments.

    ``moments`` maps a trainable parameter name to its moments in order
    (``momentum0``, ``momentum1``, ...): AdamW has two, SGD with momentum one.
    Each moment has its parameter's shape. ``step`` counts the optimizer steps
    taken (int64, >= 0); the current learning rate is not stored, as in ORT.
    """

    moments: Mapping[str, Sequence[np.ndarray]] = field(default_factory=dict)
    step: int = 0
    initial_learning_rate: float = DEFAULT_LEARNING_RATE

    def __post_init__(self) -> None:
        if not isinstance(self.moments, Mapping):
            raise TypeError(
                f"moments must be a mapping of parameter name -> list of arrays, not {type(self.moments).__name__}"
            )
        moments: dict[str, tuple[np.ndarray, ...]] = {}
        for name, values in self.moments.items():
            _check_name(name, "optimizer moments' parameter")
            if isinstance(values, np.ndarray) or not isinstance(values, Iterable):
                raise TypeError(
                    f"moments[{name!r}] must be a list of arrays (momentum0, momentum1, ...), not one array"
                )
            moments[name] = tuple(_frozen_array(v, f"moments[{name!r}][{i}]") for i, v in enumerate(values))
        object.__setattr__(self, "moments", MappingProxyType(moments))
        object.__setattr__(self, "step", _int64(self.step, "optimizer step", minimum=0))
        object.__setattr__(self, "initial_learning_rate", _float32(self.initial_learning_rate, "initial_learning_rate"))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OptimizerState):
            return NotImplemented
        return (
            self.step == other.step
            and _same_float(self.initial_learning_rate, other.initial_learning_rate)
            and self.moments.keys() == other.moments.keys()
            and all(
                len(self.moments[k]) == len(other.moments[k])
                and all(_same_array(a, b) for a, b in zip(self.moments[k], other.moments[k], strict=True))
                for k in self.moments
            )
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        moments = {k: [_describe(a) for a in v] for k, v in self.moments.items()}
        return (
            f"OptimizerState(step={self.step}, initial_learning_rate={self.initial_learning_rate!r}, moments={moments})"
        )


@dataclass(frozen=True, eq=False)
class CheckpointState:
    """Parameters, optimizer state and properties; see the module docstring."""

    trainable: Mapping[str, np.ndarray] = field(default_factory=dict)
    frozen: Mapping[str, np.ndarray] = field(default_factory=dict)
    optimizer: OptimizerState | None = None
    properties: Mapping[str, PropertyValue] = field(default_factory=dict)
    is_nominal: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.is_nominal, (bool, np.bool_)):
            raise TypeError(f"is_nominal must be a bool, not {type(self.is_nominal).__name__}")
        nominal = bool(self.is_nominal)
        object.__setattr__(self, "is_nominal", nominal)
        trainable = _parameters(self.trainable, "trainable", nominal)
        frozen = _parameters(self.frozen, "frozen", nominal)
        both = sorted(trainable.keys() & frozen.keys())
        if both:
            raise ValueError(f"parameters {both} are both trainable and frozen; each name may appear once")
        object.__setattr__(self, "trainable", trainable)
        object.__setattr__(self, "frozen", frozen)
        if self.optimizer is not None:
            if not isinstance(self.optimizer, OptimizerState):
                raise TypeError(f"optimizer must be an OptimizerState or None, not {type(self.optimizer).__name__}")
            if nominal:
                raise ValueError("a nominal checkpoint holds no optimizer state; pass optimizer=None")
            _check_moments(self.optimizer, trainable)
        object.__setattr__(self, "properties", MappingProxyType(_properties(self.properties)))

    @property
    def parameters(self) -> Mapping[str, np.ndarray]:
        """Trainable then frozen parameters, one mapping."""
        return MappingProxyType({**self.trainable, **self.frozen})

    def nominal(self) -> CheckpointState:
        """The nominal version: same names, dtypes and shapes, no data, no optimizer state."""
        return CheckpointState(self.trainable, self.frozen, None, self.properties, is_nominal=True)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CheckpointState):
            return NotImplemented
        return (
            self.is_nominal == other.is_nominal
            and _same_arrays(self.trainable, other.trainable, self.is_nominal)
            and _same_arrays(self.frozen, other.frozen, self.is_nominal)
            and self.optimizer == other.optimizer
            and self.properties.keys() == other.properties.keys()
            and all(_same_property(self.properties[k], other.properties[k]) for k in self.properties)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"CheckpointState(trainable={_described(self.trainable)}, "
            f"frozen={_described(self.frozen)}, optimizer={self.optimizer!r}, "
            f"properties={dict(self.properties)!r}, is_nominal={self.is_nominal})"
        )


def from_tensors(
    trainable: Iterable[onnx.TensorProto],
    frozen: Iterable[onnx.TensorProto] = (),
    *,
    base_dir: str | os.PathLike[str] | None = None,
    nominal: bool = False,
) -> CheckpointState:
    """A state from ONNX initializers (ORT's ``save_checkpoint`` from TensorProtos).

    Tensors with external data are read from files relative to ``base_dir``
    (the model's directory); the given protos are never modified.
    """
    return CheckpointState(
        _arrays_from_tensors(trainable, "trainable", base_dir),
        _arrays_from_tensors(frozen, "frozen", base_dir),
        is_nominal=nominal,
    )


def lazy_from_tensors(
    trainable: Iterable[onnx.TensorProto], frozen: Iterable[onnx.TensorProto], data: external.TensorData
) -> CheckpointState:
    """A state like :func:`from_tensors`'s whose arrays are read from ``data`` only when looked up or written.

    Each tensor is checked now (its type, and that its inline data has the
    size its dims declare, or that its external data can be found, as
    :func:`onnxtrain.graph.external.locate` says), and read later, one at a
    time: :func:`~onnxtrain.checkpoint.files.write_files` writes such a state
    without ever holding two of its tensors. The state reads its tensors
    where they are each time: they must not change while it is in use.
    """
    return CheckpointState(
        LazyArrays(_sources(trainable, "trainable", data)), LazyArrays(_sources(frozen, "frozen", data))
    )


def _sources(tensors: Iterable[onnx.TensorProto], what: str, data: external.TensorData) -> dict[str, InitializerSource]:
    sources: dict[str, InitializerSource] = {}
    for tensor in tensors:
        _check_tensor(tensor, what, sources)
        if uses_external_data(tensor):
            data.check(tensor, f"{what} ")
        else:
            external.check_inline(tensor, f"{what} ")
        sources[tensor.name] = InitializerSource(tensor, data, f"{what} ")
    return sources


def _check_tensor(tensor: object, what: str, seen: Mapping[str, object]) -> None:
    if not isinstance(tensor, onnx.TensorProto):
        raise TypeError(f"{what} parameters must be onnx.TensorProto, not {type(tensor).__name__}")
    if tensor.name in seen:
        raise ValueError(f"{what} tensor {tensor.name!r} appears twice")
    if tensor.data_type == onnx.TensorProto.STRING:
        raise TypeError(f"{what} tensor {tensor.name!r} holds strings; a checkpoint holds numeric tensors only")


def placeholder(dtype: np.dtype, shape: Sequence[int]) -> np.ndarray:
    """A read-only array of ``dtype`` and ``shape`` that owns no memory (nominal data): a zero-stride view of one 0."""
    return np.broadcast_to(np.zeros((), dtype=dtype), check_shape(dtype, shape))


def check_shape(dtype: np.dtype, shape: Sequence[int]) -> tuple[int, ...]:
    """``shape`` as ints; ``ValueError`` unless an array of it can exist: no negative dimension, and
    ``itemsize * prod(nonzero dimensions) < 2**63`` (NumPy refuses larger ones even with a zero dimension)."""
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"shape {list(dims)} has a negative dimension")
    if math.prod(d for d in dims if d) * np.dtype(dtype).itemsize > _INT64_MAX:
        raise ValueError(f"shape {list(dims)} of {np.dtype(dtype)} is too large for any array (2**63 bytes or more)")
    return dims


def check_nominal_allocation(tensors: Iterable[tuple[str, np.dtype, Sequence[int]]], what: str) -> None:
    """``CheckpointError`` unless ``tensors`` (name, dtype, shape), allocated, take :data:`MAX_NOMINAL_BYTES` at most.

    For code about to allocate nominal tensors, whose shapes no data in the
    file backs; ``what`` says what allocates them (for the message).
    """
    limit = MAX_NOMINAL_BYTES
    total = 0
    for name, dtype, shape in tensors:
        total += math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize
        if total > limit:
            raise CheckpointError(
                f"{what} would allocate {total} bytes for the parameters of a nominal checkpoint, up to {name!r} "
                f"({np.dtype(dtype)}{list(shape)}): more than MAX_NOMINAL_BYTES = {limit}. A nominal checkpoint "
                "declares shapes without data; give the parameters their values first (state.parameters[name] = "
                "array, before creating the Module), or raise onnxtrain.checkpoint.state.MAX_NOMINAL_BYTES for a "
                "checkpoint you trust"
            )


def _arrays_from_tensors(
    tensors: Iterable[onnx.TensorProto], what: str, base_dir: str | os.PathLike[str] | None
) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for tensor in tensors:
        _check_tensor(tensor, what, arrays)
        if uses_external_data(tensor):
            if base_dir is None:
                raise ValueError(
                    f"{what} tensor {tensor.name!r} keeps its data in an external file; pass base_dir= (the folder "
                    "of the model it comes from) to read it from there"
                )
            loaded = onnx.TensorProto()
            loaded.CopyFrom(tensor)
            external.read_external(loaded, base_dir, f"{what} ")
            tensor = loaded
        else:
            external.check_inline(tensor, f"{what} ")
        arrays[tensor.name] = numpy_helper.to_array(tensor)
    return arrays


def _parameters(params: Mapping[str, Any], what: str, nominal: bool) -> Mapping[str, np.ndarray]:
    """``params`` checked, as a read-only mapping: arrays copied (:func:`_frozen_array`), placeholders when
    ``nominal``, and a :class:`LazyArrays` kept as it is (its dtypes checked without reading it)."""
    if not isinstance(params, Mapping):
        raise TypeError(f"{what} parameters must be a mapping of name -> array, not {type(params).__name__}")
    if isinstance(params, LazyArrays):
        for name in params:
            _check_name(name, f"{what} parameter")
            _check_storable(params.source(name).dtype, f"{what} parameter {name!r}")
        if not nominal:
            return params
        sources = {name: params.source(name) for name in params}
        return MappingProxyType({name: placeholder(s.dtype, s.shape) for name, s in sources.items()})
    out: dict[str, np.ndarray] = {}
    for name, value in params.items():
        _check_name(name, f"{what} parameter")
        array = _frozen_array(value, f"{what} parameter {name!r}", copy=not nominal)
        out[name] = placeholder(array.dtype, array.shape) if nominal else array
    return MappingProxyType(out)


def _check_storable(dtype: np.dtype, what: str) -> None:
    """``TypeError`` naming ``what`` when a checkpoint cannot store ``dtype``."""
    try:
        elem_type(dtype)
    except TypeError as error:
        raise TypeError(f"{what}: {error}") from None


def _frozen_array(value: Any, what: str, *, copy: bool = True) -> np.ndarray:
    """A read-only native-order array owning its data (copied unless already such)."""
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    _check_storable(array.dtype, what)
    if not copy:
        return array
    if array.base is None and not array.flags.writeable and array.dtype.isnative:
        return array
    result = np.array(array, dtype=native(array.dtype), copy=True, order="C")
    result.setflags(write=False)
    return result


def _check_moments(optimizer: OptimizerState, trainable: Mapping[str, np.ndarray]) -> None:
    for name, moments in optimizer.moments.items():
        if name not in trainable:
            raise ValueError(
                f"optimizer moments for {name!r}, which is not a trainable parameter; "
                f"trainable parameters: {sorted(trainable)}"
            )
        shape = source_of(trainable, name).shape
        for i, moment in enumerate(moments):
            if moment.shape != shape:
                raise ValueError(f"momentum{i} of {name!r} has shape {moment.shape}; the parameter has {shape}")


def _properties(properties: Mapping[str, Any]) -> dict[str, PropertyValue]:
    if not isinstance(properties, Mapping):
        raise TypeError(f"properties must be a mapping of name -> int, float or str, not {type(properties).__name__}")
    out: dict[str, PropertyValue] = {}
    for name, value in properties.items():
        _check_name(name, "property")
        if isinstance(value, (bool, np.bool_)):
            raise TypeError(
                f"property {name!r} is a bool; store int({value}) instead (properties are int, float or str)"
            )
        if isinstance(value, (int, np.integer)):
            out[name] = _int64(value, f"property {name!r}")
        elif isinstance(value, (float, np.floating)):
            out[name] = _float32(value, f"property {name!r}")
        elif isinstance(value, str):
            out[name] = _utf8(value, f"property {name!r}")
        else:
            raise TypeError(f"property {name!r} is a {type(value).__name__}; properties are int, float or str")
    return out


def _check_name(name: Any, what: str) -> None:
    if not isinstance(name, str):
        raise TypeError(f"{what} names must be str, not {type(name).__name__} ({name!r})")
    if not name:
        raise ValueError(f"{what} names must not be empty")
    _utf8(name, f"the {what} name {name!r}")


def _utf8(text: str, what: str) -> str:
    """``text``, checked to be encodable in UTF-8, as the checkpoint stores strings."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"{what} holds {text[error.start]!r} at position {error.start}, which UTF-8 cannot encode (a lone "
            "surrogate, as os.fsdecode gives for a file name that is not UTF-8); the checkpoint stores UTF-8: "
            "store text.encode('utf-8', 'surrogateescape').decode('utf-8', 'backslashreplace') instead"
        ) from None
    return text


def _int64(value: Any, what: str, *, minimum: int = _INT64_MIN) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    number = int(value)
    if not minimum <= number <= _INT64_MAX:
        raise ValueError(f"{what} = {number} is outside [{minimum}, 2**63 - 1] (int64)")
    return number


def _float32(value: Any, what: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what} must be a float, not {type(value).__name__}")
    number = float(value)
    if math.isfinite(number) and abs(number) > _FLOAT32_MAX:
        raise ValueError(f"{what} = {number!r} does not fit in float32, which the checkpoint stores")
    return float(np.float32(number))


def _same_float(a: float, b: float) -> bool:
    return np.float32(a).tobytes() == np.float32(b).tobytes()


def _same_property(a: PropertyValue, b: PropertyValue) -> bool:
    if type(a) is not type(b):
        return False
    return _same_float(a, b) if isinstance(a, float) else a == b  # type: ignore[arg-type]


def _same_array(a: np.ndarray, b: np.ndarray, *, data: bool = True) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return not data or np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def _same_arrays(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], nominal: bool) -> bool:
    return a.keys() == b.keys() and all(_same_array(a[k], b[k], data=not nominal) for k in a)


def _describe(array: np.ndarray) -> str:
    return f"{array.dtype}{list(array.shape)}"


def _described(arrays: Mapping[str, np.ndarray]) -> dict[str, str]:
    """``{name: 'float32[2, 3]'}``, without reading a lazy array."""
    sources = {name: source_of(arrays, name) for name in arrays}
    return {name: f"{source.dtype}{list(source.shape)}" for name, source in sources.items()}
