"""Activations exported as chains of element-wise nodes, differentiated as one function
(``onnxtrain/autodiff/rules/activation_chains.py``).

Each form below is a chain an exporter writes: GPT-2's ``NewGELUActivation``
(``Pow(x, 3)``), torch's TorchScript export of ``gelu(approximate="tanh")``
(``x * (x * x)``, the constants first), Hugging Face's ``FastGELUActivation``,
torch's erf GELU, SiLU and CLIP's QuickGELU. Every form's gradient is checked
against central finite differences in float64 (onnx's reference evaluator),
equals the node-by-node gradient of the same chain when a link is read
elsewhere (which keeps the chain from being fused), and reads only the chain's
input and output. Chains the rule must leave alone (a constant off by 1e-4, a
constant of several elements) are differentiated node by node, correctly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.ops._op import OpRunUnaryNum

from onnxtrain.autodiff import build_gradients
from onnxtrain.graph import GraphBuilder
from tests.helpers import export_for_training, make_model, run_model

DOUBLE = TensorProto.DOUBLE
K = math.sqrt(2.0 / math.pi)


def erf(x: np.ndarray) -> np.ndarray:
    return np.frompyfunc(math.erf, 1, 1)(x).astype(np.float64)  # type: ignore[no-any-return]


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))  # type: ignore[no-any-return]


#: ``f'(x)`` of each activation, in float64.
DERIVATIVES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "tanh": lambda x: (
        0.5 * (1 + np.tanh(K * (x + 0.044715 * x**3)))
        + 0.5 * x * (1 - np.tanh(K * (x + 0.044715 * x**3)) ** 2) * K * (1 + 3 * 0.044715 * x**2)
    ),
    "erf": lambda x: 0.5 * (1 + erf(x / math.sqrt(2))) + x * np.exp(-(x**2) / 2) / math.sqrt(2 * math.pi),
    "silu": lambda x: sigmoid(x) * (1 + x * (1 - sigmoid(x))),
    "quick": lambda x: sigmoid(1.702 * x) * (1 + 1.702 * x * (1 - sigmoid(1.702 * x))),
}


class Chain:
    """Nodes computing ``y`` from ``x``, with scalar constants as ``Constant`` nodes or initializers."""

    def __init__(self, elem_type: int, initializers: bool) -> None:
        self.dtype = helper.tensor_dtype_to_np_dtype(elem_type)
        self.as_initializers = initializers
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[tuple[str, np.ndarray]] = []
        self.count = 0

    def const(self, value: float | np.ndarray) -> str:
        self.count += 1
        name = f"c{self.count}"
        array = np.asarray(value, dtype=self.dtype)
        if self.as_initializers:
            self.initializers.append((name, array))
        else:
            self.nodes.append(helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(array)))
        return name

    def op(self, op_type: str, *inputs: str, out: str | None = None) -> str:
        self.count += 1
        name = out or f"v{self.count}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [name]))
        return name


def gpt2_gelu(c: Chain, kappa: float = 0.044715) -> str:
    """GPT-2's ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))``."""
    half = c.op("Mul", "x", c.const(0.5))
    inner = c.op("Add", "x", c.op("Mul", c.op("Pow", "x", c.const(3.0)), c.const(kappa)))
    t = c.op("Tanh", c.op("Mul", inner, c.const(K)))
    return c.op("Mul", half, c.op("Add", t, c.const(1.0)), out="y")


def torch_tanh_gelu(c: Chain) -> str:
    """torch's TorchScript export of ``gelu(x, approximate="tanh")``: the cube as ``x * (x * x)``, constants first."""
    cube = c.op("Mul", "x", c.op("Mul", "x", "x"))
    inner = c.op("Mul", c.const(K), c.op("Add", "x", c.op("Mul", c.const(0.044715), cube)))
    return c.op("Mul", c.const(0.5), c.op("Mul", "x", c.op("Add", c.const(1.0), c.op("Tanh", inner))), out="y")


def fast_gelu(c: Chain) -> str:
    """Hugging Face's ``0.5 * x * (1 + tanh(x * 0.7978845608 * (1 + 0.044715 * x * x)))``."""
    poly = c.op("Add", c.const(1.0), c.op("Mul", c.op("Mul", c.const(0.044715), "x"), "x"))
    t = c.op("Tanh", c.op("Mul", c.op("Mul", "x", c.const(0.7978845608)), poly))
    return c.op("Mul", c.op("Mul", c.const(0.5), "x"), c.op("Add", c.const(1.0), t), out="y")


