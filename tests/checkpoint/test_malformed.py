"""Hand-built invalid checkpoints: each gives CheckpointError naming the problem."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from onnxtrain.checkpoint import CheckpointError, CheckpointState, decode, load, save
from tests.checkpoint import test_loader_fuzz
from tests.checkpoint.craft import Group, T, build, f32


def w(name: str = "w", *values: float) -> T:
    values = values or (1.0, 2.0)
    return T(name, [len(values)], 1, f32(*values))


def test_crafted_valid_checkpoint_loads():
    buf = build(
        [w()],
        [T("ids", [2], 7, np.arange(2, dtype="<i8").tobytes())],
        groups=[Group(states={"w": [T("momentum1", [2], 1, f32(3, 4)), T("momentum0", [2], 1, f32(1, 2))]}, step=3)],
        ints=[("epoch", 2)],
        floats=[("loss", 0.5)],
        strings=[("tag", "x")],
    )
    state = decode(buf)
    np.testing.assert_array_equal(state.optimizer.moments["w"][1], [3, 4])  # ordered by index, not file order
    assert state.properties == {"epoch": 2, "loss": 0.5, "tag": "x"}


def test_missing_module_state_is_an_empty_state():
    assert decode(build(module=False)) == CheckpointState()


@pytest.mark.parametrize(
    ("buf", "match"),
    [
        (b"", "too few"),
        (b"\x08\0\0\0ODT", "too few"),
        (build(identifier=b"ORTM"), "file identifier b'ORTM'"),
        (build(version=1), "version 1 is not supported"),
        (build(version=3), "version 3 is not supported"),
        (build(version=0), "version 0"),
        (build(None, []), "requires_grad_params is missing"),
        (build([], None), "frozen_params is missing"),
        (build([T(None, [1], 1, f32(1))]), "has no name"),
        (build([T("w", [2], 1, f32(1))]), r"4 bytes of raw_data; FLOAT \[2\] needs 8"),
        (build([T("w", [-1], 1, b"")]), "negative dimension"),
        (build([T("w", [1], 99, b"\0")]), "element type 99"),
        (build([T("w", [1], 0, b"\0")]), "element type 0"),
        (build([T("w", [1], 8, None, string_data=["a"])]), "STRING"),
        (build([T("w", [1], 1, f32(1), string_data=["a"])]), "string_data"),
        (build([T("w", [1], 1, None)]), "neither raw_data nor an external_data_offset"),
        (build([T("w", [1], 1, None, external_offset=0)]), "has_external_data is false"),
        (build([T("w", [1], 1, None, external_offset=-5)]), "invalid external_data_offset -5"),
        (build([T("f", [2], 9, b"\x01\x02")]), "bool but holds bytes other than 0 and 1"),
        (build([w(), w()]), "'w' twice"),
        (build([w()], [w()]), "both in requires_grad_params and frozen_params"),
        (build([T("w", [2**40, 2**40], 1, None)], nominal=True), "too large"),
        (build([T("w", [0, 2**62], 1, b"")]), "shape"),
        (build(external=True), "no <checkpoint>.data reader"),
        (build([w()], groups=[Group(), Group()]), "2 optimizer groups"),
        (build([w()], groups=[Group(name="g1")]), "'g1' is not 'group0'"),
        (build([w()], groups=[Group(name=None)]), "None is not 'group0'"),
        (build([w()], groups=[Group(states=None)]), "no optimizer_states"),
        (build([w()], groups=[Group(states={"x": [T("momentum0", [2], 1, f32(1, 2))]})]), "not a trainable parameter"),
        (build([w()], groups=[Group(states={"w": [T("momentum0", [3], 1, f32(1, 2, 3))]})]), "has shape"),
        (build([w()], groups=[Group(states={"w": [T("m0", [2], 1, f32(1, 2))]})]), "expected momentum0"),
        (build([w()], groups=[Group(states={"w": [T("momentum1", [2], 1, f32(1, 2))]})]), "momentum0 .. momentum0"),
        (build([w()], groups=[Group(states={"w": [T("momentum01", [2], 1, f32(1, 2))]})]), "expected momentum0"),
        (build([w()], groups=[Group(step=-1)]), "outside"),
        (build(ints=[("a", 1)], strings=[("a", "x")]), "'a' twice"),
        (build(ints=[(None, 1)]), "has no name"),
        (build(strings=[("s", None)]), "string property 's' has no value"),
    ],
)
def test_invalid_contents(buf, match):
    with pytest.raises(CheckpointError, match=match):
        decode(buf)


def test_invalid_utf8_names():
    buf = bytearray(build([w("wé")]))
    position = buf.index("wé".encode())
    buf[position + 1] = 0xFF
    with pytest.raises(CheckpointError, match="not valid UTF-8"):
        decode(bytes(buf))


def test_offsets_pointing_outside_the_file():
    buf = bytearray(build([w()]))
    struct.pack_into("<I", buf, 0, len(buf) + 100)  # root offset
    with pytest.raises(CheckpointError, match="outside"):
        decode(bytes(buf))
    struct.pack_into("<I", buf, 0, 2)  # misaligned root table
    with pytest.raises(CheckpointError, match="aligned"):
        decode(bytes(buf))


def test_shared_raw_data_cannot_multiply_memory():
    """3000 distinct tensors pointing at one 4 KB raw_data vector would decode to 12 MB."""
    data = bytes(4096)
    tensors = [T(f"t{i}", [1024], 1, raw_ref=0) for i in range(3000)]
    buf = build([], tensors, shared_raw=data)
    assert len(buf) < 300_000
    assert test_loader_fuzz.checked_decode(buf) is None  # within the time and allocation limits
    with pytest.raises(CheckpointError, match="more data than it holds"):
        decode(buf)


def test_the_allocation_guard_notices_allocations(monkeypatch):
    def greedy_decode(buf):
        return bytearray(10 * 2**20)

    monkeypatch.setattr(test_loader_fuzz, "decode", greedy_decode)
    with pytest.raises(AssertionError, match="allocated"):
        test_loader_fuzz.checked_decode(b"tiny")


def test_external_data_problems_are_checkpoint_errors(tmp_path):
    state = CheckpointState({"w": np.arange(64, dtype=np.float32)}, {"v": np.arange(32, dtype=np.float64)})
    path = tmp_path / "ckpt"
    save(state, path, external_data_threshold=0)
    data = path.with_name("ckpt.data")
    content = data.read_bytes()

    data.write_bytes(content[:100])
    with pytest.raises(CheckpointError, match=r"outside .*ckpt\.data \(100 bytes\)"):
        load(path)
    data.unlink()
    with pytest.raises(CheckpointError, match=r"ckpt\.data cannot be read"):
        load(path)
    data.write_bytes(content)
    assert load(path) == state


def test_external_data_cannot_be_shared(tmp_path):
    """Distinct tensors at the same external offset would read the data file many times over."""
    path = tmp_path / "ckpt"
    tensors = [T(f"t{i}", [256], 1, None, external_offset=0) for i in range(4)]
    path.write_bytes(build([], tensors, external=True))
    path.with_name("ckpt.data").write_bytes(bytes(2048))
    with pytest.raises(CheckpointError, match="share external data"):
        load(path)


def test_load_errors_name_the_file(tmp_path):
    path = tmp_path / "not-a-checkpoint.onnx"
    path.write_bytes(b"\x08\0\0\0ORTM" + bytes(100))
    with pytest.raises(CheckpointError, match=r"not-a-checkpoint\.onnx: file identifier"):
        load(path)
    with pytest.raises(CheckpointError, match="is a directory"):
        load(tmp_path)
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "missing")


def test_checkpoint_error_is_a_value_error():
    assert issubclass(CheckpointError, ValueError)
    with pytest.raises(ValueError):
        decode(b"garbage!")
