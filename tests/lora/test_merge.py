"""merge_adapters: the algebra of a Gemm with transA, transB and alpha; a base with external data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from onnxtrain.checkpoint import CheckpointState
from onnxtrain.lora import add_adapters, merge_adapters
from tests.lora.helpers import small_model


def test_external_data_base_given_as_a_path(tmp_path: Path) -> None:
    model = small_model()
    path = tmp_path / "base.onnx"
    onnx.save(
        model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="base.data", size_threshold=0
    )
    adapted, names = add_adapters(path, ["W1", "W2"], 2, 4.0)
    assert next(t for t in adapted.graph.initializer if t.name == "W1").data_location == onnx.TensorProto.EXTERNAL
    adapted_path = tmp_path / "adapted.onnx"  # beside the base: its weights stay in base.data
    onnx.save(adapted, adapted_path)
    rng = np.random.default_rng(0)
    shapes = {t.name: list(t.dims) for t in adapted.graph.initializer}
    values = {name: rng.normal(size=shapes[name]).astype(np.float32) for name in names}
    merged = merge_adapters(adapted_path, CheckpointState(trainable=values))
    assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in merged.graph.initializer if t.name in ("W1", "W2"))
    ids = np.array([1, 0, 4], np.int64)
    trained = onnx.load(adapted_path)
    for tensor in trained.graph.initializer:
        if tensor.name in values:
            tensor.CopyFrom(numpy_helper.from_array(values[tensor.name], tensor.name))
    onnx.save(trained, tmp_path / "trained.onnx")
    (expected,) = ort.InferenceSession(str(tmp_path / "trained.onnx")).run(None, {"ids": ids})
    onnx.save(merged, tmp_path / "merged.onnx")  # W1, W2 inline, E and b still in base.data
    (got,) = ort.InferenceSession(str(tmp_path / "merged.onnx")).run(None, {"ids": ids})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("trans_a", [0, 1])
def test_merge_of_the_gemm_with_trans_b_and_alpha(trans_a: int) -> None:
    """Gemm(u, W2, b, transA, transB=1, alpha=0.5) (u is square): the adapter reads u' (u^T for transA=1) and
    scales by alpha too; merging folds (A B)^T into W2."""
    model = small_model()
    gemm = model.graph.node[2]
    gemm.attribute.extend([helper.make_attribute("alpha", 0.5), helper.make_attribute("transA", trans_a)])
    adapted, names = add_adapters(model, ["W1", "W2"], 2, 3.0)
    rng = np.random.default_rng(1)
    values = {n: rng.normal(size=[*next(t.dims for t in adapted.graph.initializer if t.name == n)]) for n in names}
    values = {n: v.astype(np.float32) for n, v in values.items()}
    ids = np.array([0, 3, 4], np.int64)

    trained = onnx.ModelProto()
    trained.CopyFrom(adapted)
    for tensor in trained.graph.initializer:
        if tensor.name in values:
            tensor.CopyFrom(numpy_helper.from_array(values[tensor.name], tensor.name))
    (expected,) = ort.InferenceSession(trained.SerializeToString()).run(None, {"ids": ids})
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    h = weights["E"][ids]
    u = h @ (weights["W1"] + 1.5 * values["W1.lora_A"] @ values["W1.lora_B"])
    w2 = weights["W2"] + 1.5 * (values["W2.lora_A"] @ values["W2.lora_B"]).T
    np.testing.assert_allclose(expected, 0.5 * (u.T if trans_a else u) @ w2.T + weights["b"], rtol=1e-5, atol=1e-5)
    merged = merge_adapters(adapted, CheckpointState(trainable=values))
    (got,) = ort.InferenceSession(merged.SerializeToString()).run(None, {"ids": ids})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert [n.op_type for n in merged.graph.node] == ["Gather", "MatMul", "Gemm"]
