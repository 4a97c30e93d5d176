"""RMS normalization exported as a chain of nodes, differentiated as one function
(``onnxtrain/autodiff/rules/norm_chains.py``).

The forms are those torch's exporters write for Llama's, Gemma's and T5's
RMSNorm: ``Pow(x, 2)`` or ``x * x``, ``ReduceMean`` with its axes as an
attribute (opset 17) or an input (opset 18), ``Div(1, .)`` or
``Reciprocal``, the operands in either order, T5's square of ``x`` cast to
float (and its input cast twice, once for the square and once for the
product). Each gradient is checked against central finite differences in
float64 (onnx's reference evaluator) and against the node-by-node gradient
of the same chain; chains that are no RMS normalization are left to the node
rules.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper

from tests.autodiff.test_activation_chains import evaluate, with_gradient
from tests.helpers import make_model

DOUBLE = TensorProto.DOUBLE
EPS = 1e-6


def rms_nodes(
    *,
    square: str = "Pow",
    inverse: str = "Div",
    axes: Sequence[int] = (-1,),
    opset: int = 17,
    x_first: bool = True,
    cast: bool | str = False,
    exponent: float = 2.0,
    numerator: float = 1.0,
) -> tuple[list[onnx.NodeProto], list[tuple[str, np.ndarray]]]:
    """``y = x * 1 / sqrt(mean(x^2, axes) + eps)`` in the given form; its nodes and constants."""
    nodes: list[onnx.NodeProto] = []
    constants = [("two", np.array(exponent)), ("eps", np.array(EPS)), ("one", np.array(numerator))]
    source = "x"
    if cast == "twice":  # T5 with bfloat16 weights: the input cast once for the square, once for the product
        nodes += [
            helper.make_node("Cast", ["x"], ["xc"], to=DOUBLE),
            helper.make_node("Cast", ["x"], ["xm"], to=DOUBLE),
        ]
        source = "xc"
    elif cast:
        nodes.append(helper.make_node("Cast", ["x"], ["xc"], to=DOUBLE))
        source = "xc"
    if square == "Pow":
        nodes.append(helper.make_node("Pow", [source, "two"], ["sq"]))
    else:
        nodes.append(helper.make_node("Mul", [source, source], ["sq"]))
    if opset >= 18:
        constants.append(("axes", np.array(list(axes), np.int64)))
        nodes.append(helper.make_node("ReduceMean", ["sq", "axes"], ["mean"], keepdims=1))
    else:
        nodes.append(helper.make_node("ReduceMean", ["sq"], ["mean"], axes=list(axes), keepdims=1))
    nodes.append(helper.make_node("Add", ["mean", "eps"], ["shifted"]))
    nodes.append(helper.make_node("Sqrt", ["shifted"], ["root"]))
    if inverse == "Div":
        nodes.append(helper.make_node("Div", ["one", "root"], ["r"]))
    else:
        nodes.append(helper.make_node("Reciprocal", ["root"], ["r"]))
    scaled = "xm" if cast == "twice" else "x"
    nodes.append(helper.make_node("Mul", [scaled, "r"] if x_first else ["r", scaled], ["y"]))
    return nodes, constants


INNER = ("sq", "mean", "shifted", "root")

#: The forms of the tests, by name.
FORMS: dict[str, dict[str, object]] = {
    "llama": {},
    "gemma-reciprocal": {"square": "Mul", "inverse": "Reciprocal", "x_first": False},
    "opset-18": {"opset": 18},
    "two-axes": {"axes": (-2, -1)},
    "t5-cast": {"cast": True},
    "t5-cast-twice": {"cast": "twice"},
}


def rms_model(also_output: bool = False, **form: object) -> onnx.ModelProto:
    """``loss = sum(w * rms(x))``, ``x`` of ``[2, 3, 5]``; ``also_output``: the mean is a graph output too."""
    nodes, constants = rms_nodes(**form)  # type: ignore[arg-type]
    nodes += [helper.make_node("Mul", ["y", "w"], ["p"]), helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0)]
    outputs: dict[str, tuple[int, list[int] | None]] = {"loss": (DOUBLE, [])}
    if also_output:
        outputs["mean"] = (DOUBLE, None)
    opset = int(form.get("opset", 17))  # type: ignore[call-overload]
    return make_model({"x": (DOUBLE, [2, 3, 5]), "w": (DOUBLE, [2, 3, 5])}, nodes, outputs, constants, opset=opset)


@pytest.mark.parametrize("name", list(FORMS))
@given(
    x=hnp.arrays(np.float64, (2, 3, 5), elements=st.floats(-4.0, 4.0).filter(lambda v: abs(v) > 1e-3)),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=10, deadline=None)
def test_gradient_matches_finite_differences(name: str, x: np.ndarray, seed: int) -> None:
    model, nodes = with_gradient(rms_model(**FORMS[name]))
    assert not {v for node in nodes for v in node.input} & set(INNER), "the chain was not differentiated as one"
    rng = np.random.default_rng(seed)
    w, t = rng.normal(size=x.shape), rng.normal(size=x.shape)
    _, grad = evaluate(model, x, w)
    h = 1e-6
    numeric = (evaluate(model, x + h * t, w)[0] - evaluate(model, x - h * t, w)[0]) / (2 * h)
    np.testing.assert_allclose(float(np.sum(grad * t)), numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", list(FORMS))
def test_equals_the_node_by_node_gradient_in_fewer_nodes(name: str) -> None:
    """The fused gradient equals the chain's node by node (the mean also a graph output keeps it from fusing),
    in five nodes for the chain."""
    fused, fused_nodes = with_gradient(rms_model(**FORMS[name]))
    unfused, unfused_nodes = with_gradient(rms_model(also_output=True, **FORMS[name]))
    assert {v for node in unfused_nodes for v in node.input} & set(INNER), "the fallback was fused"
    assert len(fused_nodes) - 2 == 5 < len(unfused_nodes) - 2  # the loss's two: Expand, Mul
    x = np.random.default_rng(0).normal(size=(2, 3, 5))
    w = np.random.default_rng(1).normal(size=(2, 3, 5))
    np.testing.assert_allclose(evaluate(fused, x, w)[1], evaluate(unfused, x, w)[1], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("form", [{"exponent": 3.0}, {"numerator": 2.0}], ids=["cube", "numerator-2"])
def test_other_chains_are_left_to_the_node_rules(form: dict[str, float]) -> None:
    model, nodes = with_gradient(rms_model(**form))  # type: ignore[arg-type]
    assert {v for node in nodes for v in node.input} & set(INNER)
    x = np.random.default_rng(2).normal(size=(2, 3, 5))
    w = np.ones((2, 3, 5))
    h = 1e-6
    t = np.random.default_rng(3).normal(size=x.shape)
    numeric = (evaluate(model, x + h * t, w)[0] - evaluate(model, x - h * t, w)[0]) / (2 * h)
    np.testing.assert_allclose(float(np.sum(evaluate(model, x, w)[1] * t)), numeric, rtol=1e-6, atol=1e-8)
