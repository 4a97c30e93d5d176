"""Round trips, determinism, the file layout and external data."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnxtrain.checkpoint import (
    DEFAULT_EXTERNAL_DATA_THRESHOLD,
    CheckpointState,
    OptimizerState,
    decode,
    encode,
    external_data_path,
    load,
    save,
)
from onnxtrain.checkpoint import format as fmt
from onnxtrain.checkpoint.flatbuffer import Budget, Table, root
from onnxtrain.checkpoint.schema import CheckpointSlots, ModuleStateSlots, OptimizerGroupSlots, TensorSlots
from tests.checkpoint.strategies import states
from tests.folders import leftovers, visible_names


def example_state() -> CheckpointState:
    rng = np.random.default_rng(0)
    return CheckpointState(
        trainable={"w": rng.standard_normal((4, 8)).astype(np.float32), "b": np.array([1.5], np.float32)},
        frozen={
            "ids": np.arange(20),
            "table": rng.standard_normal(9),
            "half": np.ones(50, np.float16),
            "bf": np.arange(40).astype(ml_dtypes.bfloat16),
            "flag": np.array([True, False]),
            "scalar": np.float64(2.5),
            "empty": np.zeros((0, 3), np.int32),
        },
        optimizer=OptimizerState(
            {
                "w": [np.ones((4, 8), np.float32), np.full((4, 8), 2, np.float32)],
                "b": [np.zeros(1, np.float32), np.ones(1, np.float32)],
            },
            step=5,
            initial_learning_rate=0.01,
        ),
        properties={"epoch": 3, "best": 0.25, "name": "run-1", "zero": -0.0},
    )


def tensor_tables(buf: bytes) -> dict[str, dict[str, Table]]:
    budget = Budget(10 * len(buf))
    checkpoint = root(memoryview(buf), b"ODTC", "Checkpoint", budget)
    module = checkpoint.table(CheckpointSlots.MODULE_STATE, "module_state")
    assert module is not None
    out: dict[str, dict[str, Table]] = {}
    for slot, kind in (
        (ModuleStateSlots.REQUIRES_GRAD_PARAMS, "trainable"),
        (ModuleStateSlots.FROZEN_PARAMS, "frozen"),
    ):
        out[kind] = {t.string(TensorSlots.NAME, "n"): t for t in module.tables(slot, kind) or []}
    return out


@settings(max_examples=40, deadline=None)
@given(states())
def test_round_trip(tmp_path_factory, state):
    path = tmp_path_factory.mktemp("rt") / "checkpoint"
    save(state, path)
    assert load(path) == state
    assert decode(encode(state)) == state


@settings(max_examples=15, deadline=None)
@given(states(nominal=False), st.integers(0, 256))
def test_round_trip_with_external_data(tmp_path_factory, state, threshold):
    path = tmp_path_factory.mktemp("ext") / "checkpoint"
    save(state, path, external_data_threshold=threshold)
    uses_external = fmt.tensor_bytes(state) > threshold
    assert external_data_path(path).exists() == uses_external
    assert load(path) == state


@settings(max_examples=15, deadline=None)
@given(states())
def test_same_state_same_bytes(state):
    reordered = CheckpointState(
        dict(reversed(state.trainable.items())),
        dict(reversed(state.frozen.items())),
        state.optimizer,
        dict(reversed(state.properties.items())),
        is_nominal=state.is_nominal,
    )
    assert bytes(encode(state)) == bytes(encode(state)) == bytes(encode(reordered))


def test_example_round_trip_and_files(tmp_path):
    state = example_state()
    assert save(state, tmp_path / "ckpt") == tmp_path / "ckpt"
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    assert load(tmp_path / "ckpt") == state
    assert load(str(tmp_path / "ckpt")) == state


def test_layout_matches_ort(tmp_path):
    state = example_state()
    buf = bytes(encode(state))
    assert buf[4:8] == b"ODTC"
    checkpoint = root(memoryview(buf), b"ODTC", "Checkpoint", Budget(10 * len(buf)))
    assert checkpoint.scalar(CheckpointSlots.VERSION, "int32", 0, "version") == 2
    tables = tensor_tables(buf)
    assert list(tables["trainable"]) == ["b", "w"]  # sorted by name, as ORT writes a state
    assert list(tables["frozen"]) == sorted(state.frozen)
    w = tables["trainable"]["w"]
    assert w.int64_vector(TensorSlots.DIMS, "dims") == [4, 8]
    assert w.scalar(TensorSlots.DATA_TYPE, "int32", 0, "t") == 1
    assert w.scalar(TensorSlots.EXTERNAL_DATA_OFFSET, "int64", -1, "e") == -1
    assert w.string(TensorSlots.DOC_STRING, "doc") is None
    (group,) = checkpoint.tables(CheckpointSlots.OPTIMIZER_GROUPS, "groups") or []
    assert group.string(OptimizerGroupSlots.GROUP_NAME, "g") == "group0"
    assert group.scalar(OptimizerGroupSlots.STEP, "int64", 0, "s") == 5
    no_props = bytes(encode(CheckpointState({"w": np.zeros(1)})))
    empty = root(memoryview(no_props), b"ODTC", "Checkpoint", Budget(10 * len(no_props)))
    assert empty.table(CheckpointSlots.PROPERTY_BAG, "p") is None
    assert empty.tables(CheckpointSlots.OPTIMIZER_GROUPS, "g") == []


def test_without_optimizer_state(tmp_path):
    state = example_state()
    save(state, tmp_path / "ckpt", include_optimizer_state=False)
    loaded = load(tmp_path / "ckpt")
    assert loaded.optimizer is None
    assert loaded == CheckpointState(state.trainable, state.frozen, None, state.properties)


def test_nominal_round_trip_keeps_shapes(tmp_path):
    nominal = example_state().nominal()
    save(nominal, tmp_path / "nominal")
    loaded = load(tmp_path / "nominal")
    assert loaded.is_nominal and loaded == nominal
    assert loaded.trainable["w"].shape == (4, 8)
    assert os.path.getsize(tmp_path / "nominal") < 1024


def test_external_data_layout_follows_ort(tmp_path):
    state = example_state()
    path = tmp_path / "ckpt"
    save(state, path, external_data_threshold=100)
    data = external_data_path(path).read_bytes()
    buf = path.read_bytes()
    module = root(memoryview(buf), b"ODTC", "C", Budget(10 * len(buf))).table(CheckpointSlots.MODULE_STATE, "m")
    assert module is not None and module.scalar(ModuleStateSlots.HAS_EXTERNAL_DATA, "bool", 0, "x") == 1
    tables = tensor_tables(buf)
    for kind, arrays in (("trainable", state.trainable), ("frozen", state.frozen)):
        for name, array in arrays.items():
            table = tables[kind][name]
            offset = table.scalar(TensorSlots.EXTERNAL_DATA_OFFSET, "int64", -1, "e")
            if array.nbytes < fmt.MIN_EXTERNAL_TENSOR_BYTES:  # small tensors stay inline
                assert offset == -1, name
                continue
            assert table.vector_bytes(TensorSlots.RAW_DATA, 1, "raw") is None, name
            alignment = 8 if array.dtype in (np.int64, np.float64) else 4
            assert offset % alignment == 0, name
            assert data[offset : offset + array.nbytes] == array.tobytes(), name
    assert load(path) == state


def test_external_data_threshold_is_exclusive(tmp_path):
    state = CheckpointState({"w": np.zeros(100, np.float32)})
    save(state, tmp_path / "at", external_data_threshold=400)
    save(state, tmp_path / "over", external_data_threshold=399)
    assert not external_data_path(tmp_path / "at").exists()
    assert external_data_path(tmp_path / "over").stat().st_size == 400
    assert DEFAULT_EXTERNAL_DATA_THRESHOLD == 1800 * 2**20


def test_saving_inline_over_external_removes_the_stale_data_file(tmp_path):
    state = example_state()
    save(state, tmp_path / "ckpt", external_data_threshold=0)
    assert external_data_path(tmp_path / "ckpt").exists()
    save(state, tmp_path / "ckpt")
    assert visible_names(tmp_path) == ["ckpt"] and leftovers(tmp_path) == []
    assert load(tmp_path / "ckpt") == state
    save(state, tmp_path / "ckpt")  # a plain file again, and nothing hidden
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_too_large_for_one_flatbuffer_asks_for_external_data(tmp_path, monkeypatch):
    monkeypatch.setattr(fmt, "MAX_FLATBUFFER_BYTES", 3000)
    state = CheckpointState({"w": np.zeros(1000, np.float32)})
    with pytest.raises(ValueError, match="external_data_threshold"):
        save(state, tmp_path / "ckpt")
    assert os.listdir(tmp_path) == []
    save(state, tmp_path / "ckpt", external_data_threshold=100)
    assert load(tmp_path / "ckpt") == state


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [({"external_data_threshold": -1}, ValueError), ({"external_data_threshold": 1.5}, TypeError)],
)
def test_save_rejects_bad_arguments_before_writing(tmp_path, kwargs, error):
    with pytest.raises(error):
        save(example_state(), tmp_path / "ckpt", **kwargs)
    with pytest.raises(TypeError, match="CheckpointState"):
        save({"w": np.zeros(1)}, tmp_path / "ckpt")  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        save(example_state(), tmp_path / "missing" / "ckpt")
    assert os.listdir(tmp_path) == []
