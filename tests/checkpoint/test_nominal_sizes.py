"""Nominal checkpoints declare sizes no data backs: loading them allocates nothing, impossible sizes are errors."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from onnxtrain import api
from onnxtrain.checkpoint import CheckpointError, CheckpointState, decode, load, save
from onnxtrain.checkpoint.state import MAX_NOMINAL_BYTES, check_nominal_allocation, placeholder
from tests.checkpoint.craft import T, build

#: What loading a small file may allocate, whatever it declares.
SMALL = 256 * 1024


def peak(run: Callable[[], object]) -> int:
    """The peak Python allocation (NumPy's arrays included) of ``run()``."""
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_reported_file_loads_without_memory(tmp_path: Path):
    """A nominal checkpoint of a few bytes declaring float32[2**31] (8 GiB): both loaders allocate nothing."""
    path = tmp_path / "nominal"
    path.write_bytes(build([T("w", (2**31,))], nominal=True))
    assert path.stat().st_size < 200
    assert peak(lambda: load(path)) < SMALL
    assert peak(lambda: api.CheckpointState.load_checkpoint(path)) < SMALL
    state = api.CheckpointState.load_checkpoint(path)
    assert state.is_nominal and "'w': 'float32[2147483648]'" in repr(state)
    snapshot = state.to_checkpoint()
    assert snapshot == load(path) and snapshot.trainable["w"].strides == (0,)
    with pytest.raises(RuntimeError, match="Please load the parameter states first"):
        state.parameters["w"]  # (no value to read: nothing allocated, no zeros, as in ORT)


def test_a_7b_parameter_nominal_checkpoint_saves_and_loads_without_memory(tmp_path: Path):
    """32 blocks of 4 x 4096 x 14336 float32 (7.5 billion parameters, 30 GB): names, types and shapes only."""
    shapes = {f"block{i}.w{j}": (4096, 14336) for i in range(32) for j in range(4)}
    assert sum(int(np.prod(s)) for s in shapes.values()) > 7 * 10**9
    nominal = CheckpointState({n: placeholder(np.dtype(np.float32), s) for n, s in shapes.items()}, is_nominal=True)
    assert peak(lambda: save(nominal, tmp_path / "big")) < SMALL
    assert (tmp_path / "big").stat().st_size < 16 * 1024
    assert peak(lambda: api.CheckpointState.load_checkpoint(tmp_path / "big")) < SMALL
    state = api.CheckpointState.load_checkpoint(tmp_path / "big")
    assert state.to_checkpoint() == nominal == load(tmp_path / "big")
    small = CheckpointState({"b": np.ones(3, np.float32), **nominal.trainable}, is_nominal=True)
    save(small, tmp_path / "mixed")
    state = api.CheckpointState.load_checkpoint(tmp_path / "mixed")
    state.parameters["b"] = np.arange(3, dtype=np.float32)  # the real weights come one by one
    np.testing.assert_array_equal(state.parameters["b"].data, np.arange(3, dtype=np.float32))
    assert state.is_nominal  # the others still hold no values


@pytest.mark.parametrize(
    ("dims", "data_type", "raw", "match"),
    [
        ([2**32, 2**32], 1, b"", r"shape \[4294967296, 4294967296\] of float32 is too large"),
        ([2**62, 2], 9, b"", "too large"),  # bool: 2**63 bytes
        ([0, 2**62, 2**62], 1, b"", "too large"),  # no elements, but no array has that shape
        ([2**63 - 1, 2], 3, b"", "too large"),
        ([-1, 4], 1, b"", "negative dimension"),
        ([1] * 65, 1, bytes(4), "dimension"),  # NumPy's limit
    ],
)
@pytest.mark.parametrize("nominal", [True, False], ids=["nominal", "with-data"])
def test_impossible_shapes_are_checkpoint_errors(dims, data_type, raw, match, nominal):
    with pytest.raises(CheckpointError, match=match):
        decode(build([T("w", dims, data_type, raw)], nominal=nominal))


@pytest.mark.parametrize(("dims", "data_type"), [([2**31, 2**31], 3), ([2**60], 1), ([0, 2**59], 11)])
def test_possible_nominal_shapes_load_as_placeholders(dims, data_type):
    state = decode(build([T("w", dims, data_type)], nominal=True))
    w = state.trainable["w"]
    assert list(w.shape) == dims and w.strides == (0,) * len(dims)


def test_the_allocation_check_names_the_tensor_its_shape_and_the_limit():
    check_nominal_allocation([("a", np.dtype(np.float32), (2**20,))], "loading")  # 4 MiB: within the limit
    tensors = [("a", np.dtype(np.float32), (2**20,)), ("b", np.dtype(np.float64), (2**27,))]
    with pytest.raises(CheckpointError) as error:
        check_nominal_allocation(tensors, "placing the state on cpu")
    message = str(error.value)
    assert "placing the state on cpu would allocate 1077936128 bytes" in message
    assert "'b' (float64[134217728])" in message and f"MAX_NOMINAL_BYTES = {MAX_NOMINAL_BYTES}" in message
