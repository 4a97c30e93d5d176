"""Learning-rate schedules: formulas at chosen steps, and schedulers driven by the optimizer's step count."""

from __future__ import annotations

import math

import numpy as np
import pytest

from onnxtrain import api
from onnxtrain.training import schedulers
from tests.training.helpers import open_module, regression_batch


@pytest.mark.parametrize(
    ("step", "factor"),
    [(0, 0.0), (1, 0.25), (2, 0.5), (4, 1.0), (5, 11 / 12), (10, 0.5), (16, 0.0), (20, 0.0)],
)
def test_linear_formula_is_onnxruntimes(step, factor):
    # warm-up 4, total 16: lr = initial * step / 4, then initial * (16 - step) / 12
    assert schedulers.linear_lr(step, 4, 16, 0.1) == pytest.approx(0.1 * factor, rel=1e-6)


def test_linear_formula_without_warmup_and_degenerate_totals():
    assert schedulers.linear_lr(0, 0, 10, 1.0) == 1.0
    assert schedulers.linear_lr(3, 0, 10, 1.0) == pytest.approx(0.7)
    assert schedulers.linear_lr(0, 5, 5, 1.0) == 0.0
    assert schedulers.linear_lr(5, 5, 5, 1.0) == 0.0  # max(1, total - warmup) guards the division


def test_linear_formula_rounds_as_float32():
    value = schedulers.linear_lr(1, 3, 10, 0.1)
    assert value == float(np.float32(0.1) * (np.float32(1) / np.float32(3)))


def test_cosine_step_exponential_formulas():
    assert schedulers.cosine_lr(0, 2, 12, 1.0, 0.1) == 0.0
    assert schedulers.cosine_lr(1, 2, 12, 1.0, 0.1) == 0.5
    assert schedulers.cosine_lr(2, 2, 12, 1.0, 0.1) == pytest.approx(1.0)
    assert schedulers.cosine_lr(7, 2, 12, 1.0, 0.1) == pytest.approx(0.1 + 0.9 * 0.5)
    assert schedulers.cosine_lr(12, 2, 12, 1.0, 0.1) == pytest.approx(0.1)
    assert schedulers.cosine_lr(50, 2, 12, 1.0, 0.1) == pytest.approx(0.1)
    assert schedulers.cosine_lr(4, 0, 8, 2.0) == pytest.approx(2.0 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert [schedulers.step_lr(s, 3, 1.0, 0.5) for s in (0, 2, 3, 5, 6)] == [1.0, 1.0, 0.5, 0.5, 0.25]
    assert schedulers.exponential_lr(3, 2.0, 0.5) == 0.25


def _train(module, optimizer, scheduler, rng, steps):
    rates = []
    for _ in range(steps):
        rates.append(optimizer.get_learning_rate())
        module(*regression_batch(rng))
        optimizer.step()
        scheduler.step()
        module.lazy_reset_grad()
    return rates


def test_linear_scheduler_arguments_are_in_the_documented_order(regression, rng):
    _, module, optimizer = open_module(regression)
    scheduler = api.LinearLRScheduler(optimizer, 2, 10, 0.1)  # (warm-up, total, initial lr)
    rates = _train(module, optimizer, scheduler, rng, 5)
    expected = [schedulers.linear_lr(s, 2, 10, 0.1) for s in range(5)]
    assert rates == pytest.approx(expected)
    assert rates[1] == pytest.approx(0.05)  # ORT's wrapper (warm-up 10, total 2) would give 0.01
    with pytest.raises(ValueError, match="less than warmup_step_count"):
        api.LinearLRScheduler(optimizer, 10, 2, 0.1)


def test_extra_schedulers_follow_their_formulas(regression, rng):
    cases = [
        (
            lambda o: api.CosineLRScheduler(o, 2, 6, 0.2, min_lr=0.02),
            lambda s: schedulers.cosine_lr(s, 2, 6, 0.2, 0.02),
        ),
        (lambda o: api.StepLRScheduler(o, 2, 0.2, gamma=0.5), lambda s: schedulers.step_lr(s, 2, 0.2, 0.5)),
        (lambda o: api.ExponentialLRScheduler(o, 0.2, 0.9), lambda s: schedulers.exponential_lr(s, 0.2, 0.9)),
    ]
    for make, formula in cases:
        _, module, optimizer = open_module(regression)
        rates = _train(module, optimizer, make(optimizer), rng, 7)
        assert rates == pytest.approx([float(np.float32(formula(s))) for s in range(7)])


def test_scheduler_step_without_optimizer_step_keeps_the_rate(regression):
    _, _, optimizer = open_module(regression)
    scheduler = api.LinearLRScheduler(optimizer, 0, 10, 1.0)
    scheduler.step()
    scheduler.step()
    assert optimizer.get_learning_rate() == 1.0  # the rate is a function of the optimizer's step count


def test_bad_scheduler_arguments(regression):
    _, _, optimizer = open_module(regression)
    with pytest.raises(TypeError, match="warmup_step_count"):
        api.LinearLRScheduler(optimizer, 1.5, 10, 0.1)
    with pytest.raises(ValueError, match="step_size"):
        api.StepLRScheduler(optimizer, 0, 0.1)
    with pytest.raises(ValueError, match="min_lr"):
        api.CosineLRScheduler(optimizer, 0, 10, 0.1, min_lr=0.5)
    with pytest.raises(TypeError, match="Optimizer"):
        api.LinearLRScheduler(object(), 0, 10, 0.1)


def test_a_second_scheduler_leaves_the_first_ones_initial_lr(regression, rng):
    """Before, making a scheduler overwrote the optimizer's initial rate, which every scheduler read: the first
    one's ``initial_lr`` became the second's, and its next ``step()`` set that rate."""
    _, module, optimizer = open_module(regression)
    first = api.LinearLRScheduler(optimizer, 0, 100, initial_lr=0.1)
    second = api.CosineLRScheduler(optimizer, 0, 10, initial_lr=1.0)
    assert first.initial_lr == pytest.approx(0.1) and second.initial_lr == 1.0
    assert optimizer.scheduler is second and optimizer.initial_learning_rate == 1.0  # ORT's: the latest's
    first.step()
    assert optimizer.get_learning_rate() == pytest.approx(0.1)  # its own schedule at step 0
    rates = _train(module, optimizer, first, rng, 3)
    assert rates == pytest.approx([schedulers.linear_lr(s, 0, 100, 0.1) for s in range(3)])
    second.step()
    assert optimizer.get_learning_rate() == pytest.approx(schedulers.cosine_lr(3, 0, 10, 1.0))