def erf_gelu(c: Chain) -> str:
    """torch's export of ``gelu(x)``: ``x * (1 + erf(x / sqrt 2)) * 0.5``."""
    cdf = c.op("Add", c.op("Erf", c.op("Div", "x", c.const(math.sqrt(2.0)))), c.const(1.0))
    return c.op("Mul", c.op("Mul", "x", cdf), c.const(0.5), out="y")


def silu(c: Chain) -> str:
    return c.op("Mul", "x", c.op("Sigmoid", "x"), out="y")


def quick_gelu(c: Chain) -> str:
    return c.op("Mul", "x", c.op("Sigmoid", c.op("Mul", "x", c.const(1.702))), out="y")


#: ``(form, activation)``: the chain and the activation it computes.
FORMS: dict[str, tuple[Callable[[Chain], str], str]] = {
    "gpt2": (gpt2_gelu, "tanh"),
    "torch-tanh": (torch_tanh_gelu, "tanh"),
    "hf-fast": (fast_gelu, "tanh"),
    "torch-erf": (erf_gelu, "erf"),
    "silu": (silu, "silu"),
    "quick-gelu": (quick_gelu, "quick"),
}


def chain_model(
    form: Callable[[Chain], str], elem_type: int = DOUBLE, *, initializers: bool = False, also_output: bool = False
) -> tuple[onnx.ModelProto, list[str]]:
    """``loss = sum(w * form(x))``, and the names of the chain's inner values; ``also_output``: the chain's
    first inner value is a graph output too (read elsewhere, so the chain is differentiated node by node)."""
    c = Chain(elem_type, initializers)
    form(c)
    inner = [n.output[0] for n in c.nodes if n.op_type != "Constant" and n.output[0] != "y"]
    nodes = [
        *c.nodes,
        helper.make_node("Mul", ["y", "w"], ["p"]),
        helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0),
    ]
    outputs: dict[str, tuple[int, list[int | str] | None]] = {"loss": (elem_type, [])}
    if also_output:
        outputs[inner[0]] = (elem_type, None)
    inputs = {"x": (elem_type, ["n"]), "w": (elem_type, ["n"])}
    return make_model(inputs, nodes, outputs, c.initializers), inner


def with_gradient(model: onnx.ModelProto, wrt: Sequence[str] = ("x",)) -> tuple[onnx.ModelProto, list[onnx.NodeProto]]:
    """``model`` with ``d loss / d v`` for each ``v`` of ``wrt`` as its last outputs, and the gradient's nodes."""
    builder = GraphBuilder(model)
    before = len(builder.model.graph.node)
    grads = build_gradients(builder, "loss", list(wrt))
    for name in wrt:
        builder.model.graph.output.append(helper.make_tensor_value_info(grads[name], builder.elem_type(name), None))
    return builder.model, list(builder.model.graph.node[before:])


class Erf(OpRunUnaryNum):
    """``Erf`` in float64: onnx's reference computes it in float32, too coarse for finite differences."""

    def _run(self, x: np.ndarray) -> tuple[np.ndarray]:
        return (erf(x).astype(x.dtype),)


def evaluate(model: onnx.ModelProto, x: np.ndarray, w: np.ndarray) -> tuple[float, np.ndarray]:
    """The loss and the gradient, in float64 by onnx's reference evaluator."""
    outputs = ReferenceEvaluator(model, new_ops=[Erf]).run(None, {"x": x, "w": w})
    return float(outputs[0]), outputs[-1]


