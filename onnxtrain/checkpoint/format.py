"""Encode and decode ONNX Runtime's on-device training checkpoint (``ODTC`` v2).

Written as ``onnxruntime-training`` 1.19.2 writes a state (``FromCheckpointState``
in ``orttraining/training_api/checkpoint.cc``):

- ``Checkpoint.version = 2`` and the file identifier ``ODTC``;
- ``module_state`` always, with both parameter vectors (possibly empty), each
  sorted by name; ``is_nominal_state``; ``has_external_data``;
- ``optimizer_groups`` always (empty without optimizer state): one group
  ``group0`` whose ``optimizer_states`` are sorted by parameter name, each with
  its moments as tensors named ``momentum0``, ``momentum1``, ...;
- ``property_bag`` only when there are properties, each kind sorted by name;
- a tensor: ``name``, ``dims``, ``data_type`` and either ``raw_data``
  (little-endian) or ``external_data_offset`` into ``<checkpoint>.data``;
  ``doc_string`` and ``string_data`` are never written. A nominal tensor has
  its ``dims`` and an empty ``raw_data``.

External data (ORT's ``WriteToExternalFileHelper``): a tensor of at least
:data:`MIN_EXTERNAL_TENSOR_BYTES` bytes goes to the data file, smaller ones stay
inline; each tensor is aligned to 8 bytes (INT64, DOUBLE) or 4 (all others),
padded with zeros.

:func:`write` writes the bytes :func:`encode` gives to a file, reading each
tensor (:mod:`onnxtrain.checkpoint.sources`) only when its bytes are written:
the flatbuffer is built in an anonymous memory map with each inline tensor's
place left untouched, so only the tables take memory, and the file is then
written in order, each tensor's data streamed into its place.
"""

from __future__ import annotations

import math
import mmap
import re
import struct
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import BinaryIO

import flatbuffers
import numpy as np
from flatbuffers.builder import BuilderSizeError

from onnxtrain.checkpoint.dtypes import elem_type, elem_type_name, numpy_dtype
from onnxtrain.checkpoint.errors import CheckpointError
from onnxtrain.checkpoint.flatbuffer import Budget, Table, root
from onnxtrain.checkpoint.schema import (
    FILE_IDENTIFIER,
    VERSION,
    CheckpointSlots,
    ModuleStateSlots,
    OptimizerGroupSlots,
    ParameterOptimizerStateSlots,
    PropertyBagSlots,
    PropertySlots,
    TensorSlots,
)
from onnxtrain.checkpoint.sources import ArraySource, TensorSource, source_of
from onnxtrain.checkpoint.state import (
    GROUP_NAME,
    CheckpointState,
    OptimizerState,
    PropertyValue,
    check_shape,
    placeholder,
)

#: ORT's ``kMinimumSizeForExternalData``: smaller tensors stay inline.
MIN_EXTERNAL_TENSOR_BYTES = 64
#: flatbuffers' limit for one buffer (and the ``flatbuffers`` library's).
MAX_FLATBUFFER_BYTES = 2**31 - 1
#: A moment tensor's name: ``momentum<index>``.
MOMENT_NAME = re.compile(r"momentum(0|[1-9][0-9]*)")

#: Reads ``nbytes`` of external data at ``offset`` for the tensor described by the str.
ExternalReader = Callable[[int, int, str], memoryview]

_EIGHT_BYTE_ALIGNED = frozenset({7, 11})  # INT64, DOUBLE: ORT aligns these to 8, the rest to 4


def tensor_bytes(state: CheckpointState, include_optimizer_state: bool = True) -> int:
    """Bytes of tensor data a save writes (0 for a nominal state)."""
    if state.is_nominal:
        return 0
    total = sum(source_of(arrays, name).nbytes for arrays in (state.trainable, state.frozen) for name in arrays)
    if include_optimizer_state and state.optimizer is not None:
        total += sum(m.nbytes for ms in state.optimizer.moments.values() for m in ms)
    return total


def encode(
    state: CheckpointState, *, include_optimizer_state: bool = True, external: BinaryIO | None = None
) -> memoryview:
    """The checkpoint's flatbuffer; with ``external``, large tensors are written there."""
    size = _checked_size(state, include_optimizer_state, external)
    builder = flatbuffers.Builder(size)
    _build_checked(builder, _Writer(builder, external), state, include_optimizer_state)
    return memoryview(builder.Bytes)[builder.Head() :]


