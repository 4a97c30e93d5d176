"""Training and optimizer models for the tests of the step models (fused step, reset step), and running them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from onnxtrain import losses, optim
from onnxtrain.artifacts import LossType, OptimType
from onnxtrain.artifacts.accumulation import LAZY_RESET_GRAD, add_gradient_accumulation, buffer_name
from onnxtrain.sessions import inference_session
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


def generate_case(tmp_path: Path, case: str) -> dict[str, Path]:
    build, kwargs = CASES[case]
    kwargs = {"optimizer": OptimType.AdamW, **kwargs}
    return models.generate(tmp_path, build(), **kwargs)


def trainable_of(training: onnx.ModelProto) -> list[str]:
    suffix = buffer_name("")
    return [i.name[: -len(suffix)] for i in training.graph.input if i.name.endswith(suffix)]


def run_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = inference_session(model.SerializeToString())
    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    return dict(zip(names, session.run(names, {k: v for k, v in feeds.items() if k in wanted}), strict=True))


def user_feeds(model: onnx.ModelProto, params: dict[str, np.ndarray], rng: np.random.Generator) -> dict:
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


def constant_gradient_models() -> tuple[onnx.ModelProto, onnx.ModelProto]:
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