@pytest.mark.parametrize("name", list(FORMS))
@given(x=hnp.arrays(np.float64, st.integers(1, 6), elements=st.floats(-7.0, 7.0)), seed=st.integers(0, 2**16))
@settings(max_examples=15, deadline=None)
def test_chain_gradient_matches_finite_differences(name: str, x: np.ndarray, seed: int) -> None:
    form, activation = FORMS[name]
    model, _ = with_gradient(chain_model(form)[0])
    rng = np.random.default_rng(seed)
    w, t = rng.normal(size=x.shape), rng.normal(size=x.shape)
    _, grad = evaluate(model, x, w)
    h = 1e-5
    numeric = (evaluate(model, x + h * t, w)[0] - evaluate(model, x - h * t, w)[0]) / (2 * h)
    np.testing.assert_allclose(float(np.dot(grad, t)), numeric, rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(grad, w * DERIVATIVES[activation](x), rtol=1e-9, atol=1e-12)


#: The nodes of each form's gradient, less the loss's three (Shape, Expand, Mul): GPT-2's 13 replace 12 that read
#: four of the chain's values, which the forward keeps or the backward computes again (7 more nodes).
NODES = {"gpt2": 13, "torch-tanh": 12, "hf-fast": 13, "torch-erf": 11, "silu": 4, "quick-gelu": 7}
#: Forms whose derivative computes a value the chain has (the sigmoid, ``x * x``), shared with it, not made twice.
SHARES_A_VALUE = {"torch-tanh", "silu"}


@pytest.mark.parametrize("initializers", [False, True], ids=["constant-nodes", "initializers"])
@pytest.mark.parametrize("name", list(FORMS))
def test_chain_is_differentiated_as_one_function(name: str, initializers: bool) -> None:
    """The gradient is the activation's own derivative, of :data:`NODES` nodes, reading the chain's input and
    output (and a sigmoid it shares with the chain), and equals the node-by-node gradient of the same chain (one
    of whose inner values is also a graph output: so differentiated node by node)."""
    form, _ = FORMS[name]
    fused, inner = chain_model(form, initializers=initializers)
    fused, fused_nodes = with_gradient(fused)
    unfused, unfused_nodes = with_gradient(chain_model(form, initializers=initializers, also_output=True)[0])
    assert len(fused_nodes) - 3 == NODES[name]
    read = {name for node in fused_nodes for name in node.input} & set(inner)
    assert bool(read) == (name in SHARES_A_VALUE), f"the gradient reads the chain's values {sorted(read)}"
    assert {name for node in unfused_nodes for name in node.input} & set(inner), "the fallback was fused"
    x = np.linspace(-6.0, 6.0, 25)
    w = np.cos(np.arange(25.0))
    # equal to the rounding of the exported constants (Hugging Face's 0.7978845608 for sqrt(2 / pi): 3e-12)
    np.testing.assert_allclose(evaluate(fused, x, w)[1], evaluate(unfused, x, w)[1], rtol=1e-10, atol=1e-14)


def test_float32_in_onnxruntime() -> None:
    """GPT-2's chain in float32, run by onnxruntime's CPU kernels: the gradient is ``f'(x) w`` within 5e-6.

    Measured at 1,601 points of [-8, 8]: at most 3.5e-6 from the float64 derivative (at x = 5.1, where the
    sigmoid's absolute error, about 1e-7 in onnxruntime's CPU kernel, is multiplied by ``x (a + 3 b x^2)``),
    against 2.4e-6 node by node and 1.0e-6 for PyTorch's ``gelu_backward``; 0 where ``x < -5.3`` and the
    derivative is below 4e-7, as PyTorch's is.
    """
    model, _ = with_gradient(chain_model(gpt2_gelu, TensorProto.FLOAT)[0])
    x = np.linspace(-8.0, 8.0, 1601, dtype=np.float32)
    w = np.ones_like(x)
    grad = run_model(model, {"x": x, "w": w})[-1]
    np.testing.assert_allclose(grad, DERIVATIVES["tanh"](x.astype(np.float64)), rtol=0, atol=5e-6)


@pytest.mark.parametrize(
    "case",
    ["other-constant", "several-elements", "erf-as-tanh"],
)
def test_chains_left_to_the_node_rules(case: str) -> None:
    """A GELU with another constant (0.0447 for 0.044715), a constant of several elements, and a tanh chain
    evaluated against the erf form: differentiated node by node, and correctly."""
    if case == "other-constant":
        model, inner = chain_model(lambda c: gpt2_gelu(c, kappa=0.0447))
        derivative = lambda x: (  # noqa: E731
            0.5 * (1 + np.tanh(K * (x + 0.0447 * x**3)))
            + 0.5 * x * (1 - np.tanh(K * (x + 0.0447 * x**3)) ** 2) * K * (1 + 3 * 0.0447 * x**2)
        )
    elif case == "several-elements":  # SiLU with its sigmoid's input scaled by ones, one per element
        model, inner = chain_model(
            lambda c: c.op("Mul", "x", c.op("Sigmoid", c.op("Mul", "x", c.const(np.ones(5)))), out="y")
        )
        derivative = DERIVATIVES["silu"]
    else:  # the tanh GELU is no erf GELU: recognised as itself, with the tanh form's derivative
        model, inner = chain_model(gpt2_gelu)
        derivative = DERIVATIVES["tanh"]
    model, nodes = with_gradient(model)
    read = {name for node in nodes for name in node.input}
    fused = not read & set(inner)
    assert fused == (case == "erf-as-tanh"), case
    if fused:
        assert "Erf" not in {n.op_type for n in nodes}
    x = np.linspace(-5.0, 5.0, 5)
    np.testing.assert_allclose(evaluate(model, x, np.ones(5))[1], derivative(x), rtol=1e-9, atol=1e-12)


def test_chain_after_a_scaling() -> None:
    """``gelu(2 z)``: the chain starts at ``2 z``, whose own node is differentiated as usual."""
    c = Chain(DOUBLE, initializers=False)
    gpt2_gelu(c)
    nodes = [helper.make_node("Mul", ["z", "two"], ["x"]), *c.nodes]
    nodes += [helper.make_node("Mul", ["y", "w"], ["p"]), helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0)]
    model = make_model(
        {"z": (DOUBLE, [4]), "w": (DOUBLE, [4])}, nodes, {"loss": (DOUBLE, [])}, [("two", np.array(2.0))]
    )
    model, _ = with_gradient(model, ["z"])
    z = np.array([-1.5, -0.2, 0.3, 2.5])
    grad = ReferenceEvaluator(model, new_ops=[Erf]).run(None, {"z": z, "w": np.ones(4)})[-1]
    np.testing.assert_allclose(grad, 2.0 * DERIVATIVES["tanh"](2.0 * z), rtol=1e-10)


