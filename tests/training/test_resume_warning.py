"""Resuming from a checkpoint without optimizer state warns (``OptimizerStateWarning``) when the moments restart.

A checkpoint saved without its optimizer state after optimizer steps records
that step count (``OPTIMIZER_STATE_DROPPED``); one with a user's properties
looks saved while training too. A fresh checkpoint from ``generate_artifacts``
(or with the learning rate ``onnxtrain generate --lr`` stores) does not warn,
nor does an optimizer without moments, nor a checkpoint with optimizer state.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from onnxtrain import api, checkpoint
from onnxtrain.loop.record import with_learning_rate
from onnxtrain.training import OptimizerStateWarning
from onnxtrain.training.state import OPTIMIZER_STATE_DROPPED
from tests.training.helpers import classifier_batch, open_module, regression_batch


def trained(paths: dict[str, Path], tmp_path: Path, steps: int = 2, **save: bool) -> Path:
    """A checkpoint saved after ``steps`` optimizer steps (``save``: ``save_checkpoint``'s keywords)."""
    rng = np.random.default_rng(5)
    state, module, optimizer = open_module(paths)
    for _ in range(steps):
        x, y = classifier_batch(rng) if "classifier" in str(paths["checkpoint"]) else regression_batch(rng)
        module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
    path = tmp_path / "saved"
    api.CheckpointState.save_checkpoint(state, path, **save)
    return path


def resume(paths: dict[str, Path], saved: Path) -> api.Optimizer:
    state = api.CheckpointState.load_checkpoint(saved)
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    return api.Optimizer(paths["optimizer_model"], module)


def resume_quietly(paths: dict[str, Path], saved: Path) -> api.Optimizer:
    with warnings.catch_warnings():
        warnings.simplefilter("error", OptimizerStateWarning)
        return resume(paths, saved)


@pytest.mark.parametrize(("fixture", "moments"), [("classifier", "2 moments"), ("momentum", "1 moment")])
def test_resuming_without_optimizer_state_warns(request, tmp_path, fixture, moments):
    paths = request.getfixturevalue(fixture)
    saved = trained(paths, tmp_path, steps=3)
    assert checkpoint.load(saved).optimizer is None
    assert checkpoint.load(saved).properties[OPTIMIZER_STATE_DROPPED] == 3
    with pytest.warns(OptimizerStateWarning) as caught:
        optimizer = resume(paths, saved)
    (warning,) = caught
    text = str(warning.message)
    assert "the checkpoint holds no optimizer state, but it was saved after 3 optimizer steps without it" in text
    assert f"{moments} per parameter restarting from their initial values" in text
    assert "include_optimizer_state=True" in text
    assert warning.filename == __file__  # points at the code that made the optimizer
    assert optimizer.step_count == 0


def test_a_fresh_checkpoint_does_not_warn(classifier, tmp_path):
    resume_quietly(classifier, classifier["checkpoint"])
    with_rate = tmp_path / "checkpoint"
    checkpoint.save(with_learning_rate(checkpoint.load(classifier["checkpoint"]), 0.05), with_rate)  # generate --lr
    resume_quietly(classifier, with_rate)


def test_an_optimizer_without_moments_does_not_warn(regression, tmp_path):
    saved = trained(regression, tmp_path)  # plain SGD
    assert checkpoint.load(saved).properties[OPTIMIZER_STATE_DROPPED] == 2
    resume_quietly(regression, saved)


def test_a_checkpoint_with_optimizer_state_does_not_warn(classifier, tmp_path):
    saved = trained(classifier, tmp_path, include_optimizer_state=True)
    assert OPTIMIZER_STATE_DROPPED not in checkpoint.load(saved).properties
    assert resume_quietly(classifier, saved).step_count == 2


def test_saving_with_optimizer_state_drops_the_record(classifier, tmp_path):
    dropped = trained(classifier, tmp_path)
    with pytest.warns(OptimizerStateWarning):
        optimizer = resume(classifier, dropped)
    state = optimizer.module.state
    assert state.properties[OPTIMIZER_STATE_DROPPED] == 2  # as loaded
    full = tmp_path / "full"
    api.CheckpointState.save_checkpoint(state, full, include_optimizer_state=True)
    assert OPTIMIZER_STATE_DROPPED not in checkpoint.load(full).properties
    api.CheckpointState.save_checkpoint(state, tmp_path / "again")  # no step since: the record stays as it was
    assert checkpoint.load(tmp_path / "again").properties[OPTIMIZER_STATE_DROPPED] == 2


def test_a_checkpoint_saved_before_any_step_records_nothing(classifier, tmp_path):
    saved = trained(classifier, tmp_path, steps=0)
    assert OPTIMIZER_STATE_DROPPED not in checkpoint.load(saved).properties
    resume_quietly(classifier, saved)


def test_user_properties_in_the_checkpoint_look_like_a_resume(classifier, tmp_path):
    state = api.CheckpointState.load_checkpoint(classifier["checkpoint"])
    state.properties["epoch"] = 4  # set before the optimizer: not read from a checkpoint, no warning
    module = api.Module(classifier["training_model"], state)
    with warnings.catch_warnings():
        warnings.simplefilter("error", OptimizerStateWarning)
        api.Optimizer(classifier["optimizer_model"], module)
    saved = tmp_path / "with_properties"
    api.CheckpointState.save_checkpoint(state, saved)  # as ONNX Runtime's examples save while training
    with pytest.warns(OptimizerStateWarning, match=r"it has properties \['epoch'\], as a checkpoint saved while"):
        resume(classifier, saved)