def write(
    state: CheckpointState, file: BinaryIO, *, include_optimizer_state: bool = True, external: BinaryIO | None = None
) -> None:
    """Write :func:`encode`'s bytes to ``file``, reading each tensor only when its bytes are written.

    The memory taken is that of the tables and of one piece of one tensor at a time.
    """
    size = _checked_size(state, include_optimizer_state, external)
    with mmap.mmap(-1, size) as memory:  # pages the build never touches (the tensors' places) take no memory
        builder = flatbuffers.Builder(0)
        builder.Bytes, builder.head = memory, size
        deferred: list[tuple[int, TensorSource]] = []
        _build_checked(builder, _Writer(builder, external, deferred), state, include_optimizer_state)
        cursor = builder.Head()
        for position, source in sorted(deferred, key=lambda entry: entry[0]):
            file.write(memory[cursor:position])
            for chunk in source.chunks():
                file.write(chunk)
            cursor = position + source.nbytes
        file.write(memory[cursor:])


def _checked_size(state: CheckpointState, include_optimizer_state: bool, external: BinaryIO | None) -> int:
    """The size to build the flatbuffer in (:func:`_size_estimate`); ``ValueError`` over flatbuffers' limit."""
    size = _size_estimate(state, include_optimizer_state, external is None)
    if size >= MAX_FLATBUFFER_BYTES:
        raise _too_large(size)
    return size


def _too_large(size: int) -> ValueError:
    return ValueError(
        f"about {size} bytes do not fit in one flatbuffer (2 GiB); "
        "save with a lower external_data_threshold so that the tensors go to an external data file"
    )


def _build_checked(
    builder: flatbuffers.Builder, writer: _Writer, state: CheckpointState, include_optimizer_state: bool
) -> None:
    try:
        _build(builder, writer, state, include_optimizer_state)
    except BuilderSizeError:
        raise _too_large(len(builder.Bytes)) from None


def _build(
    builder: flatbuffers.Builder, writer: _Writer, state: CheckpointState, include_optimizer_state: bool
) -> None:
    module_state = writer.module_state(state)
    groups = []
    if include_optimizer_state and state.optimizer is not None:
        groups.append(writer.optimizer_group(state.optimizer))
    property_bag = writer.property_bag(state.properties) if state.properties else None
    group_vector = writer.offsets(groups)
    builder.StartObject(CheckpointSlots.COUNT)
    builder.PrependInt32Slot(CheckpointSlots.VERSION, VERSION, 0)
    builder.PrependUOffsetTRelativeSlot(CheckpointSlots.MODULE_STATE, module_state, 0)
    builder.PrependUOffsetTRelativeSlot(CheckpointSlots.OPTIMIZER_GROUPS, group_vector, 0)
    if property_bag is not None:
        builder.PrependUOffsetTRelativeSlot(CheckpointSlots.PROPERTY_BAG, property_bag, 0)
    builder.Finish(builder.EndObject(), file_identifier=FILE_IDENTIFIER)


def _size_estimate(state: CheckpointState, include_optimizer_state: bool, inline: bool) -> int:
    """A generous estimate of the flatbuffer's size, so that the builder never grows."""
    names = [*state.trainable, *state.frozen, *state.properties]
    ranks = [source_of(arrays, name).ndim for arrays in (state.trainable, state.frozen) for name in arrays]
    if include_optimizer_state and state.optimizer is not None:
        names += list(state.optimizer.moments)
        ranks += [m.ndim for moments in state.optimizer.moments.values() for m in moments]
    strings = sum(len(v.encode()) for v in state.properties.values() if isinstance(v, str))
    metadata = sum(len(n.encode()) + 64 for n in names) + sum(8 * rank + 96 for rank in ranks) + strings + 1024
    return metadata + (tensor_bytes(state, include_optimizer_state) if inline else 0)


