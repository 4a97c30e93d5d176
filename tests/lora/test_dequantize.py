"""The NumPy dequantization merging uses, against onnxruntime's own DequantizeLinear and MatMulNBits."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.lora.dequantize import dequantize_linear, matmul_nbits_weight
from tests.autodiff.specs_quantized import pack


def _run(
    node: onnx.NodeProto, inits: list[onnx.TensorProto], opsets: dict[str, int], feeds: dict[str, np.ndarray]
) -> np.ndarray:
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(v.shape)) for name, v in feeds.items()]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    model.ir_version = 10
    return ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]


@pytest.mark.parametrize(
    ("scale_shape", "attrs", "opset"),
    [((), {}, 13), ((5,), {"axis": 1}, 13), ((6,), {"axis": 0}, 13), ((2, 5), {"axis": 0, "block_size": 4}, 21)],
    ids=["per-tensor", "per-column", "per-row", "blocked"],
)
def test_dequantize_linear(scale_shape: tuple[int, ...], attrs: dict[str, int], opset: int) -> None:
    rng = np.random.default_rng(0)
    q = rng.integers(-128, 128, size=(6, 5)).astype(np.int8)
    scale = rng.uniform(0.01, 0.1, size=scale_shape).astype(np.float32)
    zero = rng.integers(-5, 5, size=scale_shape).astype(np.int8)
    inits = [numpy_helper.from_array(q, "q"), numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zero, "z")]
    node = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **attrs)
    expected = _run(node, inits, {"": opset}, {})
    np.testing.assert_allclose(dequantize_linear(node, {t.name: t for t in inits}, None), expected, rtol=1e-6)


@pytest.mark.parametrize("zero_mode", ["none", "packed", "float"])
@pytest.mark.parametrize("k", [16, 20, 40])
def test_matmul_nbits_weight(zero_mode: str, k: int) -> None:
    """A @ dequant(B)^T with A the identity gives dequant(B)^T, [K, N]."""
    rng = np.random.default_rng(k)
    n, block = 3, 16
    blocks = -(-k // block)
    codes = rng.integers(0, 16, size=(n, blocks * block))
    inits = [
        numpy_helper.from_array(pack(codes, 4).reshape(n, blocks, block // 2), "B"),
        numpy_helper.from_array(rng.uniform(-0.3, 0.3, size=n * blocks).astype(np.float32), "s"),
    ]
    inputs = ["A", "B", "s"]
    if zero_mode == "packed":
        zero = rng.integers(0, 16, size=(n, blocks + blocks % 2))
        inits.append(numpy_helper.from_array(pack(zero, 4).reshape(-1), "z"))
        inputs.append("z")
    elif zero_mode == "float":
        inits.append(numpy_helper.from_array(rng.uniform(0, 15, size=n * blocks).astype(np.float32), "z"))
        inputs.append("z")
    node = helper.make_node("MatMulNBits", inputs, ["y"], domain="com.microsoft", K=k, N=n, bits=4, block_size=block)
    expected = _run(node, inits, {"": 17, "com.microsoft": 1}, {"A": np.eye(k, dtype=np.float32)})
    got = matmul_nbits_weight(node, {t.name: t for t in inits}, None)
    assert got.shape == (k, n)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
