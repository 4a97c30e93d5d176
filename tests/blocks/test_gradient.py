"""The ``Gradient`` block: derivatives of a network by its input, first and second order, against finite
differences in float64; zeros and a warning for a value the output does not depend on; errors."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper

import onnxtrain.onnxblock as onnxblock
from onnxtrain import autodiff, blocks
from onnxtrain.sessions import inference_session
from tests.autodiff.models import Runner
from tests.blocks import networks


class Outputs(onnxblock.ForwardBlock):
    """A forward block whose outputs are ``fn(output of the base model)``."""

    def __init__(self, fn: Callable[[str], Sequence[str]]) -> None:
        super().__init__()
        self.fn = fn

    def build(self, y: str) -> list[str]:
        return list(self.fn(y))


def evaluate(model: onnx.ModelProto, fn: Callable[[str], Sequence[str]]) -> Callable:
    """``x -> [outputs of fn]`` for ``fn`` built over ``model``'s output (in onnx.reference, with float64 Erf and
    Gelu, where onnxruntime has no float64 kernel: Softplus, Gelu, Erf)."""
    block = Outputs(fn)
    with onnxblock.base(model):
        block("y")
    runner = Runner(block.to_model_proto(), allow_reference=True)
    return lambda x: list(runner({"x": x}).values())


def derivatives(y: str) -> list[str]:
    """``y``, ``dy/dx`` (summed over y's columns) and ``d/dx sum(dy/dx)``."""
    first = blocks.Gradient(wrt="x")(y)
    return [y, first, blocks.Gradient(wrt="x")(first)]


@given(
    activation=st.sampled_from(networks.ACTIVATIONS),
    rows=st.integers(1, 5),
    features=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_first_and_second_derivatives_match_finite_differences(
    activation: str, rows: int, features: int, seed: int
) -> None:
    """Rows are independent, so column ``k`` of ``Gradient(wrt="x")(y)`` is ``d y_i / d x_ik`` row by row: each
    is checked against central differences of ``y``, and the second derivative against central differences of
    the first (float64, step 1e-5)."""
    model = networks.mlp([features, 6, 5, 1], activation=activation, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("error" if activation != "Relu" else "ignore")  # Relu's second derivative: zeros
        run = evaluate(model, derivatives)
    x = np.random.default_rng(seed).uniform(-1.5, 1.5, size=(rows, features))
    _, first, second = run(x)
    assert first.shape == second.shape == x.shape
    step = 1e-5
    for k in range(features):
        shift = np.zeros_like(x)
        shift[:, k] = step
        up, down = run(x + shift), run(x - shift)
        np.testing.assert_allclose(first[:, k], ((up[0] - down[0]) / (2 * step))[:, 0], rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(second[:, k], (up[1] - down[1]).sum(axis=1) / (2 * step), rtol=1e-5, atol=1e-7)


def test_symbolic_batch_dimensions_are_kept() -> None:
    """The gradient of an input ``[N, 2]`` is declared ``[N, 2]``, at any batch size."""
    block = Outputs(derivatives)
    with onnxblock.base(networks.mlp([2, 4, 1])):
        block("y")
    model = block.to_model_proto()
    declared = {value.name: value.type.tensor_type.shape.dim for value in model.graph.output}
    for name in list(declared)[1:]:
        assert [d.dim_param or d.dim_value for d in declared[name]] == ["N", 2]
    session = inference_session(model.SerializeToString())
    for rows in (1, 7):
        outputs = session.run(None, {"x": np.ones((rows, 2))})
        assert [o.shape for o in outputs] == [(rows, 1), (rows, 2), (rows, 2)]


def test_a_value_the_output_does_not_depend_on_gets_zeros_and_a_warning() -> None:
    model = networks.mlp([2, 3, 1])
    model.graph.input.append(helper.make_tensor_value_info("unused", TensorProto.DOUBLE, ["M", 4]))
    with pytest.warns(UserWarning, match=r"'y' does not depend on 'unused' .*; its gradient is zeros"):
        run = evaluate(model, lambda y: blocks.Gradient(wrt=["x", "unused"])(y))
    block = Outputs(lambda y: blocks.Gradient(wrt=["x", "unused"])(y))
    with warnings.catch_warnings(), onnxblock.base(model):
        warnings.simplefilter("ignore")
        block("y")
    session = inference_session(block.to_model_proto().SerializeToString())
    dx, zeros = session.run(None, {"x": np.ones((3, 2)), "unused": np.ones((5, 4))})
    assert dx.shape == (3, 2) and zeros.shape == (5, 4) and not zeros.any()
    assert callable(run)


def test_a_path_through_an_operator_without_a_rule_names_it() -> None:
    model = networks.mlp([2, 3, 1])
    model.graph.node[-1].output[0] = "before"
    model.graph.node.append(helper.make_node("Mystery", ["before"], ["y"], domain="example.custom"))
    model.opset_import.append(helper.make_opsetid("example.custom", 1))
    nodes = len(model.graph.node)
    with onnxblock.base(model), pytest.raises(autodiff.MissingGradientError, match=r"operator Mystery"):
        blocks.Gradient(wrt="x")("y")
    assert len(model.graph.node) == nodes  # the base model is left as it was


def test_bad_arguments_say_what_to_pass() -> None:
    with pytest.raises(TypeError, match=r"a value name or a non-empty list of names"):
        blocks.Gradient(wrt=[])
    with onnxblock.base(networks.mlp([2, 3, 1])), pytest.raises(ValueError, match=r"no such value"):
        blocks.Gradient(wrt="nothing")("y")
    with onnxblock.base(networks.mlp([2, 3, 1])), pytest.raises(ValueError, match=r"'nothing'"):
        blocks.Gradient(wrt="x")("nothing")


def test_a_gradient_in_a_loss_uses_the_training_blocks_rules() -> None:
    """``loss = sum(Gradient(wrt=x)(y)^2)`` for ``y = Cube(x * w)``, ``test.custom::Cube`` with a rule on a copy of
    the registry given to the TrainingBlock alone: the Gradient block differentiates with it too (it refused the
    custom operator), and ``d loss / d w = 54 x^4 w^5`` (``dy/dx = 3 x^2 w^3``)."""
    from onnx.reference import ReferenceEvaluator

    from tests.helpers import DOUBLE, make_model

    registry = autodiff.builtin_registry().copy()

    @registry.rule("Cube", domain="test.custom")
    def cube(ctx: autodiff.RuleContext, grads: Sequence[str | None]) -> list[str | None]:
        """dx = 3 g x^2"""
        (g,) = grads
        return [ctx.mul(ctx.mul(g, 3.0), ctx.square(ctx.inputs[0]))]

    nodes = [helper.make_node("Mul", ["x", "w"], ["t"]), helper.make_node("Cube", ["t"], ["y"], domain="test.custom")]
    model = make_model({"x": (DOUBLE, [3])}, nodes, {"y": (DOUBLE, [3])}, [("w", np.array([0.5, -1.5, 2.0]))])
    model.opset_import.append(helper.make_opsetid("test.custom", 1))

    class GradientPenalty(onnxblock.TrainingBlock):
        def build(self, y: str) -> str:
            dx = blocks.Gradient("x")(y)
            return blocks.ReduceSum(keepdims=False)(blocks.Mul()(dx, dx))

    block = GradientPenalty(registry=registry)
    block.requires_grad("w")
    with onnxblock.base(model):
        block("y")
    training = block.gradient_models.training
    for node in training.graph.node:  # Cube written out, for onnx's reference evaluator
        if node.op_type == "Cube":
            node.CopyFrom(helper.make_node("Pow", [node.input[0], "three"], list(node.output)))
    training.graph.initializer.append(onnx.numpy_helper.from_array(np.array(3.0), "three"))
    x, w = np.array([0.3, -1.2, 0.7]), np.array([0.5, -1.5, 2.0])
    outputs = ReferenceEvaluator(training).run(None, {"x": x, "w": w})
    np.testing.assert_allclose(outputs[0], np.sum(9 * x**4 * w**6), rtol=1e-12)
    np.testing.assert_allclose(outputs[-1], 54 * x**4 * w**5, rtol=1e-12)
