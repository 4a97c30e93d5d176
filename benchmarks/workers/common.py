"""What every worker reads from a prepared workload, and the ORT-style step they time (NumPy only)."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.measure import control, rss_mib, time_steps


def load_spec(folder: Path) -> dict[str, Any]:
    """``spec.json`` of the workload (see :class:`benchmarks.prepare.Spec`)."""
    return json.loads((folder / "spec.json").read_text())


def load_batches(folder: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """The batches as contiguous ``(x, y)`` pairs, cycled through by the steps."""
    with np.load(folder / "data.npz") as data:
        x, y = data["x"], data["y"]
    return [(np.ascontiguousarray(x[i]), np.ascontiguousarray(y[i])) for i in range(len(x))]


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
) -> dict[str, Any]:
    """Set the workload's learning rate, time :func:`ort_style_step` (``measure.time_steps``), and return the
    worker's result; the same for onnxtrain and onnxruntime-training, whose APIs share these names."""
    optimizer.set_learning_rate(spec["learning_rate"])
    module.train()
    watch.mark("setup")
    timing = time_steps(
        ort_style_step(module, optimizer, batches), args.warmup, args.steps, args.repeats, control(args)
    )
    return {
        "workload": spec["name"],
        "versions": versions,
        "threads": args.threads or "onnxruntime default",
        **watch.marks,
        **timing,
    }
