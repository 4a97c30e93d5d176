"""A Pad of zeros before convolutions folded into their pads: which are folded, and the same values and gradients."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxtrain.artifacts import training_model
from onnxtrain.graph.io import copy_model
from onnxtrain.graph.passes import fuse_pads_into_convs
from tests.helpers import FLOAT, make_model, run_model

_W = np.random.default_rng(0).normal(size=(4, 3, 3, 3)).astype(np.float32)


def _padded_conv(
    pads: list[int],
    *,
    mode: str = "constant",
    value: float | None = None,
    conv_attrs: dict[str, object] | None = None,
    also: str | None = None,
) -> onnx.ModelProto:
    """``y = Conv(Pad(x, pads), w)``, ``x`` ``[2, 3, 6, 5]``; ``also``: a second reader of the padded value
    (``"conv"``: another Conv; ``"relu"``; ``"output"``: a graph output)."""
    inputs = ["x", "pads"] + (["value"] if value is not None else [])
    nodes = [
        helper.make_node("Pad", inputs, ["padded"], mode=mode),
        helper.make_node("Conv", ["padded", "w"], ["y"], **(conv_attrs or {})),
    ]
    outputs: dict[str, tuple[int, None]] = {"y": (FLOAT, None)}
    if also == "conv":
        nodes.append(helper.make_node("Conv", ["padded", "w"], ["z"], strides=[2, 2]))
        outputs["z"] = (FLOAT, None)
    elif also == "relu":
        nodes.append(helper.make_node("Relu", ["padded"], ["z"]))
        outputs["z"] = (FLOAT, None)
    elif also == "output":
        outputs["padded"] = (FLOAT, None)
    initializers = [numpy_helper.from_array(np.int64(pads), "pads"), numpy_helper.from_array(_W, "w")]
    if value is not None:
        initializers.append(numpy_helper.from_array(np.float32(value), "value"))
    return make_model({"x": (FLOAT, [2, 3, 6, 5])}, nodes, outputs, initializers=initializers)


@pytest.mark.parametrize(
    ("model", "fused"),
    [
        (_padded_conv([0, 0, 1, 1, 0, 0, 1, 1]), True),
        (_padded_conv([0, 0, 0, 0, 0, 0, 1, 1], conv_attrs={"strides": [2, 2]}), True),  # TensorFlow's SAME
        (_padded_conv([0, 0, 2, 0, 0, 0, 1, 3], conv_attrs={"pads": [1, 1, 0, 0]}), True),  # added to its own
        (_padded_conv([0, 0, 1, 1, 0, 0, 1, 1], value=0.0), True),
        (_padded_conv([0, 0, 1, 1, 0, 0, 1, 1], also="conv"), True),  # every reader a Conv
        (_padded_conv([0, 0, 1, 1, 0, 0, 1, 1], value=1.0), False),  # not zeros
        (_padded_conv([0, 0, 1, 1, 0, 0, 1, 1], mode="reflect"), False),
        (_padded_conv([0, 1, 1, 1, 0, 0, 1, 1]), False),  # a channel added
        (_padded_conv([0, 0, -1, 1, 0, 0, 1, 1]), False),  # a crop
        (_padded_conv([0, 0, 1, 1, 0, 0, 1, 1], conv_attrs={"auto_pad": "SAME_UPPER"}), False),
        (_padded_conv([0, 0, 1, 1, 0, 0, 1, 1], also="relu"), False),  # read by another operator too
        (_padded_conv([0, 0, 1, 1, 0, 0, 1, 1], also="output"), False),
    ],
)
def test_only_zeros_on_spatial_axes_read_by_convs_alone_are_folded(model: onnx.ModelProto, fused: bool) -> None:
    """The folded model computes the same outputs (onnxruntime, float32, to rounding) with no ``Pad``; the others
    are left as they were."""
    rewritten = fuse_pads_into_convs(copy_model(model))
    if not fused:
        assert rewritten.SerializeToString() == model.SerializeToString()
        return
    assert "Pad" not in [node.op_type for node in rewritten.graph.node]
    x = np.random.default_rng(1).normal(size=(2, 3, 6, 5)).astype(np.float32)
    for got, want in zip(run_model(rewritten, {"x": x}), run_model(model, {"x": x}), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_pads_known_only_at_run_time_are_kept() -> None:
    nodes = [helper.make_node("Pad", ["x", "pads"], ["padded"]), helper.make_node("Conv", ["padded", "w"], ["y"])]
    model = make_model(
        {"x": (FLOAT, [2, 3, 6, 5]), "pads": (onnx.TensorProto.INT64, [8])},
        nodes,
        {"y": (FLOAT, None)},
        initializers=[numpy_helper.from_array(_W, "w")],
    )
    assert [node.op_type for node in fuse_pads_into_convs(copy_model(model)).graph.node] == ["Pad", "Conv"]


def test_training_through_folded_pads_gives_the_gradients_of_the_pads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A depthwise layer and a full one after TensorFlow-style pads (stride 1 even, stride 2 uneven): the
    training model built with the pads folded gives the loss and the gradients (input, both weights) of the one
    built with the ``Pad`` nodes kept, whose gradient is ``Pad``'s crop."""
    rng = np.random.default_rng(2)
    depthwise = rng.normal(size=(3, 1, 3, 3)).astype(np.float32)
    full = rng.normal(size=(4, 3, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Pad", ["x", "same"], ["padded"]),
        helper.make_node("Conv", ["padded", "depthwise"], ["h"], group=3),
        helper.make_node("Relu", ["h"], ["a"]),
        helper.make_node("Pad", ["a", "uneven"], ["a_padded"]),
        helper.make_node("Conv", ["a_padded", "full"], ["y"], strides=[2, 2]),
        helper.make_node("Mul", ["y", "y"], ["squares"]),
        helper.make_node("ReduceSum", ["squares"], ["loss"], keepdims=0),
    ]
    forward = make_model(
        {"x": (FLOAT, ["n", 3, 8, 7])},
        nodes,
        {"loss": (FLOAT, [])},
        initializers=[
            numpy_helper.from_array(np.int64([0, 0, 1, 1, 0, 0, 1, 1]), "same"),
            numpy_helper.from_array(np.int64([0, 0, 0, 1, 0, 0, 1, 0]), "uneven"),
            numpy_helper.from_array(depthwise, "depthwise"),
            numpy_helper.from_array(full, "full"),
        ],
    )

    def gradients() -> tuple[list[str], list[np.ndarray]]:
        built = training_model.build_training_models(
            forward, ["loss"], ["depthwise", "full"], input_gradients=["x"]
        ).training
        assert [value.name for value in built.graph.output] == ["loss", "x_grad", "depthwise_grad", "full_grad"]
        feeds = {"x": x, "depthwise": depthwise, "full": full}
        return [node.op_type for node in built.graph.node], run_model(built, feeds)

    x = rng.normal(size=(2, 3, 8, 7)).astype(np.float32)
    ops, folded = gradients()
    assert "Pad" not in ops
    monkeypatch.setattr(training_model, "fuse_pads_into_convs", lambda model: model)
    ops, kept = gradients()
    assert ops[:5] == ["Pad", "Conv", "Relu", "Pad", "Conv"]  # the forward's Pads kept
    for got, want in zip(folded, kept, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
