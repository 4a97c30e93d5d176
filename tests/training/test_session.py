"""TrainingSession: every function of ONNX Runtime's C++ TrainingSession."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain import api
from onnxtrain.training import TrainingSession, schedulers
from tests.training.helpers import classifier_batch, open_module, parameters


@pytest.fixture
def session(classifier):
    state = api.CheckpointState.load_checkpoint(classifier["checkpoint"])
    return TrainingSession(state, classifier["training_model"], classifier["eval_model"], classifier["optimizer_model"])


def test_training_loop_matches_the_python_api(classifier, session):
    rng = np.random.default_rng(0)
    batches = [classifier_batch(rng) for _ in range(4)]
    session.register_linear_lr_scheduler(1, 4, 0.05)
    session_losses = []
    for x, labels in batches:
        (loss,) = session.train_step([x, labels])
        session.optimizer_step()
        session.scheduler_step()
        session.lazy_reset_grad()
        session_losses.append(float(loss))
    _, module, optimizer = open_module(classifier)
    scheduler = api.LinearLRScheduler(optimizer, 1, 4, 0.05)
    api_losses = []
    for x, labels in batches:
        api_losses.append(float(module(x, labels)))
        optimizer.step()
        scheduler.step()
        module.lazy_reset_grad()
    assert session_losses == api_losses
    assert session.get_learning_rate() == pytest.approx(schedulers.linear_lr(4, 1, 4, 0.05))


def test_names_eval_and_learning_rate(session):
    assert session.input_names(True) == ["x", "labels"]
    assert session.input_names(False) == ["x", "labels"]
    assert len(session.output_names(True)) == 1 and session.output_names(False) == session.output_names(True)
    x, labels = classifier_batch(np.random.default_rng(1))
    (eval_loss,) = session.eval_step([x, labels])
    (train_loss,) = session.train_step([x, labels])
    np.testing.assert_allclose(eval_loss, train_loss, rtol=1e-6)  # no dropout or batchnorm here
    session.set_learning_rate(0.125)
    assert session.get_learning_rate() == 0.125
    with pytest.raises(RuntimeError, match="register_linear_lr_scheduler"):
        session.scheduler_step()


def test_to_and_from_buffer(session):
    full = session.to_buffer(False)
    trainable = session.to_buffer(True)
    assert isinstance(full, ort.OrtValue)
    np.testing.assert_array_equal(full.numpy(), trainable.numpy())  # every parameter is trainable here
    before = parameters(session.state)
    session.from_buffer(np.zeros_like(full.numpy()))
    assert not any(v.any() for v in parameters(session.state).values())
    session.from_buffer(full)
    for name, value in parameters(session.state).items():
        np.testing.assert_array_equal(value, before[name])
    with pytest.raises(ValueError, match="elements"):
        session.from_buffer(np.zeros(3, np.float32))


def test_from_buffer_infers_trainable_only_from_the_size(momentum):
    state = api.CheckpointState.load_checkpoint(momentum["checkpoint"])
    session = TrainingSession(state, momentum["training_model"])
    trainable = session.to_buffer(True).numpy()
    frozen = state.parameters["fc0.weight"].data
    session.from_buffer(np.ones_like(trainable))
    assert (state.parameters["fc1.weight"].data == 1).all()
    np.testing.assert_array_equal(state.parameters["fc0.weight"].data, frozen)
    session.from_buffer(np.full(session.to_buffer(False).numpy().size, 2.0, np.float32))
    assert (state.parameters["fc0.weight"].data == 2).all()


def test_export_and_missing_optimizer(classifier, session, tmp_path):
    session.export_model_for_inferencing(tmp_path / "inference.onnx", ["y"])
    assert [o.name for o in onnx.load(str(tmp_path / "inference.onnx")).graph.output] == ["y"]
    bare = TrainingSession(api.CheckpointState.load_checkpoint(classifier["checkpoint"]), classifier["training_model"])
    with pytest.raises(RuntimeError, match="optimizer_model"):
        bare.optimizer_step()
