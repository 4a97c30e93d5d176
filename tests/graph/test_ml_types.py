"""Types of the ``ai.onnx.ml`` outputs onnx's schemas declare but do not infer (Scaler, Normalizer, Imputer)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxtrain import artifacts
from onnxtrain.graph.builder import GraphBuilder
from tests.helpers import DOUBLE, FLOAT, make_model

ML = {"ai.onnx.ml": 1}


def scaled(op: str, elem_type: int, **attributes: object) -> onnx.ModelProto:
    """``x [batch, 3] -> op -> s`` then ``y = s @ w`` (w float [3, 2] initializer)."""
    w = np.arange(6, dtype=np.float32).reshape(3, 2) / 10
    nodes = [
        helper.make_node(op, ["x"], ["s"], domain="ai.onnx.ml", **attributes),
        helper.make_node("MatMul", ["s", "w"], ["y"]),
    ]
    return make_model(
        {"x": (elem_type, ["batch", 3])}, nodes, {"y": (FLOAT, ["batch", 2])}, [("w", w)], extra_opsets=ML
    )


@pytest.mark.parametrize(
    ("op", "elem_type", "expected", "attributes"),
    [
        ("Scaler", FLOAT, FLOAT, {"offset": [0.5] * 3, "scale": [2.0] * 3}),
        ("Scaler", DOUBLE, FLOAT, {"offset": [0.5] * 3, "scale": [2.0] * 3}),
        ("Normalizer", FLOAT, FLOAT, {"norm": "L2"}),
        ("Imputer", FLOAT, FLOAT, {"imputed_value_floats": [0.0] * 3, "replaced_value_float": np.nan}),
    ],
)
def test_outputs_of_ml_operators_without_inference_are_typed(
    op: str, elem_type: int, expected: int, attributes: dict[str, object]
) -> None:
    """onnx's schema of the operator says its output type but infers none; the builder types it, and what
    follows it (MatMul) too."""
    builder = GraphBuilder(scaled(op, elem_type, **attributes))
    assert builder.elem_type("s") == expected
    assert builder.shape("s") == ["batch", 3]
    assert builder.elem_type("y") == FLOAT


def test_weights_after_a_scaler_get_gradients() -> None:
    """A Scaler before the trained MatMul used to leave every later value untyped and stop the gradient graph."""
    model = scaled("Scaler", FLOAT, offset=[0.5] * 3, scale=[2.0] * 3)
    built = artifacts.build_artifacts(model, requires_grad=["w"], loss=artifacts.LossType.MSELoss)
    assert any(output.name.startswith("w_grad") for output in built.training_model.graph.output)
