"""docs/runtime.md's "Averaging over micro-batches": a loss that sums its rows and takes a weight of its own,
fed 1 / the rows of the whole batch, accumulates the gradient of the whole batch's mean loss over micro-batches
of any sizes (what torch computes with ``(sum loss / total rows).backward()`` per micro-batch)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import onnxtrain.onnxblock as onnxblock
from onnxtrain import api, optim
from onnxtrain.artifacts import LossType
from tests.training import models


class WeightedSum(onnxblock.Block):
    def __init__(self) -> None:
        super().__init__()
        self._loss = onnxblock.loss.CrossEntropyLoss(reduction="sum")

    def build(self, scores: str) -> str:
        loss = self._loss(scores)
        return onnxblock.blocks.Mul()(loss, onnxblock.blocks.InputLike(loss)("rows_weight"))


def test_weighted_micro_batches_give_the_whole_batchs_mean_gradient_and_clip_as_it(tmp_path: Path) -> None:
    model = models.mlp((6, 16, 4), seed=1)
    clip = optim.AdamW(clip_grad=optim.ClipGradNorm(0.05))  # a threshold the gradient passes: it clips
    whole = models.generate(tmp_path / "whole", model, loss=LossType.CrossEntropyLoss, optimizer=clip)
    parts = models.generate(tmp_path / "parts", model, loss=WeightedSum(), optimizer=clip)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((13, 6)).astype(np.float32), rng.integers(0, 4, 13).astype(np.int64)
    states = []
    for paths, batches in ((whole, [(x, y)]), (parts, [(x[:8], y[:8]), (x[8:], y[8:])])):
        state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
        module = api.Module(paths["training_model"], state)
        optimizer = api.Optimizer(paths["optimizer_model"], module)
        for inputs in batches:
            module(*inputs, *([np.array(1 / 13, np.float32)] if paths is parts else []))
        states.append({name: parameter.grad for name, parameter in state.parameters})
        optimizer.step()
        states.append({name: parameter.data for name, parameter in state.parameters})
    for name in states[0]:
        np.testing.assert_allclose(states[2][name], states[0][name], rtol=1e-5, atol=1e-7, err_msg=name)  # grads
        np.testing.assert_allclose(states[3][name], states[1][name], rtol=1e-5, atol=1e-6, err_msg=name)  # stepped
