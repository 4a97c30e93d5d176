"""The fused step: the same results as the two models run apart, whatever happens between the steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest

from onnxtrain import api
from tests.training.helpers import classifier_batch, open_module, regression_batch

FIXTURES = ["regression", "classifier", "momentum", "batchnorm", "mixed"]


def _batch(fixture: str, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    if fixture == "classifier":
        return classifier_batch(rng)
    if fixture == "mixed":
        return (rng.normal(size=(8, 3)).astype(np.float32), rng.normal(size=(8, 2)))
    return regression_batch(rng)


def _snapshot(state: Any) -> dict[str, np.ndarray]:
    """Parameters, gradients, moments and step: everything a step may change."""
    saved = state.to_checkpoint(include_optimizer_state=True)
    values = {f"param {n}": np.asarray(v) for n, v in saved.parameters.items()}
    for name, parameter in state.parameters:
        if parameter.grad is not None:
            values[f"grad {name}"] = parameter.grad
    if saved.optimizer is not None:
        values["step"] = np.array(saved.optimizer.step)
        for name, moments in saved.optimizer.moments.items():
            values.update({f"moment{i} {name}": np.asarray(m) for i, m in enumerate(moments)})
    return values


def _count_runs(session: Any) -> list[int]:
    runs = [0]
    run = session.run

    def counted() -> None:
        runs[0] += 1
        run()

    session.run = counted
    return runs


Script = Callable[[Any, Any, Any, int, tuple[np.ndarray, ...]], Any]


def _trajectory(request: pytest.FixtureRequest, fixture: str, script: Script, *, fuse: bool, steps: int = 6):
    """Run ``script(state, module, optimizer, i, batch)`` per step; the losses and a snapshot after each."""
    paths = request.getfixturevalue(fixture)
    state, module, optimizer = open_module(paths, fuse=fuse)
    optimizer.set_learning_rate(0.05)
    rng = np.random.default_rng(7)
    record = []
    for i in range(steps):
        loss = script(state, module, optimizer, i, _batch(fixture, rng))
        record.append((np.asarray(loss[0] if isinstance(loss, tuple) else loss), _snapshot(state)))
    return record, (state, module, optimizer)


def _assert_same(fused: list, apart: list) -> None:
    assert len(fused) == len(apart)
    for step, ((loss_a, values_a), (loss_b, values_b)) in enumerate(zip(fused, apart, strict=True)):
        np.testing.assert_array_equal(loss_a, loss_b, err_msg=f"loss at step {step}")
        assert sorted(values_a) == sorted(values_b)
        for name, value in values_a.items():
            np.testing.assert_array_equal(value, values_b[name], err_msg=f"{name} after step {step}")


def _ort_loop(state, module, optimizer, i, batch):
    loss = module(*batch)
    optimizer.step()
    module.lazy_reset_grad()
    return loss[0] if isinstance(loss, tuple) else loss  # the regression model also outputs y


@pytest.mark.parametrize("fixture", FIXTURES)
def test_the_usual_loop_runs_one_session_per_step_and_matches_the_two_models(request, fixture):
    apart, (_, module_b, optimizer_b) = _trajectory(request, fixture, _ort_loop, fuse=False)
    assert optimizer_b._fused is None and module_b._fused is None
    paths = request.getfixturevalue(fixture)
    state, module, optimizer = open_module(paths)
    assert optimizer._fused is not None and module._fused is optimizer._fused
    runs = {
        "fused": _count_runs(optimizer._fused.session),
        "training": _count_runs(module._train_session),
        "optimizer": _count_runs(optimizer._session),
    }
    optimizer.set_learning_rate(0.05)
    rng = np.random.default_rng(7)
    fused = []
    for i in range(6):
        loss = _ort_loop(state, module, optimizer, i, _batch(fixture, rng))
        fused.append((np.asarray(loss), _snapshot(state)))
    _assert_same(fused, apart)
    assert {k: v[0] for k, v in runs.items()} == {"fused": 6, "training": 0, "optimizer": 0}


def _set_rate_between(state, module, optimizer, i, batch):
    loss = module(*batch)
    optimizer.set_learning_rate(0.05 / (i + 1))  # after the train step: the update computed with it is stale
    optimizer.step()
    module.lazy_reset_grad()
    return loss


def _write_parameters_between(state, module, optimizer, i, batch):
    loss = module(*batch)
    if i % 2:
        name = next(iter(state.parameters.names()))
        state.parameters[name] = state.parameters[name].data * 0.5
    else:
        module.copy_buffer_to_parameters(module.get_contiguous_parameters_per_dtype(True)["float32"].numpy() * 0.9)
    optimizer.step()
    module.lazy_reset_grad()
    return loss


def _accumulate_two(state, module, optimizer, i, batch):
    half = len(batch[0]) // 2
    loss = module(*(b[:half] for b in batch))
    module(*(b[half:] for b in batch))
    optimizer.step()
    module.lazy_reset_grad()
    return loss


def _read_between(state, module, optimizer, i, batch):
    loss = module(*batch)
    module.eval()
    module(batch[0]) if module.input_names() == ["x"] else None  # an eval step reads the current parameters
    module.train()
    state.to_checkpoint(include_optimizer_state=True)  # as save_checkpoint does
    optimizer.step()
    module.lazy_reset_grad()
    return loss


def _sometimes_skip_the_step(state, module, optimizer, i, batch):
    loss = module(*batch)
    if i % 3 != 1:
        optimizer.step()
    module.lazy_reset_grad()
    return loss


SCRIPTS = {
    "learning rate set between": _set_rate_between,
    "parameters written between": _write_parameters_between,
    "accumulation": _accumulate_two,
    "eval and snapshot between": _read_between,
    "no optimizer step after some": _sometimes_skip_the_step,
}


@pytest.mark.parametrize("script", list(SCRIPTS))
@pytest.mark.parametrize("fixture", ["regression", "classifier"])
def test_whatever_happens_between_the_steps_the_results_are_those_of_the_two_models(request, fixture, script):
    fused, _ = _trajectory(request, fixture, SCRIPTS[script], fuse=True)
    apart, _ = _trajectory(request, fixture, SCRIPTS[script], fuse=False)
    _assert_same(fused, apart)


def test_speculation_stops_where_the_update_would_be_wasted_and_resumes(regression, rng):
    _, module, optimizer = open_module(regression)
    fused_runs = _count_runs(optimizer._fused.session)
    optimizer_runs = _count_runs(optimizer._session)
    batch = regression_batch(rng)
    for _ in range(3):  # accumulating over two train steps: only the first cycle speculates
        module(*batch)
        module(*batch)
        optimizer.step()
        module.lazy_reset_grad()
    assert (fused_runs[0], optimizer_runs[0]) == (1, 3)
    for i in range(3):  # the learning rate set between the train step and the optimizer step: no speculation
        module(*batch)
        optimizer.set_learning_rate(0.01 * (i + 1))
        optimizer.step()
        module.lazy_reset_grad()
    assert (fused_runs[0], optimizer_runs[0]) == (1, 6)
    module(*batch)  # the usual loop: one step apart tells the next one to speculate again
    optimizer.step()
    module.lazy_reset_grad()
    for _ in range(4):
        module(*batch)
        optimizer.step()
        module.lazy_reset_grad()
    assert (fused_runs[0], optimizer_runs[0]) == (5, 7)


def test_schedulers_step_between_optimizer_steps_and_keep_the_fast_path(regression, rng):
    results = []
    for fuse in (True, False):
        state, module, optimizer = open_module(regression, fuse=fuse)
        scheduler = api.LinearLRScheduler(optimizer, warmup_step_count=2, total_step_count=8, initial_lr=0.1)
        runs = _count_runs(optimizer._session)
        batches = np.random.default_rng(3)
        losses = []
        for _ in range(6):
            losses.append(module(*regression_batch(batches))[0])
            optimizer.step()
            scheduler.step()
            module.lazy_reset_grad()
        results.append((losses, _snapshot(state), runs[0]))
    (losses_a, values_a, runs_fused), (losses_b, values_b, runs_apart) = results
    _assert_same([(np.array(losses_a), values_a)], [(np.array(losses_b), values_b)])
    assert (runs_fused, runs_apart) == (0, 6)


def test_a_non_finite_fused_step_is_discarded_and_the_next_step_is_right(regression, rng):
    results = []
    for fuse in (True, False):
        state, module, optimizer = open_module(regression, fuse=fuse, check_finite=True)
        x, t = regression_batch(rng := np.random.default_rng(5))
        module(x, t)
        optimizer.step()
        module.lazy_reset_grad()
        before = _snapshot(state)
        bad = x.copy()
        bad[0, 0] = np.nan
        with pytest.raises(FloatingPointError, match="train step 2"):
            module(bad, t)
        _assert_same([(np.zeros(()), _snapshot(state))], [(np.zeros(()), before)])
        with pytest.raises(RuntimeError, match="no gradients"):
            optimizer.step()  # the discarded step left the gradients reset
        module(*regression_batch(rng))
        optimizer.step()
        results.append(_snapshot(state))
    _assert_same([(np.zeros(()), results[0])], [(np.zeros(()), results[1])])


def test_a_second_optimizer_over_the_module_takes_over_the_fast_path(regression, rng):
    state, module, first = open_module(regression)
    second = api.Optimizer(regression["optimizer_model"], module)
    assert module._fused is second._fused is not None
    first_runs = _count_runs(first._session)
    batch = regression_batch(rng)
    expected = {name: p.data for name, p in state.parameters}
    module(*batch)
    grads = {name: p.grad for name, p in state.parameters}
    first.step()  # its own update never ran: it runs the optimizer model
    assert first_runs[0] == 1
    lr = np.float32(first.get_learning_rate())
    for name, parameter in state.parameters:
        np.testing.assert_allclose(parameter.data, expected[name] - lr * grads[name], rtol=1e-6)


def test_models_that_cannot_be_fused_run_apart(regression, rng, tmp_path):
    optimizer_model = onnx.load(regression["optimizer_model"])
    optimizer_model.opset_import[0].version += 1  # the training model imports another version: no fusion
    path = tmp_path / "optimizer_model.onnx"
    onnx.save(optimizer_model, path)
    state = api.CheckpointState.load_checkpoint(regression["checkpoint"])
    module = api.Module(regression["training_model"], state)
    optimizer = api.Optimizer(path, module)
    assert optimizer._fused is None and module._fused is None
    before = {name: p.data for name, p in state.parameters}
    module(*regression_batch(rng))
    optimizer.step()
    assert any(not np.array_equal(p.data, before[name]) for name, p in state.parameters)


def test_gradients_another_module_left_are_not_overwritten_by_a_failed_fused_step(regression, rng):
    state = api.CheckpointState.load_checkpoint(regression["checkpoint"])
    first = api.Module(regression["training_model"], state)
    second = api.Module(regression["training_model"], state, check_finite=True)
    optimizer = api.Optimizer(regression["optimizer_model"], second)
    x, t = regression_batch(rng)
    first(x, t)  # gradients ready, from the first module
    grads = {name: p.grad for name, p in state.parameters}
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(FloatingPointError):
        second(bad, t)  # the second module starts from reset gradients of its own
    for name, parameter in state.parameters:
        np.testing.assert_array_equal(parameter.grad, grads[name])
    assert optimizer._fused is not None
