"""The function pass: the loss operators onnxruntime would replace by their bodies are written out in their place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

from onnxtrain import artifacts
from onnxtrain.graph.builder import GraphBuilder
from onnxtrain.graph.io import copy_model
from onnxtrain.graph.passes import expand_loss_functions
from onnxtrain.graph.passes.functions import function_inputs, written_out_from
from tests.helpers import FLOAT, make_model, run_model

INT64 = onnx.TensorProto.INT64


def _loss_model(op: str, *, rank: int, weighted: bool, opset: int, log_prob: bool, **attributes: Any):
    """``before = Exp(x)``; the loss ``op`` of ``x`` at ``labels`` (and weights); ``after = Neg(loss)``."""
    spatial = [3] * (rank - 2)
    inputs: dict[str, Any] = {"x": (FLOAT, [4, 5, *spatial]), "labels": (INT64, [4, *spatial])}
    if weighted:
        inputs["w"] = (FLOAT, [5])
    loss_outputs = ["loss", "log_prob"] if log_prob else ["loss"]
    nodes = [
        helper.make_node("Exp", ["x"], ["before"], name="first"),
        helper.make_node(op, list(inputs), loss_outputs, name="the_loss", **attributes),
        helper.make_node("Neg", ["loss"], ["after"], name="last"),
    ]
    outputs = ["before", "loss", "after", *(["log_prob"] if log_prob else [])]
    return make_model(inputs, nodes, outputs, opset=opset)


def _expanded(model: onnx.ModelProto) -> onnx.ModelProto:
    builder = GraphBuilder(copy_model(model))
    types = {name: builder.type_of(name) for name in function_inputs(model)}
    return expand_loss_functions(copy_model(model), type_of=types.get)


def _feeds(model: onnx.ModelProto, seed: int, ignored: int | None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.input}
    feeds = {"x": rng.normal(size=shapes["x"]).astype(np.float32)}
    labels = rng.integers(0, 5, size=shapes["labels"])
    if ignored is not None:
        labels[0] = ignored  # a row (or a first position) of ignored labels
    feeds["labels"] = labels.astype(np.int64)
    if "w" in shapes:
        feeds["w"] = rng.uniform(0.5, 2.0, size=shapes["w"]).astype(np.float32)
    return feeds


@given(
    op=st.sampled_from(["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"]),
    reduction=st.sampled_from(["mean", "sum", "none"]),
    rank=st.sampled_from([2, 3]),
    weighted=st.booleans(),
    ignore_index=st.sampled_from([None, 2, -100]),
    opset=st.sampled_from([13, 17, 18, 21]),
    log_prob=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_the_written_out_body_computes_what_onnxruntime_computes_for_the_loss_bit_for_bit(
    op: str, reduction: str, rank: int, weighted: bool, ignore_index: int | None, opset: int, log_prob: bool, seed: int
) -> None:
    log_prob = log_prob and op == "SoftmaxCrossEntropyLoss"  # NegativeLogLikelihoodLoss has one output
    attributes: dict[str, Any] = {"reduction": reduction}
    if ignore_index is not None:
        attributes["ignore_index"] = ignore_index
    model = _loss_model(op, rank=rank, weighted=weighted, opset=opset, log_prob=log_prob, **attributes)
    expanded = _expanded(model)
    onnx.checker.check_model(expanded, full_check=True)
    ops = [node.op_type for node in expanded.graph.node]
    assert op not in ops and ops[0] == "Exp" and ops[-1] == "Neg"  # the body in the loss's place
    body = expanded.graph.node[1:-1]
    assert {written_out_from(node) for node in body} == {f"{op} of 'loss', written out"}
    assert written_out_from(expanded.graph.node[0]) is None
    feeds = _feeds(model, seed, ignore_index)
    for got, want in zip(run_model(expanded, feeds), run_model(model, feeds), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_loss_whose_input_types_are_unknown_or_whose_body_does_not_check_is_left_as_it_is(monkeypatch) -> None:
    model = _loss_model("NegativeLogLikelihoodLoss", rank=2, weighted=False, opset=17, log_prob=False)
    unknown = expand_loss_functions(copy_model(model), type_of=lambda name: None)
    assert unknown.SerializeToString() == model.SerializeToString()

    def refuse(node: onnx.NodeProto, *args: Any) -> None:
        raise onnx.checker.ValidationError(f"{node.op_type} refused")

    monkeypatch.setattr(onnx.checker, "check_node", refuse)
    assert _expanded(model).SerializeToString() == model.SerializeToString()


def test_a_model_without_loss_functions_is_unchanged() -> None:
    model = make_model({"x": (FLOAT, [2])}, [helper.make_node("Neg", ["x"], ["y"])], ["y"])
    assert _expanded(model).SerializeToString() == model.SerializeToString()


def test_generated_training_models_run_the_loss_where_the_forward_computes_it(tmp_path: Path) -> None:
    """The training model's cross-entropy is written out before the first gradient node; the eval model keeps
    the operator (onnxruntime runs it as its body anyway, with nothing after it)."""
    from tests.training import models

    paths = models.generate(
        tmp_path / "ce",
        models.mlp((6, 8, 1100)),  # over SCATTERED_TARGET_CLASSES: the gradient scatters into the softmax
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
    )
    training = onnx.load(str(paths["training_model"]))
    nodes = list(training.graph.node)
    assert not any(node.op_type == "NegativeLogLikelihoodLoss" for node in nodes)
    body = [k for k, node in enumerate(nodes) if written_out_from(node)]
    (log_softmax,) = [k for k, node in enumerate(nodes) if node.op_type == "LogSoftmax"]
    readers = [k for k, node in enumerate(nodes) if nodes[log_softmax].output[0] in node.input]
    first_gradient = min(k for k, node in enumerate(nodes) if node.op_type == "Exp")
    assert body and log_softmax < min(body) and max(readers) == first_gradient  # nothing reads it after the Exp
    evaluation = onnx.load(str(paths["eval_model"]))
    assert [node.op_type for node in evaluation.graph.node].count("NegativeLogLikelihoodLoss") == 1


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
def test_names_of_the_body_are_fresh_and_its_outputs_the_nodes(op: str) -> None:
    model = _loss_model(op, rank=2, weighted=True, opset=17, log_prob=op == "SoftmaxCrossEntropyLoss")
    expanded = _expanded(model)
    produced = [name for node in expanded.graph.node for name in node.output]
    assert len(produced) == len(set(produced))  # every value written once
    original = {name for node in model.graph.node for name in node.output}
    assert original <= set(produced)  # the loss's outputs keep their names
    names = [node.name for node in expanded.graph.node]
    assert len(names) == len(set(names)) and all(n.startswith("the_loss/") for n in names[1:-1])
