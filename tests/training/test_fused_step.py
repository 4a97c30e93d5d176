"""The fused step: the same results as running each step when it is called, whatever happens between steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain import api
from onnxtrain.artifacts import LossType, OptimType
from tests.training import models
from tests.training.helpers import (
    STEP_FIXTURES,
    classifier_batch,
    count_fused_runs,
    count_runs,
    fixture_batch,
    open_module,
    regression_batch,
    snapshot,
)

Script = Callable[[Any, Any, Any, int, tuple[np.ndarray, ...]], Any]


def _gradients(state: Any) -> dict[str, np.ndarray]:
    """The gradients alone: reading them does not apply a recorded update."""
    return {f"grad {n}": p.grad for n, p in state.parameters if p.grad is not None}


def _trajectory(
    request: pytest.FixtureRequest,
    fixture: str,
    script: Script,
    *,
    fuse: bool,
    snapshots: bool,
    steps: int = 6,
    as_on_a_gpu: bool = False,
):
    """Run ``script(state, module, optimizer, i, batch)`` per step; the loss and the gradients after each, and
    everything (parameters, moments: which applies a recorded update) after each with ``snapshots``, else at
    the end only; ``as_on_a_gpu``: the fused step as on a GPU (:func:`open_module`)."""
    paths = request.getfixturevalue(fixture)
    state, module, optimizer = open_module(paths, fuse=fuse, as_on_a_gpu=as_on_a_gpu)
    optimizer.set_learning_rate(0.05)
    rng = np.random.default_rng(7)
    record = []
    for i in range(steps):
        loss = script(state, module, optimizer, i, fixture_batch(fixture, rng))
        seen = snapshot(state) if snapshots or i == steps - 1 else _gradients(state)
        record.append((np.asarray(loss[0] if isinstance(loss, tuple) else loss), seen))
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


@pytest.mark.parametrize("fixture", STEP_FIXTURES)
def test_the_usual_loop_runs_one_session_per_step_and_matches_steps_run_when_called(request, fixture):
    apart, (_, module_b, optimizer_b) = _trajectory(request, fixture, _ort_loop, fuse=False, snapshots=False)
    assert optimizer_b.fused_step is None and module_b._fused is None
    paths = request.getfixturevalue(fixture)
    state, module, optimizer = open_module(paths)
    assert optimizer.fused_step is not None and module._fused is optimizer.fused_step
    runs = {
        "fused": count_fused_runs(optimizer.fused_step),
        "training": count_runs(module._train_session),
        "reset": count_runs(module._reset.session),
        "optimizer": count_runs(optimizer._session),
    }
    optimizer.set_learning_rate(0.05)
    rng = np.random.default_rng(7)
    fused = []
    for i in range(6):
        loss = _ort_loop(state, module, optimizer, i, fixture_batch(fixture, rng))
        assert {k: v[0] for k, v in runs.items()} == {"fused": i, "training": 0, "reset": 1, "optimizer": 0}
        fused.append((np.asarray(loss), snapshot(state) if i == 5 else _gradients(state)))
    _assert_same(fused, apart)
    # the first step trains alone, from reset gradients; each later one applies the last update and trains; the
    # snapshot at the end applies the last update
    assert {k: v[0] for k, v in runs.items()} == {"fused": 5, "training": 0, "reset": 1, "optimizer": 1}


@pytest.mark.parametrize("as_on_a_gpu", [False, True], ids=["as-on-the-cpu", "as-on-a-gpu"])
def test_the_fused_step_updates_in_place_and_allocates_no_spares(classifier, rng, as_on_a_gpu):
    state, module, optimizer = open_module(classifier, as_on_a_gpu=as_on_a_gpu)
    _ort_loop(state, module, optimizer, 0, classifier_batch(rng))  # the first step trains alone
    tensors = {f"param {n}": t for n, t in state.store.tensors.items()}
    tensors.update({f"grad {n}": g for n, g in state.store.gradients.items()})
    tensors.update(
        {f"m{i} {n}": m for n, ms in optimizer.module.state.store.optimizer.moments.items() for i, m in enumerate(ms)}
    )
    values = {name: tensor.value for name, tensor in tensors.items()}
    for _ in range(4):
        _ort_loop(state, module, optimizer, 0, classifier_batch(rng))
    state.to_checkpoint()
    assert all(tensors[name].value is value for name, value in values.items())
    # the first step, from reset gradients, writes them in place too
    assert all(tensor._spare is None for tensor in tensors.values())


def _set_rate_between(state, module, optimizer, i, batch):
    loss = module(*batch)
    optimizer.set_learning_rate(0.05 / (i + 1))  # after the train step, before the optimizer step
    optimizer.step()
    optimizer.set_learning_rate(7.0)  # after the optimizer step: not for the update it recorded
    module.lazy_reset_grad()
    optimizer.set_learning_rate(0.05 / (i + 1))
    return loss


def _write_parameters_between(state, module, optimizer, i, batch):
    loss = module(*batch)
    optimizer.step()
    if i % 2:
        name = next(iter(state.parameters.names()))
        state.parameters[name] = state.parameters[name].data * 0.5
    else:
        module.copy_buffer_to_parameters(module.get_contiguous_parameters_per_dtype(True)["float32"].numpy() * 0.9)
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
    optimizer.step()
    module.lazy_reset_grad()
    module.eval()
    module(batch[0]) if module.input_names() == ["x"] else None  # an eval step reads the current parameters
    module.train()
    return loss


def _save_between(state, module, optimizer, i, batch):
    loss = module(*batch)
    optimizer.step()
    if i % 2:
        state.to_checkpoint(include_optimizer_state=True)  # as save_checkpoint does
    module.lazy_reset_grad()
    return loss


def _sometimes_skip_the_step(state, module, optimizer, i, batch):
    loss = module(*batch)
    if i % 3 != 1:
        optimizer.step()
    module.lazy_reset_grad()
    return loss


def _two_steps_on_one_gradient(state, module, optimizer, i, batch):
    loss = module(*batch)
    optimizer.step()
    if i % 2:
        optimizer.step()  # the same gradients again: the first update is applied before the second is recorded
    module.lazy_reset_grad()
    return loss


def _no_reset_after_the_step(state, module, optimizer, i, batch):
    loss = module(*batch)
    optimizer.step()
    if i % 2:
        module.lazy_reset_grad()  # otherwise the next train step adds to these gradients
    return loss


SCRIPTS = {
    "learning rate set around the step": _set_rate_between,
    "parameters written between": _write_parameters_between,
    "accumulation": _accumulate_two,
    "eval step between": _read_between,
    "snapshot between": _save_between,
    "no optimizer step after some": _sometimes_skip_the_step,
    "two optimizer steps on one gradient": _two_steps_on_one_gradient,
    "no lazy_reset_grad after some steps": _no_reset_after_the_step,
}


@pytest.mark.parametrize("as_on_a_gpu", [False, True], ids=["as-on-the-cpu", "as-on-a-gpu"])
@pytest.mark.parametrize("snapshots", [False, True], ids=["snapshot at the end", "snapshot every step"])
@pytest.mark.parametrize("script", list(SCRIPTS))
@pytest.mark.parametrize("fixture", ["regression", "classifier"])
def test_whatever_happens_between_the_steps_the_results_are_those_of_steps_run_when_called(
    request, fixture, script, snapshots, as_on_a_gpu
):
    fused, _ = _trajectory(request, fixture, SCRIPTS[script], fuse=True, snapshots=snapshots, as_on_a_gpu=as_on_a_gpu)
    apart, _ = _trajectory(request, fixture, SCRIPTS[script], fuse=False, snapshots=snapshots)
    _assert_same(fused, apart)


def test_a_recorded_update_runs_only_when_something_needs_the_state(regression, rng):
    state, module, optimizer = open_module(regression)
    fused_runs = count_fused_runs(optimizer.fused_step)
    optimizer_runs = count_runs(optimizer._session)
    batch = regression_batch(rng)
    module(*batch)
    grads = {name: p.grad for name, p in state.parameters}
    before = {name: np.asarray(v) for name, v in state.to_checkpoint().parameters.items()}
    optimizer.step()
    assert (fused_runs[0], optimizer_runs[0], optimizer.step_count) == (0, 0, 1)
    module.lazy_reset_grad()
    for _, p in state.parameters:
        assert p.grad is not None and not p.grad.any()  # reset: reading them applies nothing
    assert (fused_runs[0], optimizer_runs[0]) == (0, 0)
    lr = np.float32(optimizer.get_learning_rate())
    for name, parameter in state.parameters:  # reading a parameter applies the update first
        np.testing.assert_allclose(parameter.data, before[name] - lr * grads[name], rtol=1e-6)
    assert (fused_runs[0], optimizer_runs[0]) == (0, 1)
    state.to_checkpoint()  # nothing recorded any more: nothing runs
    module(*batch)
    assert (fused_runs[0], optimizer_runs[0]) == (0, 1)


def test_schedulers_step_between_optimizer_steps_and_keep_the_fast_path(regression, rng):
    results = []
    for fuse in (True, False):
        state, module, optimizer = open_module(regression, fuse=fuse)
        scheduler = api.LinearLRScheduler(optimizer, warmup_step_count=2, total_step_count=8, initial_lr=0.1)
        runs = count_runs(optimizer._session)
        batches = np.random.default_rng(3)
        losses = []
        for _ in range(6):
            losses.append(module(*regression_batch(batches))[0])
            optimizer.step()
            scheduler.step()
            module.lazy_reset_grad()
        counted = runs[0]
        results.append((losses, snapshot(state), counted))
    (losses_a, values_a, runs_fused), (losses_b, values_b, runs_apart) = results
    _assert_same([(np.array(losses_a), values_a)], [(np.array(losses_b), values_b)])
    assert (runs_fused, runs_apart) == (0, 6)


def _run_with_a_discarded_step(regression, fuse: bool) -> dict[str, np.ndarray]:
    state, module, optimizer = open_module(regression, fuse=fuse, check_finite=True)
    rng = np.random.default_rng(5)
    x, t = regression_batch(rng)
    module(x, t)
    optimizer.step()
    module.lazy_reset_grad()
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(FloatingPointError, match="train step 2"):
        module(bad, t)  # with the fused step, this run applied the update recorded above
    assert state.store.recorded_update is None
    with pytest.raises(RuntimeError, match="no gradients"):
        optimizer.step()  # the discarded step left the gradients reset
    module(*regression_batch(rng))
    optimizer.step()
    return snapshot(state)


def test_a_non_finite_fused_step_is_discarded_and_the_next_step_is_right(regression):
    fused, apart = (_run_with_a_discarded_step(regression, fuse) for fuse in (True, False))
    _assert_same([(np.zeros(()), fused)], [(np.zeros(()), apart)])


@pytest.mark.parametrize("as_on_a_gpu", [False, True], ids=["as-on-the-cpu", "as-on-a-gpu"])
@pytest.mark.parametrize("where", ["in the loss", "in an embedding"])
def test_a_fused_step_onnxruntime_fails_has_applied_the_whole_update(tmp_path, where, as_on_a_gpu):
    if where == "in the loss":  # a symbolic class count, which the loss checks in the graph (not on the host)
        scores = models.classes_model("classes", False, bias=True)
        paths = models.generate(tmp_path, scores, loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW)
        x, labels = classifier_batch(np.random.default_rng(11))
        good, bad = (x, labels), (x, np.where(np.arange(len(labels)) == 0, 1000, labels))
    else:
        paths = models.generate(tmp_path, models.embedding_model(), loss=LossType.MSELoss, optimizer=OptimType.AdamW)
        rng = np.random.default_rng(11)
        ids, x, target = rng.integers(0, 5, 8), rng.normal(size=(8, 3)).astype(np.float32), np.zeros((8, 2), np.float32)
        # an OrtValue, which the module's host check of ids does not read: onnxruntime's own failure is tested
        bad_ids = ort.OrtValue.ortvalue_from_numpy(np.where(np.arange(8) == 0, 99, ids))
        good, bad = (ids, x, target), (bad_ids, x, target)
    results = []
    for fuse in (True, False):
        state, module, optimizer = open_module(paths, fuse=fuse, as_on_a_gpu=as_on_a_gpu)
        if fuse and as_on_a_gpu and where == "in the loss":  # packed: the failure comes after the packed update
            assert optimizer.fused_step.step_model is not optimizer.fused_step.model
        module(*good)
        optimizer.step()
        module.lazy_reset_grad()
        with pytest.raises(Exception, match=r"(?i)out of|invalid|range|bound"):
            module(*bad)  # onnxruntime fails (an index out of range) after the fused run applied the update
        assert state.store.recorded_update is None
        with pytest.raises(RuntimeError, match="no gradients"):
            optimizer.step()
        module(*good)
        optimizer.step()
        results.append(snapshot(state))
    _assert_same([(np.zeros(()), results[0])], [(np.zeros(()), results[1])])


def test_a_second_optimizer_over_the_module_takes_over_the_fast_path(regression, rng):
    state, module, first = open_module(regression)
    second = api.Optimizer(regression["optimizer_model"], module)
    assert module._fused is second.fused_step is not None
    first_runs = count_runs(first._session)
    batch = regression_batch(rng)
    expected = {name: p.data for name, p in state.parameters}
    module(*batch)
    grads = {name: p.grad for name, p in state.parameters}
    first.step()  # recorded; the module's fused step is the second optimizer's, so it runs the optimizer model
    module.lazy_reset_grad()
    module(*batch)
    assert first_runs[0] == 1
    assert state.store.recorded_update is None
    lr = np.float32(first.get_learning_rate())
    for name, parameter in state.parameters:  # the update, then a train step: parameters as after the update
        np.testing.assert_allclose(parameter.data, expected[name] - lr * grads[name], rtol=1e-6)


def test_models_that_cannot_be_fused_run_apart(regression, rng, tmp_path):
    optimizer_model = onnx.load(regression["optimizer_model"])
    optimizer_model.opset_import[0].version += 1  # the training model imports another version: no fusion
    path = tmp_path / "optimizer_model.onnx"
    onnx.save(optimizer_model, path)
    state = api.CheckpointState.load_checkpoint(regression["checkpoint"])
    module = api.Module(regression["training_model"], state)
    optimizer = api.Optimizer(path, module)
    assert optimizer.fused_step is None and module._fused is None
    before = {name: p.data for name, p in state.parameters}
    module(*regression_batch(rng))
    optimizer.step()
    assert any(not np.array_equal(p.data, before[name]) for name, p in state.parameters)


def test_gradients_another_module_left_are_not_overwritten_by_a_failed_step(regression, rng):
    state = api.CheckpointState.load_checkpoint(regression["checkpoint"])
    first = api.Module(regression["training_model"], state)
    second = api.Module(regression["training_model"], state, check_finite=True)
    optimizer = api.Optimizer(regression["optimizer_model"], second)
    x, t = regression_batch(rng)
    first(x, t)  # gradients ready, from the first module
    optimizer.step()  # recorded: the next train step of the second module may not write them in place
    grads = {name: p.grad for name, p in state.parameters}
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(FloatingPointError):
        second(bad, t)  # the second module starts from reset gradients of its own
    for name, parameter in state.parameters:
        np.testing.assert_array_equal(parameter.grad, grads[name])
    assert optimizer.fused_step is not None and state.store.recorded_update is None


def test_steps_of_other_shapes_run_the_general_session_with_the_same_results(classifier):
    """The first fused step's shapes get a session with the shape computations folded; others the general one."""
    sizes = [16, 16, 5, 16, 7, 16]
    results = []
    for fuse in (False, True):
        state, module, optimizer = open_module(classifier, fuse=fuse)
        general = count_runs(optimizer.fused_step.session) if fuse else [0]
        rng = np.random.default_rng(3)
        losses = [_ort_loop(state, module, optimizer, i, classifier_batch(rng, n)) for i, n in enumerate(sizes)]
        results.append((losses, snapshot(state)))
        if fuse:
            fixed = optimizer.fused_step.sessions()
            assert len(fixed) == 2 and general[0] == 2  # the batches of 5 and 7 rows (the first step is the reset)
            assert len(fixed[1].session.get_inputs()[0].shape) == 2 and fixed[1].session.get_inputs()[0].shape[0] == 16
    np.testing.assert_array_equal(results[0][0], results[1][0])
    for name, value in results[0][1].items():
        np.testing.assert_array_equal(value, results[1][1][name], err_msg=name)
