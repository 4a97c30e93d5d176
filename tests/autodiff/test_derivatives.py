"""``hessian_vector_product`` and ``jacobian`` of whole models against central differences (float64)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.autodiff import hessian_vector_product, jacobian
from onnxtrain.sessions import inference_session
from tests.blocks import networks

STEP = 1e-5


def with_loss(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with ``loss = sum(sin(y) * y)`` as its only output (a loss whose Hessian in ``y`` is not constant)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.graph.node.extend(
        [
            helper.make_node("Sin", ["y"], ["sin_y"]),
            helper.make_node("Mul", ["sin_y", "y"], ["terms"]),
            helper.make_node("ReduceSum", ["terms"], ["loss"], keepdims=0),
        ]
    )
    del copy.graph.output[:]
    copy.graph.output.append(helper.make_tensor_value_info("loss", TensorProto.DOUBLE, []))
    return copy


def with_values(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """``model`` with the initializers ``values`` replaced."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for tensor in copy.graph.initializer:
        if tensor.name in values:
            tensor.CopyFrom(numpy_helper.from_array(values[tensor.name], tensor.name))
    return copy


def run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = inference_session(model.SerializeToString())
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(None, dict(feeds)), strict=True))


@settings(max_examples=10)
@given(seed=st.integers(0, 2**16), rows=st.integers(1, 4), activation=st.sampled_from(["Tanh", "Sigmoid"]))
def test_hessian_vector_products_match_central_differences_of_gradients(seed: int, rows: int, activation: str) -> None:
    """``H v`` over the parameters and the input together against ``(g(p + h v) - g(p - h v)) / 2h``."""
    model = with_loss(networks.mlp([3, 5, 4, 2], activation=activation, seed=seed))
    wrt = ["W0", "b0", "W1", "W2", "b2", "x"]
    built = hessian_vector_product(model, "loss", wrt)
    assert [o.name for o in built.graph.output] == ["loss", *(f"{n}_grad" for n in wrt), *(f"{n}_hvp" for n in wrt)]
    rng = np.random.default_rng(seed)
    params = networks.parameters(model)
    point = {"x": rng.uniform(-1, 1, size=(rows, 3)), **{name: params[name] for name in wrt if name != "x"}}
    vector = {name: rng.normal(size=value.shape) for name, value in point.items()}
    feeds = {f"{name}_vector": v for name, v in vector.items()}

    def gradients(h: float) -> dict[str, np.ndarray]:
        moved = {name: value + h * vector[name] for name, value in point.items()}
        out = run(with_values(built, moved), {"x": moved["x"], **feeds})
        return {name: out[f"{name}_grad"] for name in wrt}

    out = run(built, {"x": point["x"], **feeds})
    up, down = gradients(STEP), gradients(-STEP)
    for name in wrt:
        numeric = (up[name] - down[name]) / (2 * STEP)
        np.testing.assert_allclose(out[f"{name}_hvp"], numeric, rtol=1e-6, atol=1e-8, err_msg=name)


def test_a_value_the_gradient_does_not_depend_on_gets_a_zero_product() -> None:
    """An input the loss does not read gets a product of zeros of its shape."""
    model = with_loss(networks.mlp([2, 3, 1]))
    model.graph.input.append(helper.make_tensor_value_info("unused", TensorProto.DOUBLE, [2]))
    model.graph.node.insert(0, helper.make_node("Identity", ["unused"], ["unused_copy"]))
    model.graph.output.append(helper.make_tensor_value_info("unused_copy", TensorProto.DOUBLE, [2]))
    built = hessian_vector_product(model, "loss", ["W0", "unused"], ["v_w", "v_unused"])
    feeds = {"x": np.ones((2, 2)), "unused": np.ones(2), "v_w": np.ones((2, 3)), "v_unused": np.ones(2)}
    out = run(built, feeds)
    assert not out["unused_hvp"].any() and out["unused_hvp"].shape == (2,)
    assert out["W0_hvp"].any()


@pytest.mark.parametrize("wrt", ["x", "W0", "b1"])
def test_jacobians_match_central_differences(wrt: str) -> None:
    model = networks.mlp([3, 4, 2], seed=7, batch=3)
    built = jacobian(model, "y", wrt)
    x = np.random.default_rng(8).uniform(-1, 1, size=(3, 3))
    params = networks.parameters(model)
    point = x if wrt == "x" else params[wrt]
    out = run(built, {"x": x})
    assert out["y_jacobian"].shape == (3, 2, *point.shape)
    for index in np.ndindex(*point.shape):
        shift = np.zeros_like(point)
        shift[index] = STEP

        def y_at(value: np.ndarray) -> np.ndarray:
            if wrt == "x":
                return run(model, {"x": value})["y"]
            return run(with_values(model, {wrt: value}), {"x": x})["y"]

        numeric = (y_at(point + shift) - y_at(point - shift)) / (2 * STEP)
        np.testing.assert_allclose(out["y_jacobian"][(..., *index)], numeric, rtol=1e-6, atol=1e-9)


def test_bad_requests_say_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"static shape for 'y'.*blocks.Gradient"):
        jacobian(networks.mlp([3, 4, 2]), "y", "x")  # a symbolic batch
    with pytest.raises(ValueError, match=r"2000 elements, more than 1024"):
        jacobian(networks.mlp([3, 4, 2], batch=1000), "y", "x")
    model = with_loss(networks.mlp([3, 4, 2]))
    with pytest.raises(TypeError, match=r"wrt must be a non-empty list"):
        hessian_vector_product(model, "loss", "x")
    with pytest.raises(ValueError, match=r"vector_names has 1 names for 2 wrt values"):
        hessian_vector_product(model, "loss", ["x", "W0"], ["v"])
