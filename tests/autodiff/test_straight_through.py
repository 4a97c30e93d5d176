"""The straight-through gradient of fake quantization: ``DequantizeLinear(QuantizeLinear(x, s, z), s, z)``.

The rule (``onnxtrain/autodiff/rules/quantized.py``) gives ``dx = g`` where
``round(x / s) + z`` is a code of the quantized type and ``0`` where it is
clipped: the derivative of ``clip(x, (qmin - z - 1/2) s, (qmax - z + 1/2) s)``,
the function the fake quantization rounds. That clip is differentiated here by
central finite differences in float64, at points drawn away from its two
bounds, per tensor and per axis, for each integer code type, with the zero
point a constant or a graph input; float8 codes saturate at their largest
magnitude instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper

from onnxtrain.autodiff import MissingGradientError, build_gradients
from onnxtrain.graph import GraphBuilder
from onnxtrain.graph.roles import initializer_roles
from tests.helpers import FLOAT, make_model, run_model

#: Integer code types and their ranges, with the numpy dtype of a zero point.
CODES: dict[int, tuple[int, int, Any]] = {
    TensorProto.UINT8: (0, 255, np.uint8),
    TensorProto.INT8: (-128, 127, np.int8),
    TensorProto.UINT16: (0, 65535, np.uint16),
    TensorProto.INT16: (-32768, 32767, np.int16),
}


def fake_quantized(
    x_shape: list[int], scale: np.ndarray, zero: np.ndarray | None, axis: int, *, zero_as_input: bool = False
) -> onnx.ModelProto:
    """``loss = sum(w * DequantizeLinear(QuantizeLinear(x, s, z), s, z))``; ``w`` an input of ``x``'s shape."""
    names = ["x", "s"] + ([] if zero is None else ["z"])
    initializers: list[tuple[str, np.ndarray]] = [("s", scale)]
    inputs: dict[str, Any] = {"x": (FLOAT, x_shape), "w": (FLOAT, x_shape)}
    if zero is not None and zero_as_input:
        inputs["z"] = (helper.np_dtype_to_tensor_dtype(zero.dtype), list(zero.shape))
    elif zero is not None:
        initializers.append(("z", zero))
    nodes = [
        helper.make_node("QuantizeLinear", names, ["q"], axis=axis),
        helper.make_node("DequantizeLinear", ["q", *names[1:]], ["y"], axis=axis),
        helper.make_node("Mul", ["y", "w"], ["p"]),
        helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0),
    ]
    return make_model(inputs, nodes, {"loss": (FLOAT, [])}, initializers, opset=21)  # 16-bit codes: opset 21


def gradient_of_x(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    builder = GraphBuilder(model)
    grads = build_gradients(builder, "loss", ["x"])
    builder.model.graph.output.append(helper.make_tensor_value_info(grads["x"], FLOAT, None))
    return run_model(builder.model, feeds)[1]


def broadcast(parameter: np.ndarray, rank: int, axis: int) -> np.ndarray:
    """A per-axis parameter ``[C]`` shaped to broadcast over a tensor of ``rank`` along ``axis``."""
    if parameter.size == 1:
        return parameter.reshape(())
    return parameter.reshape([-1] + [1] * (rank - axis % rank - 1))


@st.composite
def quantizations(draw: st.DrawFn) -> dict[str, Any]:
    rank = draw(st.integers(1, 3))
    shape = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    axis = draw(st.integers(-rank, rank - 1))
    per_axis = draw(st.booleans())
    channels = shape[axis] if per_axis else 1
    code = draw(st.sampled_from(sorted(CODES)))
    low, high, dtype = CODES[code]
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.01, 0.5, size=channels).astype(np.float32)
    zero = rng.integers(low, high + 1, size=channels).astype(dtype)
    if not per_axis:
        scale, zero = scale.reshape(()), zero.reshape(())
    return {
        "shape": shape,
        "axis": axis,
        "scale": scale,
        "zero": zero,
        "omit_zero": draw(st.booleans()) and code == TensorProto.UINT8 and not per_axis,
        "zero_as_input": draw(st.booleans()),
        "seed": seed,
    }