class _Writer:
    """Builds the tables of one checkpoint, children before parents.

    With ``deferred``, an inline tensor's data is not copied into the buffer:
    its place is reserved and ``(position, source)`` appended, for :func:`write`.
    """

    def __init__(
        self,
        builder: flatbuffers.Builder,
        external: BinaryIO | None,
        deferred: list[tuple[int, TensorSource]] | None = None,
    ) -> None:
        self.builder = builder
        self.external = external
        self.deferred = deferred

    def offsets(self, offsets: list[int]) -> int:
        self.builder.StartVector(4, len(offsets), 4)
        for offset in reversed(offsets):
            self.builder.PrependUOffsetTRelative(offset)
        return self.builder.EndVector()

    def tensor(self, name: str, source: TensorSource, nominal: bool) -> int:
        b = self.builder
        name_offset = b.CreateString(name)
        dims = b.CreateNumpyVector(np.asarray(source.shape, dtype="<i8"))
        code = elem_type(source.dtype)
        external_offset, raw = -1, None
        if nominal:
            raw = b.CreateByteVector(b"")
        elif self.external is not None and source.nbytes >= MIN_EXTERNAL_TENSOR_BYTES:
            external_offset = self._write_external(code, source)
        elif self.deferred is not None:
            raw = self._reserve(source)
        else:
            raw = b.CreateByteVector(b"".join(source.chunks()))
        b.StartObject(TensorSlots.COUNT)
        b.PrependUOffsetTRelativeSlot(TensorSlots.NAME, name_offset, 0)
        b.PrependUOffsetTRelativeSlot(TensorSlots.DIMS, dims, 0)
        b.PrependInt32Slot(TensorSlots.DATA_TYPE, code, 0)
        if raw is not None:
            b.PrependUOffsetTRelativeSlot(TensorSlots.RAW_DATA, raw, 0)
        b.PrependInt64Slot(TensorSlots.EXTERNAL_DATA_OFFSET, external_offset, -1)
        return b.EndObject()

    def _reserve(self, source: TensorSource) -> int:
        """``CreateByteVector`` of ``source``'s bytes without the bytes: their place is left for :func:`write`."""
        b = self.builder
        b.assertNotNested()
        b.nested = True
        b.Prep(flatbuffers.number_types.UOffsetTFlags.bytewidth, source.nbytes)
        b.head = b.Head() - source.nbytes
        assert self.deferred is not None
        self.deferred.append((b.Head(), source))
        b.vectorNumElems = source.nbytes
        return b.EndVector()

    def _write_external(self, code: int, source: TensorSource) -> int:
        assert self.external is not None
        alignment = 8 if code in _EIGHT_BYTE_ALIGNED else 4
        position = self.external.tell()
        padding = -position % alignment
        self.external.write(b"\0" * padding)
        for chunk in source.chunks():
            self.external.write(chunk)
        return position + padding

    def tensors(self, arrays: Mapping[str, np.ndarray], nominal: bool) -> int:
        return self.offsets([self.tensor(name, source_of(arrays, name), nominal) for name in sorted(arrays)])

    def module_state(self, state: CheckpointState) -> int:
        b = self.builder
        trainable = self.tensors(state.trainable, state.is_nominal)
        frozen = self.tensors(state.frozen, state.is_nominal)
        b.StartObject(ModuleStateSlots.COUNT)
        b.PrependUOffsetTRelativeSlot(ModuleStateSlots.REQUIRES_GRAD_PARAMS, trainable, 0)
        b.PrependUOffsetTRelativeSlot(ModuleStateSlots.FROZEN_PARAMS, frozen, 0)
        b.PrependBoolSlot(ModuleStateSlots.IS_NOMINAL_STATE, state.is_nominal, False)
        b.PrependBoolSlot(ModuleStateSlots.HAS_EXTERNAL_DATA, self.external is not None, False)
        return b.EndObject()

    def optimizer_group(self, optimizer: OptimizerState) -> int:
        b = self.builder
        states = []
        for name in sorted(optimizer.moments):
            moments = optimizer.moments[name]
            ordered = sorted(enumerate(moments), key=_moment_order)
            tensors = [self.tensor(f"momentum{i}", ArraySource(m), False) for i, m in ordered]
            momentums = self.offsets(tensors)
            param_name = b.CreateString(name)
            b.StartObject(ParameterOptimizerStateSlots.COUNT)
            b.PrependUOffsetTRelativeSlot(ParameterOptimizerStateSlots.PARAM_NAME, param_name, 0)
            b.PrependUOffsetTRelativeSlot(ParameterOptimizerStateSlots.MOMENTUMS, momentums, 0)
            states.append(b.EndObject())
        group_name = b.CreateString(GROUP_NAME)
        state_vector = self.offsets(states)
        b.StartObject(OptimizerGroupSlots.COUNT)
        b.PrependUOffsetTRelativeSlot(OptimizerGroupSlots.GROUP_NAME, group_name, 0)
        b.PrependInt64Slot(OptimizerGroupSlots.STEP, optimizer.step, 0)
        _float32_slot(b, OptimizerGroupSlots.INITIAL_LEARNING_RATE, optimizer.initial_learning_rate)
        b.PrependUOffsetTRelativeSlot(OptimizerGroupSlots.OPTIMIZER_STATES, state_vector, 0)
        return b.EndObject()

    def property_bag(self, properties: Mapping[str, PropertyValue]) -> int:
        b = self.builder
        kinds: dict[type, list[int]] = {int: [], float: [], str: []}
        for name in sorted(properties):
            value = properties[name]
            name_offset = b.CreateString(name)
            value_offset = b.CreateString(value) if isinstance(value, str) else 0
            b.StartObject(PropertySlots.COUNT)
            b.PrependUOffsetTRelativeSlot(PropertySlots.NAME, name_offset, 0)
            if isinstance(value, str):
                b.PrependUOffsetTRelativeSlot(PropertySlots.VALUE, value_offset, 0)
            elif isinstance(value, int):
                b.PrependInt64Slot(PropertySlots.VALUE, value, 0)
            else:
                _float32_slot(b, PropertySlots.VALUE, value)
            kinds[type(value)].append(b.EndObject())
        ints, floats, strings = (self.offsets(kinds[k]) for k in (int, float, str))
        b.StartObject(PropertyBagSlots.COUNT)
        b.PrependUOffsetTRelativeSlot(PropertyBagSlots.INTS, ints, 0)
        b.PrependUOffsetTRelativeSlot(PropertyBagSlots.FLOATS, floats, 0)
        b.PrependUOffsetTRelativeSlot(PropertyBagSlots.STRINGS, strings, 0)
        return b.EndObject()