@pytest.mark.parametrize("name", ["gpt2", "torch-erf"])
def test_output_read_by_a_product_before_the_chain(name: str) -> None:
    """``loss = sum(W^T gelu(x))``: the product's weight gradient reads the chain's output, the GELU's gradient
    its input alone; both as computed in float64."""
    c = Chain(DOUBLE, initializers=False)
    FORMS[name][0](c)
    nodes = [*c.nodes, helper.make_node("MatMul", ["y", "W"], ["p"]), helper.make_node("ReduceSum", ["p"], ["loss"])]
    model = make_model({"x": (DOUBLE, ["n", 3]), "W": (DOUBLE, [3, 2])}, nodes, {"loss": (DOUBLE, [1, 1])}, opset=17)
    model, _ = with_gradient(model, ["x", "W"])
    x = np.linspace(-3.0, 3.0, 12).reshape(4, 3)
    W = np.arange(6.0).reshape(3, 2) / 6.0
    dx, dW = ReferenceEvaluator(model, new_ops=[Erf]).run(None, {"x": x, "W": W})[-2:]
    activation = FORMS[name][1]
    y = x * (sigmoid(2 * K * (x + 0.044715 * x**3)) if activation == "tanh" else 0.5 * (1 + erf(x / math.sqrt(2))))
    np.testing.assert_allclose(dW, y.T @ np.ones((4, 2)), rtol=1e-10)
    np.testing.assert_allclose(dx, np.ones((4, 2)) @ W.T * DERIVATIVES[activation](x), rtol=1e-9, atol=1e-12)


TORCH_ACTIVATIONS = ("gelu", "gelu-tanh", "gpt2-new-gelu", "bloom-gelu", "silu")


def _torch_activation(name: str) -> Any:
    import torch

    if name == "gelu":
        return torch.nn.GELU()
    if name == "gelu-tanh":
        return torch.nn.GELU(approximate="tanh")
    if name == "silu":
        return torch.nn.SiLU()
    transformers = pytest.importorskip("transformers")
    if name == "gpt2-new-gelu":
        return transformers.activations.NewGELUActivation()

    class BloomGelu(torch.nn.Module):  # transformers' bloom_gelu_forward, written out
        def forward(self, x: Any) -> Any:
            return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    return BloomGelu()


