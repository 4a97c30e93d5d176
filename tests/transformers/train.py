"""Artifacts written once per model, and train steps through ``onnxtrain.api``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from onnxtrain import api, artifacts


@dataclass(frozen=True)
class Trained:
    """The artifacts of one model and the module, state and optimizer that run them."""

    paths: dict[str, Path]
    state: api.CheckpointState
    module: api.Module
    optimizer: api.Optimizer


def session_options() -> ort.SessionOptions:
    """One thread each: the tests share two cores."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return options


def write_artifacts(
    model: Path, requires_grad: Sequence[str], directory: Path, *, activation_checkpoints: str | None = None
) -> dict[str, Path]:
    """``generate_artifacts``: ``requires_grad`` trainable, cross-entropy on the logits, AdamW."""
    return artifacts.generate_artifacts(
        str(model),
        requires_grad=list(requires_grad),
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=directory,
        activation_checkpoints=activation_checkpoints,
    )


def load(paths: dict[str, Path]) -> Trained:
    """A fresh state (the checkpoint's values), module and optimizer over the artifacts."""
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"], session_options=session_options())
    return Trained(paths, state, module, api.Optimizer(paths["optimizer_model"], module))


def step(trained: Trained, data: dict[str, np.ndarray]) -> float:
    """One train step from reset gradients; the loss. ``trained.state.parameters[p].grad`` holds the gradients."""
    trained.module.train()
    trained.module.lazy_reset_grad()
    return float(np.asarray(trained.module(data["ids"], data["labels"])))


def gradients(trained: Trained, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The gradient of each of ``names`` after the last step."""
    result = {}
    for name in names:
        grad = trained.state.parameters[name].grad
        assert grad is not None, f"no gradient for {name}"
        result[name] = grad
    return result