@given(quantizations())
def test_is_the_derivative_of_the_clip_the_quantization_rounds(case: dict[str, Any]) -> None:
    shape, axis, scale, zero = case["shape"], case["axis"], case["scale"], case["zero"]
    rng = np.random.default_rng(case["seed"])
    low, high, _ = CODES[helper.np_dtype_to_tensor_dtype(zero.dtype)]
    rank = len(shape)
    s = broadcast(scale.astype(np.float64), rank, axis)
    z = 0.0 if case["omit_zero"] else broadcast(zero.astype(np.float64), rank, axis)
    lower, upper = (low - z - 0.5) * s, (high - z + 0.5) * s
    # points inside, below and above the range, each at least a fifth of a step from the clip's bounds
    span = np.broadcast_to(upper - lower, shape)
    x = np.broadcast_to(lower, shape) + rng.uniform(-0.3, 1.3, size=shape) * span
    step = np.broadcast_to(s, shape)
    near = np.minimum(np.abs(x - lower), np.abs(x - upper)) < 0.2 * step
    x = np.where(near, x + 0.4 * step, x)
    x = x.astype(np.float32)
    w = rng.normal(size=shape).astype(np.float32)

    model = fake_quantized(shape, scale, None if case["omit_zero"] else zero, axis, zero_as_input=case["zero_as_input"])
    feeds = {"x": x, "w": w}
    if case["zero_as_input"] and not case["omit_zero"]:
        feeds["z"] = zero
    got = gradient_of_x(model, feeds)

    def surrogate(values: np.ndarray) -> float:
        return float(np.sum(w.astype(np.float64) * np.clip(values, lower, upper)))

    x64 = x.astype(np.float64)
    expected = np.zeros(shape)
    h = 0.1 * np.broadcast_to(s, shape)  # the clip is linear within a fifth of a step of each point
    for index in np.ndindex(*shape):
        delta = np.zeros(shape)
        delta[index] = h[index]
        expected[index] = (surrogate(x64 + delta) - surrogate(x64 - delta)) / (2 * h[index])
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_the_forward_pass_is_unchanged() -> None:
    rng = np.random.default_rng(0)
    scale, zero = np.float32(0.1), np.uint8(120)
    model = fake_quantized([3, 5], scale, zero, 1)
    x, w = rng.normal(0, 10, size=(2, 3, 5)).astype(np.float32)
    builder = GraphBuilder(model)
    build_gradients(builder, "loss", ["x"])
    kept = [node.op_type for node in builder.model.graph.node[:4]]
    assert kept == ["QuantizeLinear", "DequantizeLinear", "Mul", "ReduceSum"]
    assert run_model(builder.model, {"x": x, "w": w})[0] == run_model(model, {"x": x, "w": w})[0]


def test_the_codes_are_computed_as_pytorch_computes_them() -> None:
    """``round(x * (1 / s))``, as PyTorch's fake quantization: PyTorch's symmetric observers set ``s = max|w| /
    127.5``, so the largest weight often lies where ``x / s`` is 127.5 exactly (rounded to 128: clipped) but
    ``x * (1 / s)`` is 127.49999 (127: inside, its gradient passes in PyTorch)."""
    x, scale = np.float32(0.19010653), np.float32(0.0014910316)  # found so; the next line checks it
    assert x / scale == np.float32(127.5) and x * (np.float32(1) / scale) < np.float32(127.5)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    initializers = [("s", scale), ("z", np.int8(0))]
    model = make_model({"x": (FLOAT, [2])}, nodes, {"loss": (FLOAT, [])}, initializers, opset=19)
    got = gradient_of_x(model, {"x": np.array([x, -x], np.float32)})
    np.testing.assert_array_equal(got, [1.0, 1.0])  # -127.49999 is inside too