@pytest.mark.parametrize("name", TORCH_ACTIVATIONS)
def test_torchs_exports_are_recognised(name: str) -> None:
    """The chains torch's TorchScript exporter writes (opset 17) are differentiated as one function, and the
    gradient is torch's: ``nn.GELU`` in both forms, transformers' ``NewGELUActivation`` (GPT-2), BLOOM's GELU
    (its constant 0.79788456 rounded to eight digits), ``nn.SiLU``."""
    torch = pytest.importorskip("torch")
    activation = _torch_activation(name)
    x = torch.linspace(-6.0, 6.0, 97, dtype=torch.float32).reshape(1, 97)
    model = export_for_training(activation, (x,), ["x"], ["y"], opset=17)
    chain = [n.output[0] for n in model.graph.node if n.op_type != "Constant" and n.output[0] != "y"]
    model.graph.node.extend(
        [helper.make_node("Mul", ["y", "w"], ["p"]), helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0)]
    )
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [1, 97]))
    model.graph.output.insert(0, helper.make_tensor_value_info("loss", TensorProto.FLOAT, []))
    builder = GraphBuilder(model)
    before = len(builder.model.graph.node)
    grads = build_gradients(builder, "loss", ["x"])
    read = {v for node in builder.model.graph.node[before:] for v in node.input} & set(chain)
    # values the derivative computes as the chain does, shared with it: sigmoid(x), x * x
    shared = {
        n.output[0]
        for n in builder.model.graph.node[:before]
        if n.op_type in ("Sigmoid", "Mul") and set(n.input) == {"x"}
    }
    assert read <= shared, f"{name}: the gradient reads the chain's values {sorted(read - shared)}"
    builder.model.graph.output.append(helper.make_tensor_value_info(grads["x"], TensorProto.FLOAT, None))
    w = np.cos(np.arange(97.0, dtype=np.float32)).reshape(1, 97)
    grad = run_model(builder.model, {"x": x.numpy(), "w": w})[-1]
    xt = x.clone().requires_grad_(True)
    (activation(xt) * torch.from_numpy(w)).sum().backward()
    np.testing.assert_allclose(grad, xt.grad.numpy(), rtol=0, atol=5e-6)


def test_a_chain_through_casts_and_a_dead_reader() -> None:
    """GPT-2's GELU with ``x^3`` computed in float64 between two casts (as half precision's autocast computes it
    in the half type), and a link also read by a node whose output the loss ignores: one function still, its
    gradient in the wider type of the input and the output, cast to the input's."""
    c = Chain(TensorProto.FLOAT, initializers=False)
    wide = c.op("Cast", "x")
    c.nodes[-1].attribute.append(helper.make_attribute("to", DOUBLE))
    cube = c.op("Cast", c.op("Mul", wide, c.op("Mul", wide, wide)))
    c.nodes[-1].attribute.append(helper.make_attribute("to", TensorProto.FLOAT))
    half = c.op("Mul", "x", c.const(0.5))
    inner = c.op("Add", "x", c.op("Mul", cube, c.const(0.044715)))
    t = c.op("Tanh", c.op("Mul", inner, c.const(K)))
    c.op("Mul", half, c.op("Add", t, c.const(1.0)), out="y")
    dead = helper.make_node("Neg", [t], ["unused"])
    nodes = [
        *c.nodes,
        dead,
        helper.make_node("Mul", ["y", "w"], ["p"]),
        helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0),
    ]
    model = make_model(
        {"x": (TensorProto.FLOAT, [9]), "w": (TensorProto.FLOAT, [9])}, nodes, {"loss": (TensorProto.FLOAT, [])}
    )
    model, backward = with_gradient(model)
    chain = {n.output[0] for n in c.nodes if n.op_type != "Constant"} - {"y"}
    assert not {v for node in backward for v in node.input} & chain
    x = np.linspace(-4.0, 4.0, 9, dtype=np.float32)
    grad = run_model(model, {"x": x, "w": np.ones(9, np.float32)})[-1]
    np.testing.assert_allclose(grad, DERIVATIVES["tanh"](x.astype(np.float64)), rtol=0, atol=5e-6)


