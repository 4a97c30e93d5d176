"""TrainingBlock: the training and eval models, their interfaces, and bad input."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import onnxtrain.onnxblock as onnxblock
from onnxtrain.autodiff import MissingGradientError
from tests.helpers import DOUBLE, make_model, run_model

RNG = np.random.default_rng(0)
W = RNG.normal(size=(4,))
B = RNG.normal(size=(4,))
SCALE = np.abs(RNG.normal(size=(4,))) + 0.5


def _base(with_dropout: bool = False, ratio: float = 0.25) -> onnx.ModelProto:
    """y = tanh(x * W + B) * SCALE (SCALE frozen), optionally through a Dropout of ``ratio`` in training mode."""
    nodes = [
        helper.make_node("Mul", ["x", "W"], ["h0"]),
        helper.make_node("Add", ["h0", "B"], ["h"]),
        helper.make_node("Tanh", ["h"], ["t"]),
        helper.make_node("Mul", ["t", "SCALE"], ["y"]),
    ]
    initializers = [("W", W), ("B", B), ("SCALE", SCALE), ("step", np.array([3], dtype=np.int64))]
    if with_dropout:
        nodes.append(helper.make_node("Dropout", ["y", "ratio", "training"], ["y_dropped"]))
        initializers += [("ratio", np.array(ratio)), ("training", np.array(True))]
    outputs = {"y": (DOUBLE, ["batch", 4])}
    if with_dropout:
        outputs["y_dropped"] = (DOUBLE, ["batch", 4])
    return make_model({"x": (DOUBLE, ["batch", 4])}, nodes, outputs, initializers)


class MSETraining(onnxblock.TrainingBlock):
    def __init__(self) -> None:
        super().__init__()
        self.loss = onnxblock.loss.MSELoss()

    def build(self, output_name: str) -> tuple[str, str]:
        return self.loss(output_name), output_name


def _built(model: onnx.ModelProto, output: str = "y") -> MSETraining:
    block = MSETraining()
    block.requires_grad("W")
    block.requires_grad("B")
    block.requires_grad("SCALE", False)
    with onnxblock.base(model):
        block(output)
    return block


def _oracle(x: np.ndarray, target: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    t = np.tanh(x * W + B)
    y = t * SCALE
    d = 2 * (y - target) / y.size * SCALE * (1 - t**2)
    return float(((y - target) ** 2).mean()), (d * x).sum(0), d.sum(0)


def test_training_model_interface_and_gradients() -> None:
    """ONNX Runtime's interface: buffers and the reset flag in, accumulated gradients out, in standard operators."""
    block = _built(_base())
    training, eval_model = block.to_model_proto()
    buffers = ["W_grad.accumulation.buffer", "B_grad.accumulation.buffer"]
    assert [i.name for i in training.graph.input] == ["x", "target", "W", "B", "SCALE", *buffers, "lazy_reset_grad"]
    assert [o.name for o in training.graph.output][1:] == [
        "y", "W_grad.accumulation.out", "B_grad.accumulation.out"
    ]  # fmt: skip
    assert [i.name for i in eval_model.graph.input] == ["x", "target", "W", "B", "SCALE"]
    assert [o.name for o in eval_model.graph.output][1:] == ["y"]
    assert {t.name for t in training.graph.initializer}.isdisjoint({"W", "B", "SCALE"})
    assert all(node.domain in ("", "ai.onnx") for node in training.graph.node)
    plain = block.gradient_models.training
    assert [i.name for i in plain.graph.input] == ["x", "target", "W", "B", "SCALE"]
    assert [o.name for o in plain.graph.output][1:] == ["y", "W_grad", "B_grad"]
    trainable, frozen = block.parameters()
    assert [t.name for t in trainable] == ["W", "B"]
    assert [t.name for t in frozen] == ["SCALE"]
    np.testing.assert_array_equal(numpy_helper.to_array(trainable[0]), W)

    for batch in (1, 7, 64):
        x = RNG.normal(size=(batch, 4))
        target = RNG.normal(size=(batch, 4))
        feeds = {"x": x, "target": target, "W": W, "B": B, "SCALE": SCALE}
        reset = {name: np.full(4, np.nan) for name in buffers} | {"lazy_reset_grad": np.array([True])}
        loss, y, grad_w, grad_b = run_model(training, feeds | reset)  # a reset never reads the buffers
        want_loss, want_w, want_b = _oracle(x, target)
        np.testing.assert_allclose(loss, want_loss, rtol=1e-12)
        np.testing.assert_allclose(grad_w, want_w, rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(grad_b, want_b, rtol=1e-10, atol=1e-14)
        held = {buffers[0]: np.full(4, 0.5), buffers[1]: np.arange(4.0), "lazy_reset_grad": np.array([False])}
        _, _, sum_w, sum_b = run_model(training, feeds | held)
        np.testing.assert_allclose(sum_w, 0.5 + want_w, rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(sum_b, np.arange(4.0) + want_b, rtol=1e-10, atol=1e-14)
        _, _, plain_w, plain_b = run_model(plain, feeds)
        np.testing.assert_allclose(plain_w, grad_w, rtol=1e-14)
        np.testing.assert_allclose(plain_b, grad_b, rtol=1e-14)
        eval_loss, eval_y = run_model(eval_model, feeds)
        np.testing.assert_allclose(eval_loss, loss, rtol=1e-12)
        np.testing.assert_allclose(eval_y, y, rtol=1e-12)


def test_a_graph_input_marked_requires_grad_gets_its_gradient_accumulated() -> None:
    """``requires_grad("x")`` on a graph input: ``x_grad.accumulation.buffer`` in, ``.out`` out, before the
    parameters' (ONNX Runtime's order); the value is dL/dx of the oracle."""
    block = MSETraining()
    block.requires_grad("x")
    block.requires_grad("W")
    with onnxblock.base(_base()):
        block("y")
    training, _ = block.to_model_proto()
    assert [t.name for t in block.parameters()[0]] == ["W"]
    inputs = [i.name for i in training.graph.input]
    assert inputs[-3:] == ["x_grad.accumulation.buffer", "W_grad.accumulation.buffer", "lazy_reset_grad"]
    outputs = [o.name for o in training.graph.output]
    assert outputs[-2:] == ["x_grad.accumulation.out", "W_grad.accumulation.out"]
    x, target = RNG.normal(size=(3, 4)), RNG.normal(size=(3, 4))
    feeds = {"x": x, "target": target, "W": W, "lazy_reset_grad": np.array([False])}  # B, SCALE: initializers
    feeds |= {"x_grad.accumulation.buffer": np.ones((3, 4)), "W_grad.accumulation.buffer": np.zeros(4)}
    results = dict(zip(outputs, run_model(training, feeds), strict=True))
    t = np.tanh(x * W + B)
    d = 2 * (t * SCALE - target) / x.size * SCALE * (1 - t**2)
    np.testing.assert_allclose(results["x_grad.accumulation.out"], 1.0 + d * W, rtol=1e-10)
    np.testing.assert_allclose(results["W_grad.accumulation.out"], (d * x).sum(0), rtol=1e-10)


def test_requires_grad_on_an_integer_input_lists_the_float_inputs() -> None:
    nodes = [helper.make_node("Cast", ["n"], ["nf"], to=onnx.TensorProto.DOUBLE),
             helper.make_node("Mul", ["nf", "W"], ["y"])]  # fmt: skip
    model = make_model(
        {"n": (onnx.TensorProto.INT64, [4]), "x": (DOUBLE, [4])}, nodes, {"y": (DOUBLE, [4])}, [("W", W)]
    )
    block = MSETraining()
    block.requires_grad("n")
    with onnxblock.base(model), pytest.raises(ValueError, match=r"'n'.*float graph inputs: \['x', 'target'\]"):
        block("y")


def test_eval_model_switches_dropout_to_inference_mode() -> None:
    """A Dropout output reported beside the loss: training mode in training, inference mode in eval."""

    class WithExtraOutput(onnxblock.TrainingBlock):
        def build(self, output: str, extra: str) -> tuple[str, str]:
            return onnxblock.loss.MSELoss()(output), extra

    block = WithExtraOutput()
    block.requires_grad("W")
    with onnxblock.base(_base(with_dropout=True)):
        block("y", "y_dropped")
    training, eval_model = block.to_model_proto()
    (train_dropout,) = [n for n in training.graph.node if n.op_type == "Dropout"]
    (eval_dropout,) = [n for n in eval_model.graph.node if n.op_type == "Dropout"]
    assert train_dropout.input[2] == "training"
    assert len(eval_dropout.input) < 3 or eval_dropout.input[2] == ""


def test_a_dropout_that_drops_nothing_is_an_identity_in_the_training_model() -> None:
    """Ratio 0 in training mode outputs its input: no copy, no mask kept for the backward (graph.passes.identities)."""

    class WithExtraOutput(onnxblock.TrainingBlock):
        def build(self, output: str, extra: str) -> tuple[str, str]:
            return onnxblock.loss.MSELoss()(output), extra

    block = WithExtraOutput()
    block.requires_grad("W")
    with onnxblock.base(_base(with_dropout=True, ratio=0.0)):
        block("y", "y_dropped")
    training, _ = block.to_model_proto()
    assert "Dropout" not in {n.op_type for n in training.graph.node}
    (identity,) = [n for n in training.graph.node if n.output[0] == "y_dropped"]
    assert identity.op_type == "Identity" and list(identity.input) == ["y"]


def test_batchnorm_running_statistics_are_training_outputs() -> None:
    """Training-mode BatchNormalization feeds a trainable scale; its running stats come out as `.updated`."""
    channels = 3
    mean, var = np.zeros(channels), np.ones(channels)
    nodes = [
        helper.make_node(
            "BatchNormalization", ["x", "gamma", "beta", "mean", "var"], ["n"], training_mode=1, momentum=0.9
        ),
        helper.make_node("Mul", ["n", "w"], ["y"]),
    ]
    initializers = [
        ("gamma", np.ones(channels)),
        ("beta", np.zeros(channels)),
        ("mean", mean),
        ("var", var),
        ("w", np.full((channels, 1, 1), 2.0)),
    ]
    model = make_model({"x": (DOUBLE, ["batch", channels, 2, 2])}, nodes, {"y": (DOUBLE, None)}, initializers, opset=15)

    class Training(onnxblock.TrainingBlock):
        def build(self, output: str) -> str:
            return onnxblock.loss.MSELoss()(output)

    block = Training()
    block.requires_grad("w")
    for name in ("gamma", "beta", "mean", "var"):
        block.requires_grad(name, False)
    with onnxblock.base(model):
        block("y")
    training, eval_model = block.to_model_proto()
    outputs = [o.name for o in training.graph.output]
    assert outputs[-3:] == ["w_grad.accumulation.out", "mean.updated", "var.updated"]
    assert block.running_stats == {"mean": "mean.updated", "var": "var.updated"}
    (eval_bn,) = [n for n in eval_model.graph.node if n.op_type == "BatchNormalization"]
    assert list(eval_bn.output) == ["n"]
    assert helper.get_attribute_value(next(a for a in eval_bn.attribute if a.name == "training_mode")) == 0

    x = RNG.normal(loc=1.5, size=(5, channels, 2, 2))
    feeds = {"x": x, "target": RNG.normal(size=(5, channels, 2, 2))}
    feeds.update({name: value for name, value in initializers})
    feeds.update({"w_grad.accumulation.buffer": np.zeros((channels, 1, 1)), "lazy_reset_grad": np.array([True])})
    results = dict(zip(outputs, run_model(training, feeds), strict=True))
    batch_mean = x.mean(axis=(0, 2, 3))
    # onnxruntime accumulates the batch statistics in lower precision: 1e-6 is its own accuracy.
    np.testing.assert_allclose(results["mean.updated"], 0.9 * mean + 0.1 * batch_mean, rtol=1e-6)
    batch_var = x.var(axis=(0, 2, 3))  # ONNX's running variance uses the biased batch variance
    np.testing.assert_allclose(results["var.updated"], 0.9 * var + 0.1 * batch_var, rtol=1e-6)


def test_parameters_before_build_and_models_before_build_raise() -> None:
    block = MSETraining()
    with pytest.raises(RuntimeError, match="has not been built"):
        block.parameters()
    with pytest.raises(RuntimeError, match="has not been built"):
        block.to_model_proto()


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nope", r"not an initializer.*the 3 known: 'W', 'B', 'SCALE'"),
        ("step", r"is int64.*the 3 known: 'W', 'B', 'SCALE'"),
    ],
)
def test_bad_requires_grad_names_list_the_candidates(name: str, message: str) -> None:
    model = _base()
    block = MSETraining()
    block.requires_grad(name)
    with onnxblock.base(model) as base:
        before = base.model.SerializeToString()
        with pytest.raises(ValueError, match=message):
            block("y")
        assert base.model.SerializeToString() == before


def test_missing_rule_on_the_path_names_operator_and_path() -> None:
    """A custom operator between a parameter and the loss, with no rule registered for it."""
    nodes = [
        helper.make_node("Mul", ["x", "W"], ["h"]),
        helper.make_node("Twist", ["h"], ["y"], domain="my.domain"),
    ]
    model = make_model(
        {"x": (DOUBLE, ["batch", 4])},
        nodes,
        {"y": (DOUBLE, ["batch", 4])},
        [("W", W)],
        extra_opsets={"my.domain": 1},
    )
    block = MSETraining()
    block.requires_grad("W")
    with onnxblock.base(model), pytest.raises(MissingGradientError, match=r"Twist.*my\.domain.*'W' -> "):
        block("y")


def test_same_build_gives_identical_models() -> None:
    first = _built(_base()).to_model_proto()
    second = _built(_base()).to_model_proto()
    assert [m.SerializeToString() for m in first] == [m.SerializeToString() for m in second]
