"""Matrix-product rules beyond the spec table: the forms emitted for common layers."""

from __future__ import annotations

import numpy as np
from onnx import helper

from onnxtrain.autodiff import build_gradients
from onnxtrain.graph import GraphBuilder
from tests.helpers import DOUBLE, make_model, run_model


def test_weight_shared_across_a_batch_gets_one_gemm() -> None:
    """x[B, T, D] @ w[D, H]: dw is one Gemm over the flattened rows, with no [B, D, H] intermediate."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3, 2))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)]
    model = make_model({"x": (DOUBLE, ["batch", "time", 3])}, nodes, {"loss": (DOUBLE, [])}, initializers=[("w", w)])
    builder = GraphBuilder(model)
    before = len(builder.model.graph.node)
    grads = build_gradients(builder, "loss", ["w"])
    ops = [node.op_type for node in builder.model.graph.node[before:]]
    assert "Gemm" in ops and "ReduceSum" not in ops and "MatMul" not in ops, ops
    builder.set_outputs(["loss", grads["w"]])
    x = rng.normal(size=(4, 5, 3))
    _, dw = run_model(builder.finalize(), {"x": x})
    np.testing.assert_allclose(dw, x.reshape(-1, 3).sum(axis=0)[:, None] * np.ones((1, 2)))