def test_a_trainable_scale_inside_a_chain_is_no_constant() -> None:
    """Swish ``x * sigmoid(beta x)`` with ``beta`` an initializer of one element, equal to 1 and differentiated:
    not SiLU, whose rule would give ``beta`` no gradient."""
    nodes = [
        helper.make_node("Mul", ["beta", "x"], ["bx"]),
        helper.make_node("Sigmoid", ["bx"], ["s"]),
        helper.make_node("Mul", ["x", "s"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    model = make_model({"x": (DOUBLE, [5])}, nodes, {"loss": (DOUBLE, [])}, [("beta", np.array(1.0))])
    model, _ = with_gradient(model, ["x", "beta"])
    x = np.linspace(-2.0, 2.0, 5)
    dx, dbeta = ReferenceEvaluator(model).run(None, {"x": x})[-2:]
    s = sigmoid(x)
    np.testing.assert_allclose(dbeta, np.sum(x * x * s * (1 - s)), rtol=1e-12)
    np.testing.assert_allclose(dx, DERIVATIVES["silu"](x), rtol=1e-12)


@pytest.mark.parametrize("name", ["silu", "torch-erf"])
def test_a_chain_whose_output_is_narrower_than_its_input(name: str) -> None:
    """``x`` float32, the chain's last product in float16: the derivative is computed in float32 (the output read
    in float32), cast to ``x``'s type."""
    c = Chain(TensorProto.FLOAT, initializers=False)
    FORMS[name][0](c)
    last = c.nodes.pop()  # the product into y, made in float16 instead
    half = TensorProto.FLOAT16
    c.nodes += [
        helper.make_node("Cast", [last.input[0]], ["a16"], to=half),
        helper.make_node("Cast", [last.input[1]], ["b16"], to=half),
        helper.make_node(last.op_type, ["a16", "b16"], ["y"]),
        helper.make_node("Cast", ["y"], ["y32"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["y32"], ["loss"], keepdims=0),
    ]
    model = make_model({"x": (TensorProto.FLOAT, [8])}, c.nodes, {"loss": (TensorProto.FLOAT, [])}, c.initializers)
    model, _ = with_gradient(model)
    x = np.linspace(-3.0, 3.0, 8, dtype=np.float32)
    grad = ReferenceEvaluator(model, new_ops=[Erf]).run(None, {"x": x})[-1]
    np.testing.assert_allclose(grad, DERIVATIVES[FORMS[name][1]](x.astype(np.float64)), rtol=2e-3, atol=2e-3)


def test_the_chain_search_stays_bounded_on_a_deep_element_wise_graph() -> None:
    """600 layers of ``h = tanh(h) * w``: every ``Mul``'s search for a chain stops after a few nodes (it recursed
    through every layer above: RecursionError at 600, quadratic time below)."""
    nodes, layers = [], 600
    for i in range(layers):
        nodes += [
            helper.make_node("Tanh", [f"h{i}"], [f"t{i}"]),
            helper.make_node("Mul", [f"t{i}", "w"], [f"h{i + 1}"]),
        ]
    nodes.append(helper.make_node("ReduceSum", [f"h{layers}"], ["loss"], keepdims=0))
    model = make_model({"h0": (DOUBLE, [3])}, nodes, {"loss": (DOUBLE, [])}, [("w", np.array([0.9, 1.1, 1.0]))])
    grads = build_gradients(GraphBuilder(model), "loss", ["w", "h0"])
    assert set(grads) == {"w", "h0"}


def test_a_maximum_over_the_output_compares_the_forward_values() -> None:
    """``ReduceMax`` over GELU's rows masks its gradient with ``Equal(y, max)``: the mask reads the forward's ``y``
    (a copy of it, equal only to rounding, made 152 of 512 rows NaN in float32)."""
    c = Chain(TensorProto.FLOAT, initializers=False)
    gpt2_gelu(c)
    nodes = [*c.nodes, helper.make_node("ReduceMax", ["y"], ["m"], axes=[1], keepdims=0)]
    nodes.append(helper.make_node("ReduceSum", ["m"], ["loss"], keepdims=0))
    model = make_model({"x": (TensorProto.FLOAT, [512, 8])}, nodes, {"loss": (TensorProto.FLOAT, [])}, c.initializers)
    model, _ = with_gradient(model)
    x = np.random.default_rng(0).normal(size=(512, 8)).astype(np.float32)
    grad = run_model(model, {"x": x})[-1]
    assert np.isfinite(grad).all()
    rows = np.arange(512)
    top = np.argmax(0.5 * x * (1 + np.tanh(K * (x + 0.044715 * x**3))), axis=1)
    want = np.zeros_like(grad)
    want[rows, top] = DERIVATIVES["tanh"](x[rows, top].astype(np.float64))
    np.testing.assert_allclose(grad, want, rtol=0, atol=5e-6)
