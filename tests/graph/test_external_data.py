"""Base models given as paths with external data: never loaded, never copied to the cwd."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import onnxtrain.onnxblock as onnxblock
from onnxtrain import blocks
from onnxtrain.losses import MSELoss
from tests.helpers import FLOAT, INT64, make_model, run_model

IN, OUT = 40, 30  # W has 1200 elements: more than the "small tensor" threshold


class Fn(onnxblock.ForwardBlock):
    """A ForwardBlock whose build is a given function."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def build(self, *args: str) -> object:
        return self.fn(*args)


def _external(tensor: onnx.TensorProto) -> dict[str, str]:
    assert tensor.data_location == onnx.TensorProto.EXTERNAL
    assert not tensor.raw_data and not tensor.float_data
    return {entry.key: entry.value for entry in tensor.external_data}


@pytest.fixture
def dense_model(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """models/dense.onnx: y = x @ W + b, W and b in models/weights.bin."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((IN, OUT)).astype(np.float32)
    bias = rng.standard_normal(OUT).astype(np.float32)
    model = make_model(
        {"x": (FLOAT, ["batch", IN])},
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        {"y": (FLOAT, ["batch", OUT])},
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(bias, "b")],
    )
    folder = tmp_path / "models"
    folder.mkdir()
    onnx.save_model(
        model,
        folder / "dense.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    assert (folder / "weights.bin").stat().st_size >= 4 * (IN * OUT + OUT)
    return folder / "dense.onnx", weight, bias


@pytest.fixture
def empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty current directory, to check that nothing gets written into it."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def test_base_from_path_keeps_data_external(dense_model, empty_cwd: Path) -> None:
    """base(path) reads no tensor data and writes nothing to the current directory."""
    path, _, _ = dense_model
    folder_before = sorted(os.listdir(path.parent))
    with onnxblock.base(path) as b:
        assert b.base_dir == path.parent.resolve()
        for tensor in b.model.graph.initializer:
            assert _external(tensor)["location"] == "weights.bin"
        assert b.model.ByteSize() < 2_000
        assert [d.dim_param or d.dim_value for d in b.type_of("y").tensor_type.shape.dim] == ["batch", OUT]
    with onnxblock.base(str(path)) as b:  # str paths too
        assert len(b.model.graph.initializer) == 2
    assert list(empty_cwd.iterdir()) == []
    assert sorted(os.listdir(path.parent)) == folder_before


def test_forward_block_on_external_model(dense_model, empty_cwd: Path) -> None:
    """The built ForwardBlock model is small, still references weights.bin, and runs beside it."""
    path, weight, bias = dense_model
    block = Fn(lambda y: blocks.Softmax()(blocks.Relu()(y)))
    with onnxblock.base(path):
        block("y")
    built = block.to_model_proto()
    assert built.ByteSize() < 3_000
    references = {t.name: _external(t) for t in built.graph.initializer}
    assert {name: ref["location"] for name, ref in references.items()} == {"W": "weights.bin", "b": "weights.bin"}
    assert list(empty_cwd.iterdir()) == []
    out_path = path.parent / "forward.onnx"
    onnx.save_model(built, out_path)
    x = np.random.default_rng(1).standard_normal((3, IN)).astype(np.float32)
    (out,) = run_model(str(out_path), {"x": x})
    logits = np.maximum(x @ weight + bias, 0)
    expected = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, expected / expected.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert list(empty_cwd.iterdir()) == []


def test_loss_on_external_model_runs_beside_the_data(dense_model, empty_cwd: Path) -> None:
    """An MSE loss stacked on the external-data model, saved next to weights.bin, gives NumPy's value."""
    path, weight, bias = dense_model
    block = Fn(lambda y: MSELoss()(y, "target"))
    with onnxblock.base(path):
        block("y")
    built = block.to_model_proto()
    assert [v.name for v in built.graph.input] == ["x", "target"]
    assert all(_external(t)["location"] == "weights.bin" for t in built.graph.initializer if t.name in ("W", "b"))
    out_path = path.parent / "loss.onnx"
    onnx.save_model(built, out_path)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, IN)).astype(np.float32)
    target = rng.standard_normal((5, OUT)).astype(np.float32)
    (loss,) = run_model(str(out_path), {"x": x, "target": target})
    expected = np.mean((x.astype(np.float64) @ weight + bias - target) ** 2)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    assert list(empty_cwd.iterdir()) == []


def _make_sparse(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)
    if path.stat().st_blocks * 512 >= size:
        path.unlink()
        pytest.skip("this filesystem cannot make sparse files")


def test_over_2gb_external_model_is_never_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2.2 GB external tensor (a sparse file): base + blocks + to_model_proto stay tiny and fast."""
    elements = 550_000_000
    folder = tmp_path / "big"
    folder.mkdir()
    _make_sparse(folder / "big.bin", 4 * elements)
    big = onnx.TensorProto(name="big", data_type=FLOAT, dims=[elements])
    big.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", "big.bin"), ("offset", "0"), ("length", str(4 * elements))):
        big.external_data.add(key=key, value=value)
    model = make_model(
        {"idx": (INT64, ["batch"])},
        [helper.make_node("Gather", ["big", "idx"], ["y"])],
        {"y": (FLOAT, ["batch"])},
        [big],
    )
    onnx.save_model(model, folder / "big.onnx")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)

    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    block = Fn(lambda y: MSELoss()(blocks.Mul()(y, blocks.Constant(2.0)()), "target"))
    with onnxblock.base(folder / "big.onnx") as b:
        assert b.type_of("big").tensor_type.shape.dim[0].dim_value == elements
        block("y")
    built = block.to_model_proto()
    elapsed = time.perf_counter() - start
    peak_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak_before

    assert built.ByteSize() < 5_000
    (tensor,) = (t for t in built.graph.initializer if t.name == "big")
    assert _external(tensor) == {"location": "big.bin", "offset": "0", "length": str(4 * elements)}
    assert list(tensor.dims) == [elements]
    assert peak_growth < 500_000_000, "the 2.2 GB tensor must not pass through memory"
    assert elapsed < 20, f"building took {elapsed:.1f} s: the data was probably read"
    assert list(cwd.iterdir()) == []
    assert sorted(os.listdir(folder)) == ["big.bin", "big.onnx"]
    assert (folder / "big.bin").stat().st_blocks * 512 < 4 * elements  # still sparse: never written
