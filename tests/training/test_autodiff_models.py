"""The models of the autodiff tests (LayerNorm, Gelu, training-mode BatchNorm, attention, Softplus, Atan, ...) train.

Each model, hand-built and (where torch is importable) exported by PyTorch,
goes through generate_artifacts and 50 AdamW steps of the runtime on one
fixed batch: its loss must fall.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxtrain import api, artifacts
from tests.autodiff import models as autodiff_models

STEPS = 50


def _float_initializers(model) -> list[str]:
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16}
    return [t.name for t in model.graph.initializer if t.data_type in floats]


def _train(model, params, frozen, loss: str, data: dict[str, np.ndarray], directory: Path) -> list[float]:
    paths = artifacts.generate_artifacts(
        model,
        requires_grad=[p for p in params if p not in frozen],
        frozen_params=[p for p in params if p in frozen],
        loss=artifacts.LossType.CrossEntropyLoss if loss == "cross_entropy" else artifacts.LossType.MSELoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=directory,
    )
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"], check_finite=True)
    optimizer = api.Optimizer(paths["optimizer_model"], module)
    optimizer.set_learning_rate(0.01)
    inputs = [data[name] for name in module.input_names()]
    losses = []
    for _ in range(STEPS):
        losses.append(float(module(*inputs)))
        optimizer.step()
        module.lazy_reset_grad()
    return losses


@pytest.mark.parametrize("name", autodiff_models.NAMES)
def test_hand_built_models_train(name, tmp_path):
    case = autodiff_models.build(name)
    data = case.data(np.random.default_rng(0), 8)
    losses = _train(case.model, list(case.params), case.frozen, case.loss, data, tmp_path)
    assert losses[-1] < 0.7 * losses[0], losses


@pytest.mark.parametrize("name", autodiff_models.NAMES)
def test_models_exported_by_pytorch_train(name, tmp_path):
    pytest.importorskip("torch")
    case = autodiff_models.build(name)
    model = autodiff_models.export_torch(autodiff_models.torch_module(name), name)
    frozen = tuple(t.name for t in model.graph.initializer if "running" in t.name or t.name in case.frozen)
    data = case.data(np.random.default_rng(0), 8)
    losses = _train(model, _float_initializers(model), frozen, case.loss, data, tmp_path)
    assert losses[-1] < 0.7 * losses[0], losses
