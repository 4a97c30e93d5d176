"""Sequence rules end to end: a gradient through SequenceConstruct and SequenceAt.

Every sequence rule also has specs (``SEQUENCE_SPECS``, part of the spec
table that test_rules.py checks against finite differences).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from onnxtrain.autodiff import build_gradients
from onnxtrain.autodiff.paths import carries_float
from onnxtrain.graph import GraphBuilder
from tests.helpers import DOUBLE, make_model, run_model


def _sequence_model() -> onnx.ModelProto:
    """loss = sum(SequenceAt(SequenceConstruct(x, x), 1))."""
    nodes = [
        helper.make_node("SequenceConstruct", ["x", "x"], ["s"]),
        helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", onnx.TensorProto.INT64, [], [1])),
        helper.make_node("SequenceAt", ["s", "one"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    return make_model({"x": (DOUBLE, [2, 3])}, nodes, {"loss": (DOUBLE, [])})


def test_the_gradient_flows_through_a_sequence() -> None:
    """dx = 1: both sequence elements are x, the loss reads one of them."""
    builder = GraphBuilder(_sequence_model())
    grads = build_gradients(builder, "loss", ["x"])
    builder.set_outputs([grads["x"]])
    (dx,) = run_model(builder.finalize(), {"x": np.zeros((2, 3))})
    np.testing.assert_array_equal(dx, np.ones((2, 3)))


def test_which_types_carry_gradients() -> None:
    float_seq = onnx.helper.make_sequence_type_proto(onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, [2]))
    int_seq = onnx.helper.make_sequence_type_proto(onnx.helper.make_tensor_type_proto(onnx.TensorProto.INT64, [2]))
    assert carries_float(float_seq)
    assert carries_float(onnx.helper.make_optional_type_proto(float_seq))
    assert not carries_float(int_seq)
    assert carries_float(None)
