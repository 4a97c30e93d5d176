"""fuse_update_and_train: one model equal to the optimizer model followed by the training model on reset gradients."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from onnxtrain import checkpoint, losses, optim
from onnxtrain.artifacts import LossType, OptimType
from onnxtrain.artifacts.accumulation import LAZY_RESET_GRAD, add_gradient_accumulation, buffer_name
from onnxtrain.artifacts.fuse import FusionError, fuse_update_and_train
from onnxtrain.optim.base import grad_name, state_name
from tests.helpers import FLOAT, make_model
from tests.training import models

CASES = {
    "sgd, additional output": (
        lambda: models.mlp((4, 8, 3)),
        {"loss": losses.MSELoss(reduction="sum"), "optimizer": OptimType.SGD, "additional_output_names": ["y"]},
    ),
    "adamw, cross-entropy": (lambda: models.mlp((6, 16, 4), seed=1), {"loss": LossType.CrossEntropyLoss}),
    "adamw, batchnorm statistics": (
        models.batchnorm_mlp,
        {
            "requires_grad": ["W", "bn.scale", "bn.bias"],
            "frozen_params": ["bn.mean", "bn.var"],
            "loss": LossType.MSELoss,
        },
    ),
    "adam, two dtypes": (models.mixed_dtypes, {"loss": LossType.MSELoss, "optimizer": OptimType.Adam}),
    "sgd momentum, frozen layer": (
        lambda: models.mlp((4, 8, 3), seed=2),
        {
            "requires_grad": ["fc1.weight", "fc1.bias"],
            "frozen_params": ["fc0.weight", "fc0.bias"],
            "loss": LossType.MSELoss,
            "optimizer": optim.SGD(momentum=0.9, nesterov=True),
        },
    ),
}


def _generate(tmp_path: Path, case: str) -> dict[str, Path]:
    build, kwargs = CASES[case]
    kwargs = {"optimizer": OptimType.AdamW, **kwargs}
    return models.generate(tmp_path, build(), **kwargs)


def _trainable(training: onnx.ModelProto) -> list[str]:
    suffix = buffer_name("")
    return [i.name[: -len(suffix)] for i in training.graph.input if i.name.endswith(suffix)]


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    return dict(zip(names, session.run(names, {k: v for k, v in feeds.items() if k in wanted}), strict=True))


def _user_feeds(model: onnx.ModelProto, params: dict[str, np.ndarray], rng: np.random.Generator) -> dict:
    feeds = {}
    for value in model.graph.input:
        if value.name in params or value.name == LAZY_RESET_GRAD or value.name.endswith(buffer_name("")):
            continue
        tensor = value.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        shape = [d.dim_value or 5 for d in tensor.shape.dim]
        if np.issubdtype(dtype, np.integer):
            feeds[value.name] = rng.integers(0, shape[-1] if len(shape) > 1 else 3, size=shape).astype(dtype)
        else:
            feeds[value.name] = rng.normal(size=shape).astype(dtype)
    return feeds


@pytest.mark.parametrize("case", list(CASES))
def test_the_fused_model_computes_the_optimizer_step_then_the_training_step(tmp_path, case):
    paths = _generate(tmp_path, case)
    training, optimizer = onnx.load(paths["training_model"]), onnx.load(paths["optimizer_model"])
    trainable = _trainable(training)
    fused = fuse_update_and_train(training, optimizer, trainable)
    onnx.checker.check_model(fused.model, full_check=True)
    assert not any(n.op_type == "Where" and n.output[0].endswith(".accumulation.out") for n in fused.model.graph.node)
    inputs = {i.name for i in fused.model.graph.input}
    assert LAZY_RESET_GRAD not in inputs and not any(name.endswith(buffer_name("")) for name in inputs)
    optimizer_nodes = len(optimizer.graph.node)
    assert [n.op_type for n in fused.model.graph.node[:optimizer_nodes]] == [n.op_type for n in optimizer.graph.node]

    rng = np.random.default_rng(0)
    params = {name: np.asarray(value) for name, value in checkpoint.load(paths["checkpoint"]).parameters.items()}
    user = _user_feeds(training, params, rng)
    step = {"learning_rate": np.array([0.01], np.float32), "step": np.array([3], np.int64)}
    moments, grads = {}, {}
    for p in trainable:
        grads[grad_name(p)] = rng.normal(size=params[p].shape).astype(params[p].dtype)
        for i in range(3):
            if state_name(p, i) in {value.name for value in optimizer.graph.input}:
                moments[state_name(p, i)] = rng.uniform(0.1, 1.0, size=params[p].shape).astype(params[p].dtype)
    optimized = _run(optimizer, {**params, **grads, **moments, **step})
    updated = {**params, **{p: optimized[f"{p}.updated"] for p in trainable}}
    # nonzero buffers: on a reset step they must be ignored, and the fused model has none
    buffers = {buffer_name(p): np.full_like(params[p], 7) for p in trainable}
    trained = _run(training, {**updated, **user, **buffers, LAZY_RESET_GRAD: np.array([True])})
    fused_feeds = {**params, **user, **moments, **step}
    fused_feeds.update({fused.name_of(name): value for name, value in grads.items()})
    result = _run(fused.model, fused_feeds)

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
    fused = fuse_update_and_train(training, optimizer, _trainable(training))
    onnx.checker.check_model(fused.model, full_check=True)
    assert fused.name_of("learning_rate") == "learning_rate.fused0"
    assert fused.name_of("step") == "step"
    inputs = [i.name for i in fused.model.graph.input]
    assert "learning_rate" in inputs and "learning_rate.fused0" in inputs  # the user's input and the optimizer's
    lr_node = next(n for n in fused.model.graph.node if "learning_rate.fused0" in n.input)
    assert lr_node.op_type == "Squeeze"


def _constant_gradient_models() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """A training model whose gradient of ``w`` is an initializer (no node computes it), and SGD for ``w``."""
    training = make_model(
        {"w": (FLOAT, [2])},
        [helper.make_node("ReduceSum", ["w"], ["loss"], keepdims=0)],
        {"loss": (FLOAT, []), "w_grad": (FLOAT, [2])},
        [],
        opset=17,
    )
    training.graph.initializer.append(onnx.numpy_helper.from_array(np.ones(2, np.float32), "w_grad"))
    training.graph.output.pop()
    training.graph.output.append(helper.make_tensor_value_info("w_grad", FLOAT, [2]))
    training = add_gradient_accumulation(training, ["w"])
    block = optim.SGD()
    from onnxtrain.graph.context import empty_base

    with empty_base(opset_version=17):
        block(([onnx.numpy_helper.from_array(np.zeros(2, np.float32), "w")], []))
    return training, block.to_model_proto()


def test_a_gradient_no_node_computes_gets_an_identity():
    training, optimizer = _constant_gradient_models()
    fused = fuse_update_and_train(training, optimizer, ["w"])
    onnx.checker.check_model(fused.model, full_check=True)
    previous = fused.name_of("w_grad")
    assert previous != "w_grad"  # the training model's constant has the name
    feeds = {"w": np.array([1.0, 2.0], np.float32), "learning_rate": np.array([0.5], np.float32)}
    feeds.update({"step": np.array([1]), previous: np.array([2.0, 4.0], np.float32)})
    out = _run(fused.model, feeds)
    np.testing.assert_array_equal(out[fused.gradients["w"]], [1.0, 1.0])
    np.testing.assert_array_equal(out["w.updated"], [0.0, 0.0])


def test_models_of_different_opsets_cannot_be_fused(tmp_path):
    paths = _generate(tmp_path, "adamw, cross-entropy")
    training, optimizer = onnx.load(paths["training_model"]), onnx.load(paths["optimizer_model"])
    optimizer.opset_import[0].version += 1
    with pytest.raises(FusionError, match="import opset"):
        fuse_update_and_train(training, optimizer, _trainable(training))


def test_a_training_model_without_the_accumulation_pattern_cannot_be_fused(tmp_path):
    paths = _generate(tmp_path, "adamw, cross-entropy")
    training, optimizer = onnx.load(paths["training_model"]), onnx.load(paths["optimizer_model"])
    trainable = _trainable(training)
    for node in training.graph.node:
        if node.op_type == "Where" and node.output[0].endswith(".accumulation.out"):
            node.op_type = "Max"
            del node.input[0]
    with pytest.raises(FusionError, match="is not the Where"):
        fuse_update_and_train(training, optimizer, trainable)


def test_the_inputs_are_not_changed(tmp_path):
    paths = _generate(tmp_path, "adamw, cross-entropy")
    training, optimizer = onnx.load(paths["training_model"]), onnx.load(paths["optimizer_model"])
    before = (training.SerializeToString(), optimizer.SerializeToString())
    fuse_update_and_train(training, optimizer, _trainable(training))
    assert (training.SerializeToString(), optimizer.SerializeToString()) == before