def decode(buf: bytes | bytearray | memoryview, external: ExternalReader | None = None) -> CheckpointState:
    """The state in a checkpoint's bytes; :class:`CheckpointError` for anything invalid.

    ``external`` reads ``<checkpoint>.data`` (``None``: the file has none).
    A nominal checkpoint's tensors are placeholders that own no memory,
    whatever shapes it declares.
    """
    view = memoryview(buf).cast("B")
    if len(view) > MAX_FLATBUFFER_BYTES:
        raise CheckpointError(f"the file has {len(view)} bytes, more than a flatbuffer can hold (2 GiB)")
    try:
        return _Reader(view, external).checkpoint()
    except CheckpointError:
        raise
    except (ValueError, TypeError, IndexError, OverflowError) as error:  # defensive: report, never crash
        raise CheckpointError(f"invalid checkpoint: {error}") from None


class _Reader:
    """Reads the schema's tables out of a verified buffer into a state."""

    def __init__(self, buf: memoryview, external: ExternalReader | None) -> None:
        self.buf = buf
        self.external = external
        self.budget = Budget(2 * len(buf) + 4096)

    def checkpoint(self) -> CheckpointState:
        table = root(self.buf, FILE_IDENTIFIER, "Checkpoint", self.budget)
        version = table.scalar(CheckpointSlots.VERSION, "int32", 0, "version")
        if version != VERSION:
            raise CheckpointError(f"checkpoint version {version} is not supported; only version {VERSION} is")
        module = table.table(CheckpointSlots.MODULE_STATE, "module_state")
        trainable: dict[str, np.ndarray] = {}
        frozen: dict[str, np.ndarray] = {}
        nominal = False
        if module is not None:
            nominal = bool(module.scalar(ModuleStateSlots.IS_NOMINAL_STATE, "bool", 0, "is_nominal_state"))
            has_external = bool(module.scalar(ModuleStateSlots.HAS_EXTERNAL_DATA, "bool", 0, "has_external_data"))
            if not has_external:
                self.external = None
            elif self.external is None:
                raise CheckpointError("the checkpoint has external data, but no <checkpoint>.data reader was given")
            trainable = self.tensors(module, ModuleStateSlots.REQUIRES_GRAD_PARAMS, "requires_grad_params", nominal)
            frozen = self.tensors(module, ModuleStateSlots.FROZEN_PARAMS, "frozen_params", nominal)
        else:
            self.external = None
        optimizer = self.optimizer(table, nominal)
        properties = self.properties(table)
        both = sorted(trainable.keys() & frozen.keys())
        if both:
            raise CheckpointError(f"parameters {both} are both in requires_grad_params and frozen_params")
        try:
            return CheckpointState(trainable, frozen, optimizer, properties, is_nominal=nominal)
        except (ValueError, TypeError) as error:
            raise CheckpointError(f"the checkpoint's contents are inconsistent: {error}") from None

    def tensors(self, table: Table, slot: int, what: str, nominal: bool) -> dict[str, np.ndarray]:
        tensors = table.tables(slot, what)
        if tensors is None:
            raise CheckpointError(f"{table.name}.{what} is missing (ONNX Runtime requires it)")
        return _unique((self.tensor(t, nominal) for t in tensors), f"{table.name}.{what}")

    def tensor(self, table: Table, nominal: bool) -> tuple[str, np.ndarray]:
        name = table.string(TensorSlots.NAME, "name")
        if name is None:
            raise CheckpointError(f"{table.name} has no name")
        where = f"tensor {name!r} ({table.name})"
        table.string(TensorSlots.DOC_STRING, "doc_string")
        dims = table.int64_vector(TensorSlots.DIMS, "dims") or []
        if any(d < 0 for d in dims):
            raise CheckpointError(f"{where} has a negative dimension in {dims}")
        code = int(table.scalar(TensorSlots.DATA_TYPE, "int32", 0, "data_type"))
        try:
            dtype = numpy_dtype(code)
            check_shape(dtype, dims)  # its byte count fits in int64, zero dimensions aside
        except ValueError as error:
            raise CheckpointError(f"{where}: {error}") from None
        strings = table.vector_bytes(TensorSlots.STRING_DATA, 4, "string_data")
        if strings is not None and strings[1]:
            raise CheckpointError(f"{where} has string_data; a checkpoint holds numeric tensors only")
        raw = table.vector_bytes(TensorSlots.RAW_DATA, 1, "raw_data")
        offset = int(table.scalar(TensorSlots.EXTERNAL_DATA_OFFSET, "int64", -1, "external_data_offset"))
        if offset < -1:
            raise CheckpointError(f"{where} has an invalid external_data_offset {offset}")
        if nominal:  # names, types and shapes only, allocating nothing; any data is ignored, as ORT does
            try:
                return name, placeholder(dtype, dims)
            except ValueError as error:  # more dimensions than NumPy takes
                raise CheckpointError(f"{where}: {error}") from None
        nbytes = math.prod(dims) * dtype.itemsize
        if offset >= 0:
            if raw is not None and raw[1]:
                raise CheckpointError(f"{where} has both raw_data and an external_data_offset")
            if self.external is None:
                raise CheckpointError(f"{where} refers to external data, but module_state.has_external_data is false")
            data = self.external(offset, nbytes, where)
        elif raw is not None:
            start, length = raw
            if length != nbytes:
                raise CheckpointError(
                    f"{where} has {length} bytes of raw_data; {elem_type_name(code)} {dims} needs {nbytes}"
                )
            data = self.buf[start : start + length]
        elif nbytes == 0:
            data = memoryview(b"")
        else:
            raise CheckpointError(f"{where} has neither raw_data nor an external_data_offset")
        return name, _array(data, dtype, dims, where)

    def optimizer(self, table: Table, nominal: bool) -> OptimizerState | None:
        groups = table.tables(CheckpointSlots.OPTIMIZER_GROUPS, "optimizer_groups") or []
        if not groups:
            return None
        if len(groups) > 1:
            raise CheckpointError(
                f"the checkpoint has {len(groups)} optimizer groups; onnxtrain reads one ({GROUP_NAME})"
            )
        group = groups[0]
        name = group.string(OptimizerGroupSlots.GROUP_NAME, "group_name")
        if name != GROUP_NAME:
            raise CheckpointError(f"optimizer group {name!r} is not {GROUP_NAME!r}, the one ONNX Runtime uses")
        step = int(group.scalar(OptimizerGroupSlots.STEP, "int64", 0, "step"))
        learning_rate = float(
            group.scalar(OptimizerGroupSlots.INITIAL_LEARNING_RATE, "float32", 0.0, "initial_learning_rate")
        )
        states = group.tables(OptimizerGroupSlots.OPTIMIZER_STATES, "optimizer_states")
        if states is None:
            raise CheckpointError(f"optimizer group {GROUP_NAME} has no optimizer_states")
        moments = _unique((self.parameter_moments(s) for s in states), f"optimizer group {GROUP_NAME}")
        try:
            return OptimizerState(moments, step=step, initial_learning_rate=learning_rate)
        except (ValueError, TypeError) as error:
            raise CheckpointError(f"optimizer group {GROUP_NAME}: {error}") from None

    def parameter_moments(self, table: Table) -> tuple[str, list[np.ndarray]]:
        name = table.string(ParameterOptimizerStateSlots.PARAM_NAME, "param_name")
        if name is None:
            raise CheckpointError(f"{table.name} has no param_name")
        tensors = table.tables(ParameterOptimizerStateSlots.MOMENTUMS, "momentums")
        if tensors is None:
            raise CheckpointError(f"the optimizer state of {name!r} has no momentums")
        by_name = _unique((self.tensor(t, False) for t in tensors), f"the optimizer state of {name!r}")
        indices = {}
        for moment in by_name:
            match = MOMENT_NAME.fullmatch(moment)
            if match is None:
                raise CheckpointError(
                    f"the optimizer state of {name!r} has a tensor {moment!r}; expected momentum0, momentum1, ..."
                )
            indices[int(match.group(1))] = by_name[moment]
        if sorted(indices) != list(range(len(indices))):
            raise CheckpointError(
                f"the moments of {name!r} are {sorted(by_name)}; expected momentum0 .. momentum{len(indices) - 1}"
            )
        return name, [indices[i] for i in range(len(indices))]

    def properties(self, table: Table) -> dict[str, PropertyValue]:
        bag = table.table(CheckpointSlots.PROPERTY_BAG, "property_bag")
        if bag is None:
            return {}
        kinds = (
            (PropertyBagSlots.INTS, "ints", "int64"),
            (PropertyBagSlots.FLOATS, "floats", "float32"),
            (PropertyBagSlots.STRINGS, "strings", None),
        )
        found: list[tuple[str, PropertyValue]] = []
        for slot, what, kind in kinds:
            for prop in bag.tables(slot, what) or []:
                name = prop.string(PropertySlots.NAME, "name")
                if name is None:
                    raise CheckpointError(f"{prop.name} has no name")
                if kind is None:
                    value: PropertyValue | None = prop.string(PropertySlots.VALUE, "value")
                    if value is None:
                        raise CheckpointError(f"string property {name!r} has no value")
                elif kind == "int64":
                    value = int(prop.scalar(PropertySlots.VALUE, kind, 0, "value"))
                else:
                    value = float(prop.scalar(PropertySlots.VALUE, kind, 0.0, "value"))
                found.append((name, value))
        return _unique(found, "the property bag")


