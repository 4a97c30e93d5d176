"""Masked gradients where the incoming gradient is infinite: 0 where the mask is off, as torch's, not NaN.

A clamp's output at its bound can reach a function whose derivative is infinite there (``sqrt(relu(x))``,
``sqrt(clamp(d2, min=0))`` in pairwise distances, ``acos(clip(c, -1, 1))``): the incoming gradient is then
infinite exactly where the clamp's mask is off, and ``g * mask`` would be NaN, which reaches every parameter.
Those masks are ``Where``s; the others stay products (onnxruntime's CPU ``Where`` is about 8x slower). A norm of
zeros (``F.normalize``'s ``x / max(|x|, eps)`` on a row of zeros) gets 0, as torch's.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import helper
from onnx.reference import ReferenceEvaluator

from tests.autodiff.test_activation_chains import with_gradient
from tests.helpers import DOUBLE, make_model


def _half_root(x: np.ndarray, at_zero: float) -> np.ndarray:
    """``d sqrt(x) / dx = 1 / (2 sqrt(x))`` for ``x > 0``, ``at_zero`` at 0."""
    with np.errstate(divide="ignore"):
        return np.where(x > 0, 0.5 / np.sqrt(np.abs(x)), at_zero)


#: The clamp, the function singular at its bound, and ``d/dx f(clamp(x))`` as torch computes it: 0 beyond the
#: bound; at it, what the clamp's own rule says (ReLU: 0; ``clamp``: the gradient passes, infinite; ``maximum``:
#: ties share it, infinite).
CASES = {
    "sqrt(relu)": (
        [helper.make_node("Relu", ["x"], ["c"]), helper.make_node("Sqrt", ["c"], ["f"])],
        lambda x: np.where(x > 0, _half_root(x, 0.0), 0.0),
    ),
    "sqrt(clip(min=0))": (
        [helper.make_node("Clip", ["x", "zero"], ["c"]), helper.make_node("Sqrt", ["c"], ["f"])],
        lambda x: np.where(x >= 0, _half_root(x, np.inf), 0.0),
    ),
    "sqrt(max(x, 0))": (
        [helper.make_node("Max", ["x", "zero"], ["c"]), helper.make_node("Sqrt", ["c"], ["f"])],
        lambda x: np.where(x >= 0, _half_root(x, np.inf), 0.0),
    ),
    "log(relu) through a reshape": (
        [
            helper.make_node("Relu", ["x"], ["c"]),
            helper.make_node("Reshape", ["c", "flat"], ["r"]),
            helper.make_node("Log", ["r"], ["f"]),
        ],
        lambda x: np.where(x > 0, 1.0 / np.where(x > 0, x, 1.0), 0.0),
    ),
    "acos(clip(x, -1, 1))": (
        [helper.make_node("Clip", ["x", "minus_one", "one"], ["c"]), helper.make_node("Acos", ["c"], ["f"])],
        lambda x: np.where(np.abs(x) < 1, -1.0 / np.sqrt(1.0 - np.minimum(x * x, 0.5)), 0.0),
    ),
}


def _model(name: str) -> onnx.ModelProto:
    """``loss = sum(w * f(clamp(x)))`` over ``x: double[n]``."""
    nodes, _ = CASES[name]
    nodes = [*nodes, helper.make_node("Mul", ["f", "w"], ["fw"]), helper.make_node("ReduceSum", ["fw"], ["loss"])]
    constants = [
        ("zero", np.array(0.0)),
        ("one", np.array(1.0)),
        ("minus_one", np.array(-1.0)),
        ("flat", np.array([-1], np.int64)),
    ]
    model = make_model({"x": (DOUBLE, ["n"]), "w": (DOUBLE, ["n"])}, nodes, {"loss": (DOUBLE, [])}, constants, opset=17)
    nodes[-1].attribute.append(helper.make_attribute("keepdims", 0))
    return model


@pytest.mark.parametrize("name", list(CASES))
@given(
    x=hnp.arrays(np.float64, st.integers(1, 6), elements=st.sampled_from([-2.0, -1.0, -0.5, 0.0, 0.25, 0.5, 1.0, 3.0])),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=12, deadline=None)
def test_a_clamp_at_its_bound_gives_zero_not_nan(name: str, x: np.ndarray, seed: int) -> None:
    """At the bound and beyond it the gradient is 0 (the singular function's infinite derivative masked off);
    inside, the function's own derivative."""
    model, nodes = with_gradient(_model(name))
    w = np.random.default_rng(seed).normal(size=x.shape)
    if name.startswith("acos"):  # at exactly +-1 acos' is infinite from inside too: keep x off the bounds
        x = np.where(np.abs(x) == 1.0, x * 2, x)
    with np.errstate(divide="ignore", invalid="ignore"):
        grad = ReferenceEvaluator(model).run(None, {"x": x, "w": w})[-1]
    with np.errstate(invalid="ignore"):
        expected = np.where(w == 0, 0.0, w * CASES[name][1](x))
    assert not np.any(np.isnan(grad)), grad
    np.testing.assert_allclose(grad, expected, rtol=1e-12, atol=0.0)
    assert any(node.op_type == "Where" for node in nodes)


def test_masks_without_a_singularity_stay_products() -> None:
    """A ReLU MLP's and a clipped value's masks: ``Sign`` or ``Cast`` products, no ``Where``."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("Relu", ["h"], ["a"]),
        helper.make_node("Clip", ["a", "zero", "one"], ["c"]),
        helper.make_node("Max", ["c", "zero"], ["m"]),
        helper.make_node("Mul", ["m", "m"], ["sq"]),
        helper.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0),
    ]
    model = make_model(
        {"x": (DOUBLE, [2, 3])},
        nodes,
        {"loss": (DOUBLE, [])},
        [("W", np.ones((3, 4))), ("zero", np.array(0.0)), ("one", np.array(1.0))],
        opset=17,
    )
    _, gradient_nodes = with_gradient(model, ["W"])
    assert not any(node.op_type == "Where" for node in gradient_nodes)


@given(rows=st.integers(1, 4), zero_row=st.integers(0, 3), seed=st.integers(0, 2**16))
@settings(max_examples=12, deadline=None)
def test_a_norm_of_zeros_has_a_zero_gradient(rows: int, zero_row: int, seed: int) -> None:
    """``F.normalize``: ``y = x / max(|x|_2, eps)`` row by row; a row of zeros gets 0 (torch's), the others
    ``(g - y sum(g y)) / |x|``."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3))
    x[zero_row % rows] = 0.0
    w = rng.normal(size=(rows, 3))
    nodes = [
        helper.make_node("ReduceL2", ["x", "axis"], ["norm"], keepdims=1),
        helper.make_node("Max", ["norm", "eps"], ["safe"]),
        helper.make_node("Div", ["x", "safe"], ["y"]),
        helper.make_node("Mul", ["y", "w"], ["yw"]),
        helper.make_node("ReduceSum", ["yw"], ["loss"], keepdims=0),
    ]
    model = make_model(
        {"x": (DOUBLE, ["n", 3]), "w": (DOUBLE, ["n", 3])},
        nodes,
        {"loss": (DOUBLE, [])},
        [("axis", np.array([1], np.int64)), ("eps", np.array(1e-12))],
        opset=18,
    )
    model, _ = with_gradient(model)
    grad = ReferenceEvaluator(model).run(None, {"x": x, "w": w})[-1]
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    safe = np.maximum(norm, 1e-12)
    y = x / safe
    expected = np.where(norm > 1e-12, (w - y * np.sum(w * y, axis=1, keepdims=True)) / safe, w / 1e-12)
    np.testing.assert_allclose(grad, expected, rtol=1e-9, atol=1e-12)
    assert np.all(np.isfinite(grad))
