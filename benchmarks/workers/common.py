"""What every worker reads from a prepared workload, and the ORT-style step they time (NumPy only).

After its timed repeats, a worker of an ONNX framework runs one more repeat's
worth of steps as a counted pass (:func:`count_runs`): its model runs wrapped,
counted and timed, so that the report can give the runs per step and the time
per step outside them. The timed repeats run nothing wrapped.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.measure import RunCounter, control, counted_pass, peak_rss_mib, rss_mib, time_steps

#: Wraps a framework's model runs with the counter's wrappers (``RunCounter.wrap``).
Instrument = Callable[[RunCounter], None]


def load_spec(folder: Path) -> dict[str, Any]:
    """``spec.json`` of the workload (see :class:`benchmarks.prepare.Spec`)."""
    return json.loads((folder / "spec.json").read_text())


def load_batches(folder: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """The batches as contiguous ``(x, y)`` pairs, cycled through by the steps."""
    with np.load(folder / "data.npz") as data:
        x, y = data["x"], data["y"]
    return [(np.ascontiguousarray(x[i]), np.ascontiguousarray(y[i])) for i in range(len(x))]


def load_rows(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """The data as one data set: ``x`` ``[batches * batch, ...]`` and ``y`` alike, batch after batch."""
    with np.load(folder / "data.npz") as data:
        x, y = data["x"], data["y"]
    return np.ascontiguousarray(x.reshape(-1, *x.shape[2:])), np.ascontiguousarray(y.reshape(-1, *y.shape[2:]))


def count_runs(
    step: Callable[[int], Any], first: int, calls: int, instrument: Instrument, *, per_call: int = 1
) -> dict[str, Any]:
    """The counted pass: ``calls`` calls of ``step`` from call ``first`` on, with ``instrument`` wrapping the
    model runs (for good: run it after the timed repeats); see :func:`benchmarks.measure.counted_pass`.

    The result carries the process's peak RSS as it was before the pass: the instruments' own memory (the
    object scan that finds the sessions, the wrappers) is not training's.
    """
    peak = peak_rss_mib()
    counter = RunCounter()
    counter.calibrate()
    instrument(counter)
    return {**counted_pass(step, first, calls, counter, per_call=per_call), "peak_rss_mib": peak}


class Stopwatch:
    """Wall time and memory at the marks of a worker: imports done, set-up done."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.marks: dict[str, float] = {}

    def mark(self, name: str) -> None:
        self.marks[f"{name}_s"] = time.perf_counter() - self.start
        self.marks[f"rss_after_{name}_mib"] = rss_mib()


def ort_style_step(module: Any, optimizer: Any, batches: list[tuple[np.ndarray, np.ndarray]]) -> Callable[[int], Any]:
    """Step ``i`` as a user of ONNX Runtime's training API writes it (onnxtrain.api has the same names):
    ``module(x, y); optimizer.step(); module.lazy_reset_grad()`` on batch ``i`` (cycled); returns the loss."""
    count = len(batches)

    def step(i: int) -> Any:
        x, y = batches[i % count]
        loss = module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
        return loss

    return step


def time_ort_style_training(
    args: argparse.Namespace,
    spec: dict[str, Any],
    batches: list[tuple[np.ndarray, np.ndarray]],
    watch: Stopwatch,
    module: Any,
    optimizer: Any,
    versions: dict[str, str],
    instrument: Instrument,
) -> dict[str, Any]:
    """Set the workload's learning rate, time :func:`ort_style_step` (``measure.time_steps``), count its runs
    (:func:`count_runs`, with ``instrument``), and return the worker's result; the same for onnxtrain and
    onnxruntime-training, whose APIs share these names."""
    optimizer.set_learning_rate(spec["learning_rate"])
    module.train()
    watch.mark("setup")
    step = ort_style_step(module, optimizer, batches)
    timing = time_steps(step, args.warmup, args.steps, args.repeats, control(args))
    counted = count_runs(step, timing.pop("next_call"), args.steps, instrument)
    return {
        "workload": spec["name"],
        "versions": versions,
        "threads": args.threads or "onnxruntime default",
        "spinning": args.spinning,
        **watch.marks,
        **timing,
        "peak_rss_mib": counted.pop("peak_rss_mib"),  # before the counted pass
        "counted": counted,
    }