def _unique(items: Iterable[tuple[str, object]], where: str) -> dict:
    out: dict = {}
    for name, value in items:
        if name in out:
            raise CheckpointError(f"{where} has {name!r} twice")
        out[name] = value
    return out


def _array(data: memoryview, dtype: np.dtype, dims: list[int], where: str) -> np.ndarray:
    """A read-only array owning a copy of little-endian ``data``."""
    try:
        empty = not len(data)
        array = np.empty(dims, dtype=dtype) if empty else np.frombuffer(data, dtype=dtype).reshape(dims).copy()
    except (ValueError, MemoryError) as error:
        raise CheckpointError(f"{where}: shape {dims} is invalid ({error})") from None
    if sys.byteorder == "big" and dtype.itemsize > 1:
        array = array.byteswap()
    if dtype == np.bool_ and array.size and array.view(np.uint8).max() > 1:
        raise CheckpointError(f"{where} is bool but holds bytes other than 0 and 1")
    array.setflags(write=False)
    return array


def _float32_slot(builder: flatbuffers.Builder, slot: int, value: float) -> None:
    """A float32 field, omitted only for +0.0 (the default): -0.0 and NaNs keep their bits."""
    if struct.pack("<f", value) != b"\0\0\0\0":
        builder.PrependFloat32(value)
        builder.Slot(slot)


def _moment_order(item: tuple[int, np.ndarray]) -> str:
    """ORT sorts moments by name: momentum0, momentum1, momentum10, momentum2."""
    return f"momentum{item[0]}"
