"""Passes as timed calls and the counted pass of :mod:`benchmarks.measure`, on stand-in steps (no framework).

Timings are never asserted, only counts and what the figures add up to.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.measure import RunCounter, counted_pass, time_steps
from benchmarks.workers.ort_training_worker import Counted


def test_a_pass_per_call_gives_its_first_losses_and_is_timed_per_step():
    calls: list[int] = []

    def epoch(i: int) -> np.ndarray:
        calls.append(i)
        return np.arange(4, dtype=np.float64) + 10 * i  # the losses of 4 batches

    result = time_steps(epoch, 1, 2, 3, per_call=4)
    assert calls == list(range(8))  # 1 warm-up pass, 3 repeats of 2, the last call
    assert result["first_losses"] == [0.0, 1.0, 2.0]  # the first 3 batches of the first pass
    assert result["final_loss"] == 73.0 and result["next_call"] == 8
    assert len(result["us_per_step_repeats"]) == 3


def test_a_pass_must_warm_up_at_least_the_checked_steps():
    with pytest.raises(ValueError, match="warm-up"):
        time_steps(lambda i: np.zeros(2), 1, 1, 1, per_call=2)


class _Native:
    """A stand-in for a pybind11 object of onnxruntime-training."""

    def __init__(self) -> None:
        self.trained: list[int] = []

    def train_step(self, x: int) -> int:
        self.trained.append(x)
        return x + 1

    def lazy_reset_grad(self) -> str:
        return "reset"


def test_the_counted_pass_counts_the_wrapped_runs_per_step_and_splits_the_time():
    counter = RunCounter()
    counter.calibrate(calls=100)
    native = _Native()
    module = Counted(native, "Module", ("train_step", "eval_step"), counter)
    assert not hasattr(module, "eval_step")  # only what the object has
    assert module.train_step(1) == 2 and module.lazy_reset_grad() == "reset"
    assert counter.calls == {"Module.train_step": 1}

    def step(i: int) -> None:
        module.train_step(i)
        module.train_step(i)
        module.lazy_reset_grad()  # not a run: not counted

    counted = counted_pass(step, 5, 3, counter, per_call=2)
    assert native.trained == [1, 5, 5, 6, 6, 7, 7]
    assert counted["counted_steps"] == 6
    assert counted["runs_per_step"] == 1.0 and counted["runs_by_label"] == {"Module.train_step": 1.0}
    assert list(counted["us_inside_by_label"]) == ["Module.train_step"]
    assert counted["us_inside_by_label"]["Module.train_step"] == pytest.approx(counted["us_inside_runs_per_step"])
    inside, outside, wrappers = (
        counted["us_inside_runs_per_step"],
        counted["us_outside_runs_per_step"],
        counter.wrapper_s * 1e6,
    )
    assert inside + outside + wrappers == pytest.approx(counted["us_counted_step"])
