"""Optimizer: steps match the optimizer's NumPy reference, state is created, stepped and guarded."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from onnxtrain import api, checkpoint, optim
from onnxtrain.training import optimizer as optimizer_module
from tests.training.helpers import classifier_batch, open_module, parameters, regression_batch


def test_sgd_step_is_p_minus_lr_times_the_accumulated_gradient(regression, rng):
    state, module, optimizer = open_module(regression)
    optimizer.set_learning_rate(0.05)
    module(*regression_batch(rng))
    module(*regression_batch(rng))  # accumulated over two train steps
    grads = {name: p.grad for name, p in state.parameters}
    before = parameters(state)
    optimizer.step()
    lr = np.float32(0.05)
    for name, value in parameters(state).items():
        np.testing.assert_allclose(value, before[name] - lr * grads[name], rtol=1e-6, atol=1e-7)
    # ORT's Optimizer.step does not reset the gradients
    for name, parameter in state.parameters:
        np.testing.assert_array_equal(parameter.grad, grads[name])


def test_adamw_matches_its_reference_over_steps_with_the_step_fed_as_count_plus_one(classifier, rng):
    state, module, optimizer = open_module(classifier)
    reference = optim.AdamW()
    params = parameters(state)
    moments = {name: [np.zeros_like(v), np.zeros_like(v)] for name, v in params.items()}
    optimizer.set_learning_rate(0.01)
    for step in range(1, 4):
        module(*classifier_batch(rng))
        grads = {name: p.grad for name, p in state.parameters}
        params, moments = reference.reference_step(0.01, step, params, grads, moments)
        optimizer.step()
        module.lazy_reset_grad()
        for name, value in parameters(state).items():
            np.testing.assert_allclose(value, params[name], rtol=1e-5, atol=1e-6)
        params = parameters(state)  # follow the runtime's values to keep the comparison exact
    checkpoint = state.to_checkpoint()
    assert checkpoint.optimizer.step == 3
    for name, (m, v) in checkpoint.optimizer.moments.items():
        np.testing.assert_allclose(m, moments[name][0], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(v, moments[name][1], rtol=1e-5, atol=1e-9)


def test_moments_start_from_the_metadata_values_with_step_zero(momentum):
    state, _, _ = open_module(momentum)
    checkpoint = state.to_checkpoint(include_optimizer_state=True)
    assert checkpoint.optimizer.step == 0
    assert sorted(checkpoint.optimizer.moments) == ["fc1.bias", "fc1.weight"]  # trainable ones only
    for name, moments in checkpoint.optimizer.moments.items():
        assert len(moments) == 1  # SGD with momentum: one buffer
        assert moments[0].shape == state.parameters[name].shape and not moments[0].any()


def test_frozen_parameters_do_not_move(momentum, rng):
    state, module, optimizer = open_module(momentum)
    frozen = state.parameters["fc0.weight"].data
    for _ in range(3):
        module(*regression_batch(rng))
        optimizer.step()
        module.lazy_reset_grad()
    np.testing.assert_array_equal(state.parameters["fc0.weight"].data, frozen)
    assert not np.array_equal(state.parameters["fc1.weight"].data, momentum_initial(momentum)["fc1.weight"])


def momentum_initial(paths):
    return parameters(api.CheckpointState.load_checkpoint(paths["checkpoint"]))


def test_learning_rate_get_set(regression):
    _, _, optimizer = open_module(regression)
    assert optimizer.get_learning_rate() == pytest.approx(1e-3)  # ORT's default
    optimizer.set_learning_rate(0.25)
    assert optimizer.get_learning_rate() == 0.25
    with pytest.raises(ValueError, match="finite"):
        optimizer.set_learning_rate(float("nan"))
    with pytest.raises(TypeError, match="float"):
        optimizer.set_learning_rate("0.1")
    assert optimizer.get_learning_rate() == 0.25


def test_step_before_any_train_step_raises_and_changes_nothing(regression, rng):
    state, module, optimizer = open_module(regression)
    before = parameters(state)
    with pytest.raises(RuntimeError, match="before any train step"):
        optimizer.step()
    module(*regression_batch(rng))
    module.lazy_reset_grad()
    with pytest.raises(RuntimeError, match=r"after lazy_reset_grad\(\)"):
        optimizer.step()
    assert state.to_checkpoint().optimizer.step == 0
    for name, value in parameters(state).items():
        np.testing.assert_array_equal(value, before[name])


def test_optimizer_of_other_artifacts_is_refused(regression, classifier):
    _, module, _ = open_module(regression, optimizer=False)
    with pytest.raises(ValueError, match="not belong"):
        api.Optimizer(classifier["optimizer_model"], module)


def _run_steps(paths, fuse: bool, steps: int = 4) -> tuple[Any, Any]:
    state, module, optimizer = open_module(paths, fuse=fuse)
    optimizer.set_learning_rate(0.05)
    rng = np.random.default_rng(2)
    for _ in range(steps):
        module(*classifier_batch(rng))
        optimizer.step()
        module.lazy_reset_grad()
    return state, optimizer


def test_an_optimizer_step_writes_the_parameters_and_moments_in_place(classifier):
    state, optimizer = _run_steps(classifier, fuse=False)
    assert optimizer._in_place
    moments = [m for ms in optimizer.module.state.store.optimizer.moments.values() for m in ms]
    assert all(t._spare is None and t.flips == 0 for t in [*state.store.tensors.values(), *moments])


def test_an_optimizer_model_that_cannot_update_in_place_writes_spares_with_the_same_results(classifier, monkeypatch):
    expected = parameters(_run_steps(classifier, fuse=False)[0])
    monkeypatch.setattr(optimizer_module, "unsafe_in_place", lambda graph, pairs: {next(iter(pairs)): "forced"})
    state, optimizer = _run_steps(classifier, fuse=False)
    assert not optimizer._in_place
    assert all(t.flips == 4 for t in state.store.tensors.values())
    for name, value in parameters(state).items():
        np.testing.assert_array_equal(value, expected[name])


def _with_moments(paths, tmp_path, moments) -> api.CheckpointState:
    """The artifacts' checkpoint, saved with optimizer state: step 3 and ``moments(array)`` per parameter."""
    full = checkpoint.load(paths["checkpoint"])
    state = checkpoint.OptimizerState({n: moments(a) for n, a in full.trainable.items()}, step=3)
    checkpoint.save(checkpoint.CheckpointState(full.trainable, full.frozen, state), tmp_path / "resumed")
    return api.CheckpointState.load_checkpoint(tmp_path / "resumed")


