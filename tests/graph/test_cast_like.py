"""``CastLike`` of a declared type becomes a ``Cast``: the same values, and a constant's folds."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnxtrain.graph.passes.cast_like import cast_like_to_cast
from onnxtrain.graph.passes.static_shapes import fold_static_dims
from onnxtrain.sessions import inference_session
from tests.helpers import FLOAT, make_model


def _model() -> onnx.ModelProto:
    """``y = x * CastLike(0.5 as float64, x) + CastLike(2 as int64, bias)``, and a ``CastLike`` whose ``like``
    has no declared type (``h``, made by ``Relu``), as torch's dynamo exporter writes them."""
    nodes = [
        helper.make_node("Constant", [], ["half"], value=helper.make_tensor("half", TensorProto.DOUBLE, [], [0.5])),
        helper.make_node("Constant", [], ["two"], value=helper.make_tensor("two", TensorProto.INT64, [], [2])),
        helper.make_node("CastLike", ["half", "x"], ["half_f"]),
        helper.make_node("CastLike", ["two", "bias"], ["two_f"]),
        helper.make_node("Mul", ["x", "half_f"], ["scaled"]),
        helper.make_node("Add", ["scaled", "two_f"], ["shifted"]),
        helper.make_node("Relu", ["shifted"], ["h"]),
        helper.make_node("CastLike", ["half", "h"], ["half_h"]),
        helper.make_node("Mul", ["h", "half_h"], ["y"]),
    ]
    return make_model(
        {"x": (FLOAT, ["n", 3])}, nodes, {"y": (FLOAT, ["n", 3])}, [("bias", np.ones(3, np.float32))], opset=19
    )


def test_a_cast_like_of_a_declared_type_is_a_cast_with_the_same_values() -> None:
    model = _model()
    rewritten = cast_like_to_cast(_model())
    ops = [node.op_type for node in rewritten.graph.node]
    assert ops.count("CastLike") == 1 and ops.count("Cast") == 2  # h has no declared type: left as it is
    casts = [node for node in rewritten.graph.node if node.op_type == "Cast"]
    assert [helper.get_attribute_value(node.attribute[0]) for node in casts] == [TensorProto.FLOAT] * 2
    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    want = inference_session(model.SerializeToString()).run(None, {"x": x})[0]
    got = inference_session(rewritten.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
    folded = fold_static_dims(rewritten)  # the casts of constants become constants
    assert [node.op_type for node in folded.graph.node if node.op_type == "Cast"] == []
