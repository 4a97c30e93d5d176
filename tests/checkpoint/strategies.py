"""Hypothesis strategies for checkpoint states and crafted nominal files, and a walker over saved files."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from onnxtrain.checkpoint import SUPPORTED_ELEM_TYPES, CheckpointState, OptimizerState
from onnxtrain.checkpoint.dtypes import numpy_dtype
from onnxtrain.checkpoint.flatbuffer import Budget, Table, root
from onnxtrain.checkpoint.schema import (
    FILE_IDENTIFIER,
    CheckpointSlots,
    ModuleStateSlots,
    OptimizerGroupSlots,
    ParameterOptimizerStateSlots,
    PropertyBagSlots,
    PropertySlots,
    TensorSlots,
)
from tests.checkpoint.craft import Group, T, build

DTYPES = [numpy_dtype(code) for code in sorted(SUPPORTED_ELEM_TYPES)]
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)
names = st.text(min_size=1, max_size=10)


@st.composite
def arrays(draw: st.DrawFn, dtype: np.dtype | None = None, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Any bit pattern of any supported dtype (NaN payloads included); bools are 0/1."""
    dtype = draw(st.sampled_from(DTYPES)) if dtype is None else dtype
    shape = draw(shapes) if shape is None else shape
    size = int(np.prod(shape, dtype=np.int64))
    if dtype == np.bool_:
        return np.array(draw(st.lists(st.booleans(), min_size=size, max_size=size)), dtype=bool).reshape(shape)
    data = draw(st.binary(min_size=size * dtype.itemsize, max_size=size * dtype.itemsize))
    return np.frombuffer(data, dtype=dtype).reshape(shape)


property_values = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(width=32),
    st.text(max_size=20),
)


@st.composite
def states(draw: st.DrawFn, nominal: bool | None = None, max_params: int = 4) -> CheckpointState:
    """A valid state: unique names, some trainable, some frozen, maybe moments and properties."""
    all_names = draw(st.lists(names, max_size=max_params, unique=True))
    split = draw(st.integers(0, len(all_names)))
    trainable = {n: draw(arrays()) for n in all_names[:split]}
    frozen = {n: draw(arrays()) for n in all_names[split:]}
    nominal = draw(st.booleans()) if nominal is None else nominal
    optimizer = None
    if not nominal and draw(st.booleans()):
        count = draw(st.integers(0, 3))
        with_moments = draw(st.lists(st.sampled_from(sorted(trainable)), unique=True)) if trainable else []
        moments = {n: [draw(arrays(shape=trainable[n].shape)) for _ in range(count)] for n in with_moments}
        optimizer = OptimizerState(
            moments,
            step=draw(st.integers(0, 2**63 - 1)),
            initial_learning_rate=draw(st.floats(width=32)),
        )
    properties = draw(st.dictionaries(names, property_values, max_size=4))
    return CheckpointState(trainable, frozen, optimizer, properties, is_nominal=nominal)


def length_fields(buf: bytes) -> list[int]:
    """Byte positions of every vector and string length in a valid checkpoint."""
    return [start - 4 for _, start, _ in _vectors(buf)]


def dims_entries(buf: bytes) -> list[int]:
    """Byte positions of every parameter's declared dimensions (int64 each) in a valid checkpoint."""
    return [start + 8 * i for kind, start, length in _vectors(buf) if kind == "dims" for i in range(length)]


def _vectors(buf: bytes) -> list[tuple[str, int, int]]:
    """``(kind, start, length)`` of every vector and string in a valid checkpoint; kind ``dims`` for the
    parameters' dims (moments' dims are ``moment dims``)."""
    view = memoryview(buf)
    budget = Budget(10 * len(buf) + 4096)
    found: list[tuple[str, int, int]] = []

    def vector(table: Table, slot: int, elem_size: int, kind: str = "") -> None:
        where = table.vector_bytes(slot, elem_size, "v")
        if where is not None:
            found.append((kind, *where))

    def tensor(table: Table, dims: str) -> None:
        vector(table, TensorSlots.NAME, 1)
        vector(table, TensorSlots.DIMS, 8, dims)
        vector(table, TensorSlots.RAW_DATA, 1)

    def tables(table: Table, slot: int) -> list[Table]:
        vector(table, slot, 4)
        return table.tables(slot, "v") or []

    checkpoint = root(view, FILE_IDENTIFIER, "Checkpoint", budget)
    module = checkpoint.table(CheckpointSlots.MODULE_STATE, "m")
    if module is not None:
        for slot in (ModuleStateSlots.REQUIRES_GRAD_PARAMS, ModuleStateSlots.FROZEN_PARAMS):
            for t in tables(module, slot):
                tensor(t, "dims")
    for group in tables(checkpoint, CheckpointSlots.OPTIMIZER_GROUPS):
        vector(group, OptimizerGroupSlots.GROUP_NAME, 1)
        for state in tables(group, OptimizerGroupSlots.OPTIMIZER_STATES):
            vector(state, ParameterOptimizerStateSlots.PARAM_NAME, 1)
            for t in tables(state, ParameterOptimizerStateSlots.MOMENTUMS):
                tensor(t, "moment dims")
    bag = checkpoint.table(CheckpointSlots.PROPERTY_BAG, "p")
    if bag is not None:
        for slot in (PropertyBagSlots.INTS, PropertyBagSlots.FLOATS, PropertyBagSlots.STRINGS):
            for prop in tables(bag, slot):
                vector(prop, PropertySlots.NAME, 1)
    return found


#: A declared dimension: mostly small, else at and past the sizes that matter (2 GiB, 4 GiB of elements,
#: int64's edge, where a product overflows) or negative.
declared_dims = st.one_of(
    st.integers(0, 4),
    st.sampled_from([2**31, 2**32 - 1, 2**32, 2**40, 2**61, 2**62, 2**63 - 1]),
    st.integers(-(2**63), -1),
)


@st.composite
def nominal_tensors(draw: st.DrawFn) -> T:
    """A Tensor table of a nominal checkpoint: any declared dims and element type, data or not."""
    dims = draw(
        st.one_of(
            st.lists(declared_dims, max_size=5),
            st.integers(60, 70).map(lambda rank: [1] * rank),  # about NumPy's 64 dimensions
        )
    )
    return T(
        name=None if draw(st.integers(0, 9)) == 0 else draw(names),
        dims=dims,
        data_type=draw(st.one_of(st.sampled_from(sorted(SUPPORTED_ELEM_TYPES)), st.integers(-1, 25))),
        raw=draw(st.one_of(st.just(b""), st.none(), st.binary(max_size=16))),
        external_offset=draw(st.sampled_from([-1, -1, -1, 0, 8, 2**40])),
    )


@st.composite
def nominal_files(draw: st.DrawFn) -> bytes:
    """A crafted nominal checkpoint (``is_nominal_state``) declaring any sizes, valid or not."""
    trainable = draw(st.lists(nominal_tensors(), max_size=3))
    frozen = draw(st.lists(nominal_tensors(), max_size=2))
    with_moments = trainable and draw(st.integers(0, 3)) == 0  # a nominal checkpoint holds none: an error
    groups = [Group(states={"w": [T("momentum0", trainable[0].dims, trainable[0].data_type)]})] if with_moments else []
    ints = draw(st.lists(st.tuples(names, st.integers(-(2**63), 2**63 - 1)), max_size=2))
    return build(trainable, frozen, nominal=True, external=draw(st.booleans()), groups=groups, ints=ints)
