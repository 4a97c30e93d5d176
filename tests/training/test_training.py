"""End to end: losses fall, runs are deterministic, resuming from a checkpoint continues the same trajectory."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from onnxtrain import api
from tests.training.helpers import classifier_batch, open_module, regression_batch


def _batches(seed: int, count: int, make=classifier_batch):
    rng = np.random.default_rng(seed)
    return [make(rng) for _ in range(count)]


def _run(module, optimizer, batches, scheduler=None):
    losses = []
    for batch in batches:
        outputs = module(*batch)
        losses.append(float(outputs[0] if isinstance(outputs, tuple) else outputs))
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        module.lazy_reset_grad()
    return losses


def test_mlp_loss_falls_over_50_steps(classifier):
    _, module, optimizer = open_module(classifier)
    optimizer.set_learning_rate(0.01)
    rng = np.random.default_rng(0)
    fixed = classifier_batch(rng, n=64)
    module.eval()
    before = float(module(*fixed))
    module.train()
    losses = _run(module, optimizer, _batches(1, 50))
    module.eval()
    after = float(module(*fixed))
    assert after < 0.6 * before
    assert np.mean(losses[-10:]) < np.mean(losses[:10])


def test_same_checkpoint_and_data_give_identical_losses(classifier):
    batches = _batches(2, 10)
    first = _run(*open_module(classifier)[1:], batches)
    second = _run(*open_module(classifier)[1:], batches)
    assert first == second


def test_resume_from_a_checkpoint_with_optimizer_state_continues_the_same_trajectory(classifier, tmp_path):
    batches = _batches(3, 12)

    def scheduled(optimizer):
        return api.LinearLRScheduler(optimizer, 3, 12, 0.02)

    state, module, optimizer = open_module(classifier)
    uninterrupted = _run(module, optimizer, batches, scheduled(optimizer))

    state, module, optimizer = open_module(classifier)
    first = _run(module, optimizer, batches[:5], scheduled(optimizer))
    path = tmp_path / "mid"
    api.CheckpointState.save_checkpoint(state, path, include_optimizer_state=True)
    resumed_state = api.CheckpointState.load_checkpoint(path)
    module = api.Module(classifier["training_model"], resumed_state, classifier["eval_model"])
    optimizer = api.Optimizer(classifier["optimizer_model"], module)
    rest = _run(module, optimizer, batches[5:], scheduled(optimizer))
    assert first + rest == uninterrupted


def test_resume_with_a_constant_learning_rate(regression, tmp_path):
    batches = _batches(4, 6, regression_batch)
    state, module, optimizer = open_module(regression)
    optimizer.set_learning_rate(0.003)
    uninterrupted = _run(module, optimizer, batches)
    state, module, optimizer = open_module(regression)
    optimizer.set_learning_rate(0.003)
    first = _run(module, optimizer, batches[:3])
    api.CheckpointState.save_checkpoint(state, tmp_path / "ckpt", include_optimizer_state=True)
    state = api.CheckpointState.load_checkpoint(tmp_path / "ckpt")
    module = api.Module(regression["training_model"], state)
    optimizer = api.Optimizer(regression["optimizer_model"], module)
    assert optimizer.get_learning_rate() == pytest.approx(0.003)  # the checkpoint's initial rate
    assert first + _run(module, optimizer, batches[3:]) == uninterrupted


def test_batchnorm_running_statistics_are_carried_from_step_to_step(batchnorm):
    state, module, optimizer = open_module(batchnorm)
    rng = np.random.default_rng(5)
    means, variances = [state.parameters["bn.mean"].data], [state.parameters["bn.var"].data]
    for _ in range(3):
        x = rng.normal(loc=2.0, size=(16, 4)).astype(np.float32)
        module(x, rng.normal(size=(16, 3)).astype(np.float32))
        optimizer.step()
        module.lazy_reset_grad()
        means.append(state.parameters["bn.mean"].data)
        variances.append(state.parameters["bn.var"].data)
    for a, b in itertools.pairwise(means):
        assert not np.allclose(a, b)
    for a, b in itertools.pairwise(variances):
        assert not np.allclose(a, b)
    assert state.parameters["bn.mean"].requires_grad is False


def test_batchnorm_statistic_update_is_the_onnx_formula(batchnorm):
    state, module, _ = open_module(batchnorm)
    x = np.random.default_rng(6).normal(size=(16, 4)).astype(np.float32)
    w = state.parameters["W"].data
    module(x, np.zeros((16, 3), np.float32))
    h = x @ w
    np.testing.assert_allclose(state.parameters["bn.mean"].data, 0.9 * 0 + 0.1 * h.mean(axis=0), rtol=1e-5, atol=1e-6)


def test_eval_uses_the_running_statistics(batchnorm):
    _state, module, _ = open_module(batchnorm)
    x = np.random.default_rng(7).normal(size=(8, 4)).astype(np.float32)
    target = np.zeros((8, 3), np.float32)
    module.eval()
    before = module(x, target)
    module.train()
    module(x * 3 + 1, target)  # moves the statistics
    module.eval()
    assert module(x, target) != before


def test_parameters_of_several_dtypes_train(mixed):
    state, module, optimizer = open_module(mixed)
    optimizer.set_learning_rate(0.05)
    rng = np.random.default_rng(8)
    x = rng.normal(size=(32, 3)).astype(np.float32)
    target = x[:, :2].astype(np.float64) * 2 - 1
    losses = []
    for _ in range(30):
        losses.append(float(module(x, target)))
        optimizer.step()
        module.lazy_reset_grad()
    assert losses[-1] < 0.5 * losses[0]
    assert state.parameters["W"].data.dtype == np.float32 and state.parameters["b"].data.dtype == np.float64
    assert state.parameters["b"].grad.dtype == np.float64


def test_check_finite_raises_with_the_step_number_and_discards_the_step(regression, rng):
    state, module, optimizer = open_module(regression, check_finite=True)
    x, target = regression_batch(rng)
    module(x, target)
    grad = state.parameters["fc0.weight"].grad
    bad = target.copy()
    bad[0, 0] = np.nan
    with pytest.raises(FloatingPointError, match=r"train step 2 .*loss is nan"):
        module(x, bad)
    np.testing.assert_array_equal(state.parameters["fc0.weight"].grad, grad)  # the bad step left no trace
    optimizer.step()  # the gradients of step 1 are still there
    assert module.train_step_count == 1
    # without check_finite the NaN comes back as the loss
    _, plain, _ = open_module(regression)
    assert np.isnan(plain(x, bad)[0])
