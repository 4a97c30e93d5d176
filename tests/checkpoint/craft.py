"""Hand-built checkpoint flatbuffers with any field value, valid or not, for loader tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import flatbuffers
import numpy as np

from onnxtrain.checkpoint.schema import (
    CheckpointSlots,
    ModuleStateSlots,
    OptimizerGroupSlots,
    ParameterOptimizerStateSlots,
    PropertyBagSlots,
    PropertySlots,
    TensorSlots,
)


@dataclass
class T:
    """A Tensor table: ``raw=None`` leaves raw_data out; ``raw_ref`` reuses a vector."""

    name: str | None
    dims: Sequence[int] = ()
    data_type: int = 1
    raw: bytes | None = b""
    external_offset: int = -1
    raw_ref: int | None = None
    string_data: Sequence[str] = ()


@dataclass
class Group:
    name: str | None = "group0"
    step: int = 0
    lr: float = 0.001
    states: dict[str, list[T]] | None = field(default_factory=dict)


def build(
    trainable: Sequence[T] | None = (),
    frozen: Sequence[T] | None = (),
    *,
    version: int = 2,
    identifier: bytes = b"ODTC",
    module: bool = True,
    nominal: bool = False,
    external: bool = False,
    groups: Sequence[Group] = (),
    ints: Sequence[tuple[str | None, int]] = (),
    floats: Sequence[tuple[str | None, float]] = (),
    strings: Sequence[tuple[str | None, str | None]] = (),
    shared_raw: bytes | None = None,
) -> bytes:
    """A Checkpoint flatbuffer; ``shared_raw`` is one raw_data vector tensors can point at (raw_ref=0)."""
    b = flatbuffers.Builder(1024)
    shared = b.CreateByteVector(shared_raw) if shared_raw is not None else None

    def offsets(items: list[int]) -> int:
        b.StartVector(4, len(items), 4)
        for item in reversed(items):
            b.PrependUOffsetTRelative(item)
        return b.EndVector()

    def string(value: str | None) -> int | None:
        return None if value is None else b.CreateString(value)

    def tensor(t: T) -> int:
        name = string(t.name)
        dims = b.CreateNumpyVector(np.asarray(list(t.dims), dtype="<i8"))
        raw = shared if t.raw_ref is not None else (None if t.raw is None else b.CreateByteVector(t.raw))
        strings_vector = offsets([b.CreateString(s) for s in t.string_data]) if t.string_data else None
        b.StartObject(TensorSlots.COUNT)
        if name is not None:
            b.PrependUOffsetTRelativeSlot(TensorSlots.NAME, name, 0)
        b.PrependUOffsetTRelativeSlot(TensorSlots.DIMS, dims, 0)
        b.PrependInt32Slot(TensorSlots.DATA_TYPE, t.data_type, 0)
        if raw is not None:
            b.PrependUOffsetTRelativeSlot(TensorSlots.RAW_DATA, raw, 0)
        if strings_vector is not None:
            b.PrependUOffsetTRelativeSlot(TensorSlots.STRING_DATA, strings_vector, 0)
        b.PrependInt64Slot(TensorSlots.EXTERNAL_DATA_OFFSET, t.external_offset, -1)
        return b.EndObject()

    def tensors(items: Sequence[T] | None) -> int | None:
        return None if items is None else offsets([tensor(t) for t in items])

    module_offset = None
    if module:
        requires_grad, frozen_vector = tensors(trainable), tensors(frozen)
        b.StartObject(ModuleStateSlots.COUNT)
        if requires_grad is not None:
            b.PrependUOffsetTRelativeSlot(ModuleStateSlots.REQUIRES_GRAD_PARAMS, requires_grad, 0)
        if frozen_vector is not None:
            b.PrependUOffsetTRelativeSlot(ModuleStateSlots.FROZEN_PARAMS, frozen_vector, 0)
        b.PrependBoolSlot(ModuleStateSlots.IS_NOMINAL_STATE, nominal, False)
        b.PrependBoolSlot(ModuleStateSlots.HAS_EXTERNAL_DATA, external, False)
        module_offset = b.EndObject()

    group_offsets = []
    for g in groups:
        states = None
        if g.states is not None:
            items = []
            for param, moments in g.states.items():
                moment_vector = offsets([tensor(t) for t in moments])
                param_name = b.CreateString(param)
                b.StartObject(ParameterOptimizerStateSlots.COUNT)
                b.PrependUOffsetTRelativeSlot(ParameterOptimizerStateSlots.PARAM_NAME, param_name, 0)
                b.PrependUOffsetTRelativeSlot(ParameterOptimizerStateSlots.MOMENTUMS, moment_vector, 0)
                items.append(b.EndObject())
            states = offsets(items)
        name = string(g.name)
        b.StartObject(OptimizerGroupSlots.COUNT)
        if name is not None:
            b.PrependUOffsetTRelativeSlot(OptimizerGroupSlots.GROUP_NAME, name, 0)
        b.PrependInt64Slot(OptimizerGroupSlots.STEP, g.step, 0)
        b.PrependFloat32Slot(OptimizerGroupSlots.INITIAL_LEARNING_RATE, g.lr, 0.0)
        if states is not None:
            b.PrependUOffsetTRelativeSlot(OptimizerGroupSlots.OPTIMIZER_STATES, states, 0)
        group_offsets.append(b.EndObject())
    groups_vector = offsets(group_offsets) if group_offsets else None

    bag = None
    if ints or floats or strings:
        kinds = []
        for entries, kind in ((ints, "int"), (floats, "float"), (strings, "str")):
            items = []
            for name, value in entries:
                name_offset = string(name)
                value_offset = string(value) if kind == "str" else None
                b.StartObject(PropertySlots.COUNT)
                if name_offset is not None:
                    b.PrependUOffsetTRelativeSlot(PropertySlots.NAME, name_offset, 0)
                if kind == "int":
                    b.PrependInt64Slot(PropertySlots.VALUE, value, 0)
                elif kind == "float":
                    b.PrependFloat32Slot(PropertySlots.VALUE, value, 0.0)
                elif value_offset is not None:
                    b.PrependUOffsetTRelativeSlot(PropertySlots.VALUE, value_offset, 0)
                items.append(b.EndObject())
            kinds.append(offsets(items))
        b.StartObject(PropertyBagSlots.COUNT)
        for slot, vector in zip(
            (PropertyBagSlots.INTS, PropertyBagSlots.FLOATS, PropertyBagSlots.STRINGS), kinds, strict=True
        ):
            b.PrependUOffsetTRelativeSlot(slot, vector, 0)
        bag = b.EndObject()

    b.StartObject(CheckpointSlots.COUNT)
    b.PrependInt32Slot(CheckpointSlots.VERSION, version, 0)
    if module_offset is not None:
        b.PrependUOffsetTRelativeSlot(CheckpointSlots.MODULE_STATE, module_offset, 0)
    if groups_vector is not None:
        b.PrependUOffsetTRelativeSlot(CheckpointSlots.OPTIMIZER_GROUPS, groups_vector, 0)
    if bag is not None:
        b.PrependUOffsetTRelativeSlot(CheckpointSlots.PROPERTY_BAG, bag, 0)
    b.Finish(b.EndObject(), file_identifier=identifier)
    return bytes(b.Output())


def f32(*values: float) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()
