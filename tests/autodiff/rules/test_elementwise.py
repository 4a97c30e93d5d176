"""Element-wise rules beyond the spec table: refusals, and values at points finite differences cannot check."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxtrain.autodiff import build_gradients
from onnxtrain.graph import GraphBuilder
from tests.helpers import DOUBLE, FLOAT, make_model, run_model


def _gradients(model: onnx.ModelProto, wrt: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    builder = GraphBuilder(model)
    grads = build_gradients(builder, "loss", wrt)
    builder.set_outputs([grads[name] for name in wrt])
    return run_model(builder.finalize(), feeds)


def test_mod_with_fmod_0_on_floats_is_refused() -> None:
    """fmod=0 is the integer remainder; ONNX forbids it on floats, and the rule says so."""
    nodes = [helper.make_node("Mod", ["a", "b"], ["y"]), helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)]
    model = make_model({"a": (DOUBLE, [3]), "b": (DOUBLE, [3])}, nodes, {"loss": (DOUBLE, [])})
    with pytest.raises(ValueError, match=r"fmod=0.*set fmod=1"):
        build_gradients(GraphBuilder(model), "loss", ["a"])


def _cofactors(x: np.ndarray) -> np.ndarray:
    n = x.shape[-1]
    result = np.empty_like(x)
    for i, j in itertools.product(range(n), repeat=2):
        minor = np.delete(np.delete(x, i, axis=-2), j, axis=-1)
        result[..., i, j] = (-1) ** (i + j) * np.linalg.det(minor.astype(np.float64))
    return result


@pytest.mark.parametrize("dims", [[2, 6, 6], ["b", "n", "n"]])
def test_det_gradient_is_the_cofactor_matrix_even_for_singular_matrices(dims: list[int | str]) -> None:
    """d det(X) / dX = det(X) inverse(X)^T where X is invertible, and the cofactors where it is not."""
    nodes = [helper.make_node("Det", ["x"], ["d"]), helper.make_node("ReduceSum", ["d"], ["loss"], keepdims=0)]
    model = make_model({"x": (FLOAT, dims)}, nodes, {"loss": (FLOAT, [])})
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 6, 6)).astype(np.float32)
    x[1, 5] = x[1, 0] + x[1, 2]  # rank 5: det 0, inverse undefined, gradient not 0
    (dx,) = _gradients(model, ["x"], {"x": x})
    expected = _cofactors(x)
    np.testing.assert_allclose(dx, expected, rtol=1e-3, atol=1e-3)
    x64 = x[0].astype(np.float64)
    np.testing.assert_allclose(dx[0], np.linalg.det(x64) * np.linalg.inv(x64).T, rtol=1e-3, atol=1e-3)
    assert np.abs(dx[1]).max() > 0.1


#: Inputs at and around the activations' kinks, signed zeros, tiny and huge values and infinities (float32).
_SPECIAL = np.array(
    [-np.inf, -1e30, -100.0, -4.0, -3.0, -2.9999998, -1.5, -1.0, -1e-30, -0.0, 0.0, 1e-30, 0.5,
     1.5, 2.9999998, 3.0, 3.0000002, 4.0, 100.0, 1e30, np.inf],
    dtype=np.float32,
)  # fmt: skip
_F = np.float32


def _elu_where(x: np.ndarray, y: np.ndarray, g: np.ndarray, alpha: float) -> np.ndarray:
    return np.where(x > 0, g, g * (y + _F(alpha)))


#: (op, attributes, the gradient as ``Where`` gives it from x, ONNX Runtime's y, and g), in float32 arithmetic.
_WHERE_FORMS = [
    ("LeakyRelu", {}, lambda x, y, g: np.where(x > 0, g, g * _F(0.01))),
    ("LeakyRelu", {"alpha": 0.0}, lambda x, y, g: np.where(x > 0, g, g * _F(0.0))),
    ("LeakyRelu", {"alpha": 1.5}, lambda x, y, g: np.where(x > 0, g, g * _F(1.5))),
    ("Elu", {}, lambda x, y, g: _elu_where(x, y, g, 1.0)),
    ("Elu", {"alpha": 0.3}, lambda x, y, g: _elu_where(x, y, g, 0.3)),
    ("Elu", {"alpha": 0.0}, lambda x, y, g: _elu_where(x, y, g, 0.0)),
    ("Elu", {"alpha": 2.5}, lambda x, y, g: _elu_where(x, y, g, 2.5)),
    ("Celu", {}, lambda x, y, g: np.where(x > 0, g, g * (y / _F(1.0) + _F(1.0)))),
    ("Celu", {"alpha": 0.4}, lambda x, y, g: np.where(x > 0, g, g * (y / _F(0.4) + _F(1.0)))),
    ("HardSigmoid", {}, lambda x, y, g: np.where((y > 0) & (y < 1), g * _F(0.2), _F(0.0))),
    (
        "HardSwish",
        {},
        lambda x, y, g: g * np.where(x > 3, _F(1.0), np.where(x < -3, _F(0.0), x / _F(3.0) + _F(0.5))),
    ),
]


@pytest.mark.parametrize(
    ("op", "attrs", "where_form"),
    _WHERE_FORMS,
    ids=[f"{op}-{'-'.join(f'{k}={v}' for k, v in attrs.items()) or 'default'}" for op, attrs, _ in _WHERE_FORMS],
)
def test_activation_gradients_are_the_bits_of_where(op: str, attrs: dict, where_form: Callable) -> None:
    """The activations' gradients, written as products, min and max (onnxruntime's CPU ``Where`` is a scalar
    loop, 18 ms against 0.2-0.9 ms for the arithmetic on 2.4M floats, 2 cores), give the bits the ``Where`` of
    their definition gives, at the kinks, signed zeros, huge values and infinities, for gradients of both
    signs and 0 (a finite incoming gradient, as a layer's is). HardSigmoid keeps ``g`` as Relu does
    (``RuleContext.keep``): its zeros are ``-0.0`` where ``g`` is negative."""
    x = np.repeat(_SPECIAL, 3)
    g = np.tile(np.array([-1.75, 0.0, 2.5], np.float32), len(_SPECIAL))
    nodes = [
        helper.make_node(op, ["x"], ["y"], **attrs),
        helper.make_node("Mul", ["y", "w"], ["yw"]),
        helper.make_node("ReduceSum", ["yw"], ["loss"], keepdims=0),
    ]
    model = make_model({"x": (FLOAT, [len(x)]), "w": (FLOAT, [len(x)])}, nodes, {"loss": (FLOAT, [])}, opset=18)
    builder = GraphBuilder(model)
    grads = build_gradients(builder, "loss", ["x"])
    builder.set_outputs(["y", grads["x"]])
    trained = builder.finalize()
    assert "Where" not in {node.op_type for node in trained.graph.node} or attrs.get("alpha", 0.0) > 1.0
    y, dx = run_model(trained, {"x": x, "w": g})
    with np.errstate(invalid="ignore"):  # inf * 0 in the branch Where does not take
        want = where_form(x, y, g).astype(np.float32)
    np.testing.assert_array_equal(dx, want)
    if op != "HardSigmoid":
        np.testing.assert_array_equal(np.signbit(dx), np.signbit(want))


def test_prelu_gradients_are_the_bits_of_where() -> None:
    """PRelu's ``dx = g (m + (1 - m) slope)`` and ``dslope = g min(x, 0)`` give the bits of
    ``Where(x > 0, g, slope g)`` and ``Where(x > 0, 0, g x)`` (before the sum over the slope's broadcast axis),
    over special inputs, slopes of both signs, 0 and above 1."""
    x = np.repeat(_SPECIAL, 3)[:, None] * np.ones((1, 4), np.float32)
    slope = np.array([0.25, -0.5, 0.0, 1.5], np.float32)
    g = np.tile(np.array([-1.75, 0.0, 2.5], np.float32), len(_SPECIAL))[:, None] * np.ones((1, 4), np.float32)
    nodes = [
        helper.make_node("PRelu", ["x", "slope"], ["y"]),
        helper.make_node("Mul", ["y", "w"], ["yw"]),
        helper.make_node("ReduceSum", ["yw"], ["loss"], keepdims=0),
    ]
    model = make_model(
        {"x": (FLOAT, list(x.shape)), "slope": (FLOAT, [4]), "w": (FLOAT, list(x.shape))},
        nodes, {"loss": (FLOAT, [])}, opset=18,
    )  # fmt: skip
    builder = GraphBuilder(model)
    grads = build_gradients(builder, "loss", ["x", "slope"])
    builder.set_outputs([grads["x"], grads["slope"]])
    trained = builder.finalize()
    assert "Where" not in {node.op_type for node in trained.graph.node}
    dx, dslope = run_model(trained, {"x": x, "slope": slope, "w": g})
    with np.errstate(invalid="ignore"):  # inf * 0 in the branch Where does not take
        want_dx, want_dslope = np.where(x > 0, g, slope * g), np.where(x > 0, _F(0.0), g * x)
    np.testing.assert_array_equal(dx, want_dx)
    np.testing.assert_array_equal(np.signbit(dx), np.signbit(want_dx))
    np.testing.assert_array_equal(dslope, want_dslope.sum(axis=0, dtype=np.float32))


def test_mish_gradient_is_accurate_from_far_left_to_far_right() -> None:
    """Mish's gradient, ``t + x sigmoid(x) (1 - t^2)`` with ``t = tanh(softplus(x))`` as a ratio of exponentials:
    within 2e-6 of float64's from -1e30 to 1e30 (1.3e-6 at most on onnxruntime 1.32, bounded by its float32
    ``Sigmoid``; ``t = y / x`` was off by 4.2e-6); tanh(log 2) at 0, with nothing apart there."""
    x = np.concatenate([np.linspace(-30, 30, 2001), [-1e30, -100.0, -0.0, 0.0, 1e-30, 100.0, 1e30]]).astype(np.float32)
    nodes = [helper.make_node("Mish", ["x"], ["y"]), helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)]
    model = make_model({"x": (FLOAT, [len(x)])}, nodes, {"loss": (FLOAT, [])}, opset=18)
    (dx,) = _gradients(model, ["x"], {"x": x})
    x64 = x.astype(np.float64)
    t = np.tanh(np.logaddexp(0.0, x64))
    with np.errstate(over="ignore"):
        sigmoid = 1.0 / (1.0 + np.exp(-x64))
    want = t + np.where(np.abs(x64) > 1e3, 0.0, x64 * sigmoid * (1.0 - t * t))
    np.testing.assert_allclose(dx, want, rtol=0, atol=2e-6)
    assert dx[x == 0][0] == np.float32(np.tanh(np.log(2.0)))