def test_a_clip_of_the_codes_narrows_their_range() -> None:
    """``QuantizeLinear -> Clip -> DequantizeLinear``, as the TorchScript exporter writes PyTorch's fake
    quantization to a narrower range (0..127, ``torch.ao``'s x86 and fbgemm configurations)."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("Clip", ["q", "low", "high"], ["narrow"]),
        helper.make_node("DequantizeLinear", ["narrow", "s", "z"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    initializers = [("s", np.float32(0.5)), ("z", np.uint8(0)), ("low", np.uint8(0)), ("high", np.uint8(127))]
    model = make_model({"x": (FLOAT, [4])}, nodes, {"loss": (FLOAT, [])}, initializers, opset=19)
    x = np.array([-1.0, 10.0, 63.0, 64.0], np.float32)  # codes 0 (clipped below), 20, 126, 128 (clipped to 127)
    np.testing.assert_array_equal(gradient_of_x(model, {"x": x}), [0.0, 1.0, 1.0, 0.0])


def test_float8_codes_saturate_at_their_largest_magnitude() -> None:
    scale = np.float32(0.5)
    zero = helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0.0])  # float8 codes: the zero point is 0
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
        helper.make_node("Mul", ["y", "w"], ["p"]),
        helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0),
    ]
    model = make_model(
        {"x": (FLOAT, [4]), "w": (FLOAT, [4])}, nodes, {"loss": (FLOAT, [])}, [("s", scale), zero], opset=19
    )
    x = np.array([-300.0, -10.0, 200.0, 230.0], np.float32)  # the largest float8e4m3fn is 448: x / s <= 448 passes
    w = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    np.testing.assert_array_equal(gradient_of_x(model, {"x": x, "w": w}), [0.0, 2.0, 3.0, 0.0])


def _pair(dequantize_inputs: list[str], **attributes: Any) -> onnx.ModelProto:
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", dequantize_inputs, ["y"], **attributes),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    initializers = [
        ("s", np.float32(0.1)),
        ("s2", np.float32(0.2)),
        ("z", np.uint8(10)),
        ("s_copy", np.float32(0.1)),
        ("z_copy", np.uint8(10)),
    ]
    return make_model({"x": (FLOAT, [4])}, nodes, {"loss": (FLOAT, [])}, initializers, opset=19)


def test_an_absent_zero_point_is_the_same_as_zeros() -> None:
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "zero"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    model = make_model(
        {"x": (FLOAT, [3])}, nodes, {"loss": (FLOAT, [])}, [("s", np.float32(0.1)), ("zero", np.uint8(0))], opset=19
    )
    got = gradient_of_x(model, {"x": np.array([-1.0, 5.0, 30.0], np.float32)})  # codes -10, 50, 300
    np.testing.assert_array_equal(got, [0.0, 1.0, 0.0])


def test_equal_constants_are_the_same_scale_and_zero_point() -> None:
    x = np.array([-5.0, 0.0, 1.0, 30.0], np.float32)  # codes -40, 10, 20, 310: the first and last clipped
    got = gradient_of_x(_pair(["q", "s_copy", "z_copy"]), {"x": x})
    np.testing.assert_array_equal(got, [0.0, 1.0, 1.0, 0.0])


def test_another_scale_is_refused_with_the_nodes_named() -> None:
    with pytest.raises(ValueError, match=r"another scale, zero point or axis.*shares them"):
        build_gradients(GraphBuilder(_pair(["q", "s2", "z"])), "loss", ["x"])


def test_blocked_quantization_is_refused() -> None:
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1, block_size=2),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1, block_size=2),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    initializers = [("s", np.full((3, 2), 0.1, np.float32)), ("z", np.zeros((3, 2), np.uint8))]
    model = make_model({"x": (FLOAT, [3, 4])}, nodes, {"loss": (FLOAT, [])}, initializers, opset=21)
    with pytest.raises(ValueError, match="does not support blocked quantization"):
        build_gradients(GraphBuilder(model), "loss", ["x"])


def test_codes_read_by_another_operator_still_need_a_rule() -> None:
    """Codes a quantized kernel reads (a QOperator model's ``QLinearMatMul``, here a ``Cast``) carry no
    straight-through gradient: the quantizer is then differentiated as any operator, and has no rule."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
        helper.make_node("Cast", ["q"], ["c"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["y", "c"], ["t"]),
        helper.make_node("ReduceSum", ["t"], ["loss"], keepdims=0),
    ]
    initializers = [("s", np.float32(0.1)), ("z", np.uint8(10))]
    model = make_model({"x": (FLOAT, [4])}, nodes, {"loss": (FLOAT, [])}, initializers, opset=19)
    with pytest.raises(MissingGradientError, match=r"QuantizeLinear.*Cast '' read them too.*QuantFormat\.QDQ"):
        build_gradients(GraphBuilder(model), "loss", ["x"])


def test_a_fake_quantized_weight_is_a_weight_and_its_scale_a_constant() -> None:
    nodes = [
        helper.make_node("QuantizeLinear", ["W", "W_scale", "W_zero"], ["Wq"], axis=0),
        helper.make_node("DequantizeLinear", ["Wq", "W_scale", "W_zero"], ["Wd"], axis=0),
        helper.make_node("MatMul", ["x", "Wd"], ["y"]),
    ]
    initializers = [
        ("W", np.ones((3, 2), np.float32)),
        ("W_scale", np.full(3, 0.1, np.float32)),
        ("W_zero", np.zeros(3, np.int8)),
    ]
    model = make_model({"x": (FLOAT, [2, 3])}, nodes, None, initializers, opset=19)
    assert initializer_roles(model) == {"W": "weight", "W_scale": "constant", "W_zero": "constant"}
