"""The passes that let a training step hold less: shapes read early, dropouts that drop nothing made identities."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxtrain.graph.io import copy_model
from onnxtrain.graph.passes import read_shapes_early, replace_identity_dropouts, replace_zero_pads
from tests.helpers import DOUBLE, FLOAT, make_model, run_model


def _late_shape_model() -> onnx.ModelProto:
    """``big = Exp(x)``; ... the backward-like tail reads ``Shape(big)`` after other work."""
    nodes = [
        helper.make_node("Exp", ["x"], ["big"]),
        helper.make_node("ReduceSum", ["big"], ["total"], keepdims=0),
        helper.make_node("Neg", ["total"], ["late"]),
        helper.make_node("Shape", ["big"], ["shape"]),
        helper.make_node("Size", ["x"], ["count"]),
        helper.make_node("ConstantOfShape", ["shape"], ["zeros"]),
        helper.make_node("Cast", ["count"], ["count_f"], to=DOUBLE),
    ]
    outputs = {"late": (DOUBLE, []), "zeros": (FLOAT, ["n", 3]), "count_f": (DOUBLE, [])}
    return make_model({"x": (DOUBLE, ["n", 3])}, nodes, outputs)


def test_shapes_are_read_right_after_their_values_and_nothing_else_moves():
    model = _late_shape_model()
    moved = read_shapes_early(copy_model(model))
    assert [n.op_type for n in moved.graph.node] == [
        "Size",
        "Exp",
        "Shape",
        "ReduceSum",
        "Neg",
        "ConstantOfShape",
        "Cast",
    ]
    onnx.checker.check_model(moved, full_check=True)
    x = np.random.default_rng(0).normal(size=(4, 3))
    for got, want in zip(run_model(moved, {"x": x}), run_model(model, {"x": x}), strict=True):
        np.testing.assert_array_equal(got, want)
    assert read_shapes_early(moved).SerializeToString() == moved.SerializeToString()  # nothing left to move


def _dropout_model(ratio: float | None, training: bool | None, *, mask_read: bool = False) -> onnx.ModelProto:
    inputs = ["h", "ratio" if ratio is not None else "", "training" if training is not None else ""]
    while inputs and not inputs[-1]:
        inputs.pop()
    nodes = [
        helper.make_node("Relu", ["x"], ["h"]),
        helper.make_node("Dropout", inputs, ["y", "mask"] if mask_read else ["y"]),
    ]
    initializers = []
    if ratio is not None:
        initializers.append(("ratio", np.array(ratio, np.float32)))
    if training is not None:
        initializers.append(("training", np.array(training)))
    outputs = {"y": (FLOAT, ["n", 3])}
    if mask_read:
        nodes.append(helper.make_node("Cast", ["mask"], ["mask_f"], to=FLOAT))
        outputs["mask_f"] = (FLOAT, ["n", 3])
    return make_model({"x": (FLOAT, ["n", 3])}, nodes, outputs, initializers, opset=13)


@pytest.mark.parametrize(
    ("ratio", "training", "mask_read", "replaced"),
    [
        (0.0, True, False, True),  # drops nothing in training mode
        (0.5, False, False, True),  # inference mode
        (0.5, None, False, True),  # no training mode: inference
        (None, None, False, True),  # the default ratio, inference
        (0.5, True, False, False),  # drops: kept
        (None, True, False, False),  # the default ratio 0.5 in training: kept
        (0.0, True, True, False),  # its mask is read: kept
    ],
)
def test_only_a_dropout_that_drops_nothing_and_whose_mask_nobody_reads_becomes_an_identity(
    ratio, training, mask_read, replaced
):
    model = _dropout_model(ratio, training, mask_read=mask_read)
    rewritten = replace_identity_dropouts(copy_model(model))
    ops = [n.op_type for n in rewritten.graph.node]
    assert ("Identity" in ops and "Dropout" not in ops) == replaced, ops
    if replaced:
        x = np.random.default_rng(1).normal(size=(5, 3)).astype(np.float32)
        np.testing.assert_array_equal(run_model(rewritten, {"x": x})[0], run_model(model, {"x": x})[0])


@pytest.mark.parametrize(
    ("pads", "mode", "replaced"),
    [
        ([0, 0, 0, 0], "constant", True),
        ([0, 0, 0, 0], "reflect", True),
        ([0, 1, 0, 0], "constant", False),
        ([0, 0, 0, -1], "constant", False),  # a crop
        (None, "constant", False),  # pads known only at run time
    ],
)
def test_only_a_pad_by_constant_zeros_becomes_an_identity(pads, mode, replaced):
    inputs = {"x": (FLOAT, [3, 4])} | ({"pads": (onnx.TensorProto.INT64, [4])} if pads is None else {})
    initializers = [] if pads is None else [numpy_helper.from_array(np.int64(pads), "pads")]
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)
    model = make_model(inputs, [node], {"y": (FLOAT, None)}, initializers=initializers)
    rewritten = replace_zero_pads(copy_model(model))
    assert [n.op_type for n in rewritten.graph.node] == (["Identity"] if replaced else ["Pad"])
    if replaced:
        x = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
        np.testing.assert_array_equal(run_model(rewritten, {"x": x})[0], x)


def test_a_ratio_known_only_at_run_time_is_kept():
    nodes = [helper.make_node("Dropout", ["x", "ratio", "training"], ["y"])]
    model = make_model(
        {"x": (FLOAT, ["n"]), "ratio": (FLOAT, []), "training": (onnx.TensorProto.BOOL, [])},
        nodes,
        {"y": (FLOAT, ["n"])},
        opset=13,
    )
    assert [n.op_type for n in replace_identity_dropouts(copy_model(model)).graph.node] == ["Dropout"]
