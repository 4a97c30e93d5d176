"""Shape inference over integer vectors as long as a static batch: no allocation per element.

onnx's data propagation keeps every element of the integer vectors it follows
(about 140 bytes each in onnx 1.23): a base model with a static batch of 10**7
that casts a batch to int64 took 3.4 GB and 5 s to open. Such vectors are
data, not shapes, and the inference skips data propagation for them.
"""

from __future__ import annotations

import resource
import time

import numpy as np
import onnx
from onnx import helper

import onnxtrain.onnxblock as onnxblock
from onnxtrain.graph import base
from tests.helpers import FLOAT, INT64, make_model

N = 10**7


def _batch_to_int(n: int) -> onnx.ModelProto:
    """x: float[n] -> Cast to int64 -> Unsqueeze -> Concat: integer vectors of length n."""
    return make_model(
        {"x": (FLOAT, [n])},
        [
            helper.make_node("Cast", ["x"], ["i"], to=onnx.TensorProto.INT64),
            helper.make_node("Unsqueeze", ["i", "axes"], ["u"]),
            helper.make_node("Concat", ["u", "u"], ["y"], axis=0),
        ],
        {"y": (INT64, [2, n])},
        [("axes", np.array([0], np.int64))],
    )


class ShapeOf(onnxblock.ForwardBlock):
    """Returns the base model's inferred value_info names of ``infer_shapes_on_base``, and Shape(input)."""

    def build(self, name: str) -> str:
        self.inferred = self.infer_shapes_on_base()
        return self.builder.add_node1("Shape", [name])


def test_opening_a_model_with_a_batch_long_integer_vector_allocates_little():
    start_memory, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
    with base(_batch_to_int(N)) as builder:
        assert builder.shape("u") == [1, N] and builder.shape("y") == [2, N]
        block = ShapeOf()
        block("y")
    assert {value.name for value in block.inferred.graph.value_info} >= {"i", "u"}
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start_memory < 200 * 1024  # KiB
    assert time.perf_counter() - start < 2.0  # generous: it took 5 s with data propagation


def test_short_shape_vectors_still_get_their_values_propagated():
    """Reshape to Concat(Shape(x)[0:1], [-1]): the exact output shape needs the shape vector's values."""
    model = make_model(
        {"x": (FLOAT, [6, 4])},
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Slice", ["s", "zero", "one"], ["first"]),
            helper.make_node("Concat", ["first", "minus_one"], ["target"], axis=0),
            helper.make_node("Reshape", ["x", "target"], ["y"]),
        ],
        {"y": (FLOAT, None)},
        [("zero", np.array([0], np.int64)), ("one", np.array([1], np.int64)), ("minus_one", np.array([-1], np.int64))],
    )
    with base(model) as builder:
        assert builder.shape("y") == [6, 4]
