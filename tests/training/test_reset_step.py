"""The train step from reset gradients: the training model without accumulation, writing the gradients in place."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from onnxtrain import api
from tests.training.helpers import (
    STEP_FIXTURES,
    classifier_batch,
    count_runs,
    fixture_batch,
    open_module,
    regression_batch,
    snapshot,
)

#: Per step: accumulate into the next step (no optimizer step and no reset after it)?
ACCUMULATE = [False, True, True, False, False, True, False]


def _trajectory(paths: Any, fixture: str, *, reset_step: bool, fuse: bool) -> list[tuple[np.ndarray, dict]]:
    state, module, optimizer = open_module(paths, fuse=fuse)
    if not reset_step:
        module._reset = None  # every train step runs the training model, which accumulates into spares
    optimizer.set_learning_rate(0.05)
    rng = np.random.default_rng(3)
    record = []
    for accumulate in ACCUMULATE:
        loss = module(*fixture_batch(fixture, rng))
        record.append((np.asarray(loss[0] if isinstance(loss, tuple) else loss), snapshot(state)))
        if not accumulate:
            optimizer.step()
            module.lazy_reset_grad()
    return record


@pytest.mark.parametrize("fuse", [False, True], ids=["optimizer apart", "fused"])
@pytest.mark.parametrize("fixture", STEP_FIXTURES)
def test_steps_from_reset_give_what_the_training_model_gives(request, fixture, fuse):
    paths = request.getfixturevalue(fixture)
    with_reset = _trajectory(paths, fixture, reset_step=True, fuse=fuse)
    without = _trajectory(paths, fixture, reset_step=False, fuse=fuse)
    for step, ((loss_a, values_a), (loss_b, values_b)) in enumerate(zip(with_reset, without, strict=True)):
        np.testing.assert_array_equal(loss_a, loss_b, err_msg=f"loss at step {step}")
        assert sorted(values_a) == sorted(values_b)
        for name, value in values_a.items():
            np.testing.assert_array_equal(value, values_b[name], err_msg=f"{name} after step {step}")


def test_a_loop_that_never_accumulates_never_runs_the_training_model_nor_makes_gradient_spares(regression, rng):
    state, module, optimizer = open_module(regression, fuse=False)
    runs = {"training": count_runs(module._train_session), "reset": count_runs(module._reset.session)}
    values = {name: grad.value for name, grad in state.store.gradients.items()}
    for _ in range(4):
        module(*regression_batch(rng))
        optimizer.step()
        module.lazy_reset_grad()
    assert {k: v[0] for k, v in runs.items()} == {"training": 0, "reset": 4}
    assert all(grad._spare is None and grad.value is values[name] for name, grad in state.store.gradients.items())
    module(*regression_batch(rng))
    module(*regression_batch(rng))  # accumulates: the training model, into spares
    assert {k: v[0] for k, v in runs.items()} == {"training": 1, "reset": 5}
    assert all(grad._spare is not None for grad in state.store.gradients.values())


def test_two_steps_from_reset_on_the_halves_of_a_batch_sum_to_the_whole_batch(regression, rng):
    """The reset step's gradient, plus an accumulating step's: the sum reduction makes them the full batch's."""
    state, module, _ = open_module(regression, optimizer=False)
    x, t = regression_batch(rng, n=8)
    module(x, t)
    whole = {name: p.grad for name, p in state.parameters}
    module.lazy_reset_grad()
    module(x[:4], t[:4])  # from reset
    module(x[4:], t[4:])  # accumulated
    for name, parameter in state.parameters:
        np.testing.assert_allclose(parameter.grad, whole[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_failed_step_from_reset_leaves_the_gradients_reset_and_the_next_step_is_right(classifier, rng):
    state, module, optimizer = open_module(classifier, fuse=False)
    fresh_state, fresh, _ = open_module(classifier, optimizer=False)
    x, labels = classifier_batch(rng)
    bad = np.where(np.arange(len(labels)) == 0, 1000, labels)
    with pytest.raises(Exception, match=r"(?i)out of|invalid|range|bound"):
        module(x, bad)  # the very first step: no gradient yet, whatever the run left in the buffers
    assert all(p.grad is not None and not p.grad.any() for _, p in state.parameters)
    module(x, labels)
    optimizer.step()
    module.lazy_reset_grad()
    with pytest.raises(Exception, match=r"(?i)out of|invalid|range|bound"):
        module(x, bad)  # after a reset: the gradients read as zeros, whatever the run left in their buffers
    assert all(np.array_equal(p.grad, np.zeros_like(p.grad)) for _, p in state.parameters)
    with pytest.raises(RuntimeError, match="no gradients"):
        optimizer.step()
    for name, parameter in state.parameters:
        fresh_state.parameters[name].data = parameter.data
    expected = fresh(x, labels)
    np.testing.assert_array_equal(module(x, labels), expected)
    for name, parameter in state.parameters:
        np.testing.assert_array_equal(parameter.grad, fresh_state.parameters[name].grad, err_msg=name)


def test_a_failed_accumulating_step_leaves_the_accumulated_gradients(regression, rng):
    state, module, _ = open_module(regression, optimizer=False, check_finite=True)
    x, t = regression_batch(rng)
    module(x, t)  # from reset, in place
    module(x, t)  # accumulated, into spares
    grads = {name: p.grad for name, p in state.parameters}
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(FloatingPointError, match="train step 3"):
        module(bad, t)
    for name, parameter in state.parameters:
        np.testing.assert_array_equal(parameter.grad, grads[name], err_msg=name)


def test_gradients_another_module_left_stay_visible_when_its_step_fails(regression, rng):
    state = api.CheckpointState.load_checkpoint(regression["checkpoint"])
    first = api.Module(regression["training_model"], state)
    second = api.Module(regression["training_model"], state, check_finite=True)
    reset_runs = count_runs(second._reset.session)
    x, t = regression_batch(rng)
    first(x, t)  # ready: the state's gradients, which the second module's steps add to
    grads = {name: p.grad for name, p in state.parameters}
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(FloatingPointError):
        second(bad, t)
    assert reset_runs[0] == 0
    for name, parameter in state.parameters:
        np.testing.assert_array_equal(parameter.grad, grads[name], err_msg=name)
    second.lazy_reset_grad()  # the state's reset: the second module's next step starts from it
    second(x, t)
    for name, parameter in state.parameters:  # the same batch from reset: the same gradients
        np.testing.assert_array_equal(parameter.grad, grads[name], err_msg=name)
    second(x, t)
    for name, parameter in state.parameters:  # and the next adds to them
        np.testing.assert_allclose(parameter.grad, 2 * grads[name], rtol=1e-6, err_msg=name)
