"""fuse_update_and_train: one model equal to the optimizer model followed by the training model on reset gradients."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxtrain import checkpoint
from onnxtrain.artifacts import LossType, OptimType
from onnxtrain.artifacts.accumulation import LAZY_RESET_GRAD, buffer_name
from onnxtrain.artifacts.fuse import FusionError, fuse_update_and_train
from onnxtrain.optim.base import grad_name, state_name
from tests.artifacts.step_models import (
    CASES,
    constant_gradient_models,
    generate_case,
    run_model,
    trainable_of,
    user_feeds,
)
from tests.training import models


@pytest.mark.parametrize("case", list(CASES))
def test_the_fused_model_computes_the_optimizer_step_then_the_training_step(tmp_path, case):
    paths = generate_case(tmp_path, case)
    training, optimizer = onnx.load(paths["training_model"]), onnx.load(paths["optimizer_model"])
    trainable = trainable_of(training)
    fused = fuse_update_and_train(training, optimizer, trainable)
    onnx.checker.check_model(fused.model, full_check=True)
    assert not any(n.op_type == "Where" and n.output[0].endswith(".accumulation.out") for n in fused.model.graph.node)
    inputs = {i.name for i in fused.model.graph.input}
    assert LAZY_RESET_GRAD not in inputs and not any(name.endswith(buffer_name("")) for name in inputs)
    optimizer_nodes = len(optimizer.graph.node)
    assert [n.op_type for n in fused.model.graph.node[:optimizer_nodes]] == [n.op_type for n in optimizer.graph.node]

    rng = np.random.default_rng(0)
    params = {name: np.asarray(value) for name, value in checkpoint.load(paths["checkpoint"]).parameters.items()}
    user = user_feeds(training, params, rng)
    step = {"learning_rate": np.array([0.01], np.float32), "step": np.array([3], np.int64)}
    moments, grads = {}, {}
    for p in trainable:
        grads[grad_name(p)] = rng.normal(size=params[p].shape).astype(params[p].dtype)
        for i in range(3):
            if state_name(p, i) in {value.name for value in optimizer.graph.input}:
                moments[state_name(p, i)] = rng.uniform(0.1, 1.0, size=params[p].shape).astype(params[p].dtype)
    optimized = run_model(optimizer, {**params, **grads, **moments, **step})
    updated = {**params, **{p: optimized[f"{p}.updated"] for p in trainable}}
    # nonzero buffers: on a reset step they must be ignored, and the fused model has none
    buffers = {buffer_name(p): np.full_like(params[p], 7) for p in trainable}
    trained = run_model(training, {**updated, **user, **buffers, LAZY_RESET_GRAD: np.array([True])})
    fused_feeds = {**params, **user, **moments, **step}
    fused_feeds.update({fused.name_of(name): value for name, value in grads.items()})
    result = run_model(fused.model, fused_feeds)

    for name, value in trained.items():
        if name.endswith("_grad.accumulation.out"):
            param = name[: -len("_grad.accumulation.out")]
            np.testing.assert_array_equal(result[fused.gradients[param]], value, err_msg=name)
        else:
            np.testing.assert_array_equal(result[name], value, err_msg=name)
    for name, value in optimized.items():
        np.testing.assert_array_equal(result[fused.name_of(name)], value, err_msg=name)


def test_optimizer_names_the_training_model_already_uses_are_renamed(tmp_path):
    base = models.mlp((4, 8, 3))
    renamed = {"x": "learning_rate"}
    for value in base.graph.input:
        value.name = renamed.get(value.name, value.name)
    for node in base.graph.node:
        node.input[:] = [renamed.get(n, n) for n in node.input]
    paths = models.generate(tmp_path, base, loss=LossType.MSELoss, optimizer=OptimType.AdamW)
    training, optimizer = onnx.load(paths["training_model"]), onnx.load(paths["optimizer_model"])
    fused = fuse_update_and_train(training, optimizer, trainable_of(training))
    onnx.checker.check_model(fused.model, full_check=True)
    assert fused.name_of("learning_rate") == "learning_rate.fused0"
    assert fused.name_of("step") == "step"
    inputs = [i.name for i in fused.model.graph.input]
    assert "learning_rate" in inputs and "learning_rate.fused0" in inputs  # the user's input and the optimizer's
    lr_node = next(n for n in fused.model.graph.node if "learning_rate.fused0" in n.input)
    assert lr_node.op_type == "Squeeze"


def test_a_gradient_no_node_computes_gets_an_identity():
    training, optimizer = constant_gradient_models()
    fused = fuse_update_and_train(training, optimizer, ["w"])
    onnx.checker.check_model(fused.model, full_check=True)
    previous = fused.name_of("w_grad")
    assert previous != "w_grad"  # the training model's constant has the name
    feeds = {"w": np.array([1.0, 2.0], np.float32), "learning_rate": np.array([0.5], np.float32)}
    feeds.update({"step": np.array([1]), previous: np.array([2.0, 4.0], np.float32)})
    out = run_model(fused.model, feeds)
    np.testing.assert_array_equal(out[fused.gradients["w"]], [1.0, 1.0])
    np.testing.assert_array_equal(out["w.updated"], [0.0, 0.0])


def test_models_of_different_opsets_cannot_be_fused(tmp_path):
    paths = generate_case(tmp_path, "adamw, cross-entropy")
    training, optimizer = onnx.load(paths["training_model"]), onnx.load(paths["optimizer_model"])
    optimizer.opset_import[0].version += 1
    with pytest.raises(FusionError, match="import opset"):
        fuse_update_and_train(training, optimizer, trainable_of(training))


def test_a_training_model_without_the_accumulation_pattern_cannot_be_fused(tmp_path):
    paths = generate_case(tmp_path, "adamw, cross-entropy")
    training, optimizer = onnx.load(paths["training_model"]), onnx.load(paths["optimizer_model"])
    trainable = trainable_of(training)
    for node in training.graph.node:
        if node.op_type == "Where" and node.output[0].endswith(".accumulation.out"):
            node.op_type = "Max"
            del node.input[0]
    with pytest.raises(FusionError, match="is not the Where"):
        fuse_update_and_train(training, optimizer, trainable)


def test_the_inputs_are_not_changed(tmp_path):
    paths = generate_case(tmp_path, "adamw, cross-entropy")
    training, optimizer = onnx.load(paths["training_model"]), onnx.load(paths["optimizer_model"])
    before = (training.SerializeToString(), optimizer.SerializeToString())
    fuse_update_and_train(training, optimizer, trainable_of(training))
    assert (training.SerializeToString(), optimizer.SerializeToString()) == before