def test_sgd_resumes_onnx_runtimes_sgd_state_its_unread_zero_momentum0(regression, tmp_path, rng):
    """ONNX Runtime's SGD checkpoints hold one zero ``momentum0`` per parameter, which its kernel never reads."""
    state = _with_moments(regression, tmp_path, lambda a: [np.zeros_like(a)])
    module = api.Module(regression["training_model"], state)
    optimizer = api.Optimizer(regression["optimizer_model"], module)
    assert state.step == 3
    module(*regression_batch(rng))
    optimizer.step()
    assert state.step == 4
    saved = state.to_checkpoint()
    assert saved.optimizer is not None and not any(saved.optimizer.moments.values())


@pytest.mark.parametrize(
    ("paths", "moments", "count", "keeps"),
    [
        ("regression", lambda a: [np.full_like(a, 0.5)], 1, 0),  # a momentum that was used: not ORT's SGD
        ("regression", lambda a: [np.zeros_like(a), np.zeros_like(a)], 2, 0),
        ("classifier", lambda a: [np.zeros_like(a)], 1, 2),
        ("momentum", lambda a: [], 0, 1),
    ],
    ids=["sgd, momentum0 in use", "sgd, two moments", "adamw, one moment", "momentum sgd, none"],
)
def test_a_checkpoint_of_another_optimizer_is_refused(request, tmp_path, paths, moments, count, keeps):
    artifacts = request.getfixturevalue(paths)
    state = _with_moments(artifacts, tmp_path, moments)
    module = api.Module(artifacts["training_model"], state)
    with pytest.raises(ValueError, match=rf"has {count} moment\(s\) for '.*', but the optimizer model keeps {keeps}"):
        api.Optimizer(artifacts["optimizer_model"], module)
