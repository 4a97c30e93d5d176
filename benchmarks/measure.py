"""Timing, memory and result plumbing shared by the workers (standard library only).

Every worker runs in its own process, so its peak RSS (:func:`peak_rss_mib`)
is that framework's on that workload alone. A worker prints exactly one result line,
``RESULT_PREFIX + json``; anything else it prints (warnings, logs) is ignored.
With ``--interleaved`` a ``train`` worker also speaks the line protocol of
:class:`Control`, through which :mod:`benchmarks.run` interleaves the timed
repeats of all frameworks of a workload.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

RESULT_PREFIX = "BENCHMARK-RESULT "
#: Losses of the first steps that the report compares across frameworks.
CHECKED_STEPS = 3
#: The interleaved protocol (:class:`Control`): what the worker prints, then what it reads.
READY = "BENCHMARK-READY"
REPEAT_PREFIX = "BENCHMARK-REPEAT "
GO = "GO"
FINISH = "FINISH"


def _status_mib(field: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, in MiB.

    ``VmHWM`` of /proc/self/status: the high-water mark of this process's own
    memory. Not ``ru_maxrss``: Linux carries it over ``fork`` and ``execve``,
    so a worker would report at least its parent's peak (the parent imports
    torch to export the models). ``ru_maxrss`` only where /proc is absent.
    """
    peak = _status_mib("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mib() -> float:
    """Current resident set size, in MiB (``VmRSS``; the peak where /proc is absent)."""
    current = _status_mib("VmRSS")
    return current if current is not None else peak_rss_mib()


def physical_cores() -> int:
    """Physical cores available to this process: what onnxruntime's default intra-op thread pool uses."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            cores.add(siblings.read_text().strip())
        except OSError:
            cores.add(str(cpu))
    return max(1, len(cores))


class Control:
    """The worker's side of the interleaved protocol (``--interleaved``): lines on its stdin and stdout.

    After its set-up and warm-up the worker prints ``BENCHMARK-READY``; before
    each timed repeat it waits for a line ``GO``, after it prints
    ``BENCHMARK-REPEAT <microseconds per step>``; before its last (untimed)
    step and its result line it waits for ``FINISH``. So the parent runs one
    worker at a time while the others block on their stdin. The parent reacts
    only to these prefixed lines: whatever else lands on stdout is ignored. A
    closed stdin or an unexpected line raises :class:`RuntimeError` (the
    worker then reports it as its error).
    """

    def __init__(self, commands: TextIO | None = None, replies: TextIO | None = None) -> None:
        self.commands = commands if commands is not None else sys.stdin
        self.replies = replies if replies is not None else sys.stdout

    def ready(self) -> None:
        self._say(READY)

    def repeat_done(self, us_per_step: float) -> None:
        self._say(f"{REPEAT_PREFIX}{us_per_step!r}")

    def wait_for(self, command: str) -> None:
        line = self.commands.readline()
        if line.strip() != command:
            got = f"got {line.strip()!r}" if line else "stdin closed"
            raise RuntimeError(f"interleaved protocol: expected {command!r}, {got}")

    def _say(self, line: str) -> None:
        self.replies.write(line + "\n")
        self.replies.flush()


def time_steps(
    step: Callable[[int], Any], warmup: int, steps: int, repeats: int, control: Control | None = None
) -> dict[str, Any]:
    """Run ``warmup`` steps, then ``repeats`` times ``steps`` timed steps; per-step times in microseconds.

    ``step(i)`` runs training step ``i`` (counted from 0 over warm-up and all
    repeats, so each step sees the next batch) and returns the loss. The
    result has the median (the figure reported) and the minimum over the
    repeats, and the losses of the first :data:`CHECKED_STEPS` steps. With a
    ``control``, each repeat waits for the parent's word (:class:`Control`).
    """
    if warmup < CHECKED_STEPS or steps < 1 or repeats < 1:
        raise ValueError(f"need warmup >= {CHECKED_STEPS}, steps >= 1, repeats >= 1; got {warmup}, {steps}, {repeats}")
    losses = []
    for i in range(warmup):
        loss = step(i)
        if i < CHECKED_STEPS:
            losses.append(_scalar(loss))
    per_step = []
    i = warmup
    clock = time.perf_counter
    if control is not None:
        control.ready()
    for _ in range(repeats):
        if control is not None:
            control.wait_for(GO)
        start = clock()
        for j in range(i, i + steps):
            step(j)
        per_step.append((clock() - start) / steps * 1e6)
        if control is not None:
            control.repeat_done(per_step[-1])
        i += steps
    if control is not None:
        control.wait_for(FINISH)
    median = statistics.median(per_step)
    return {
        "us_per_step": median,
        "us_per_step_min": min(per_step),
        "us_per_step_repeats": per_step,
        "steps_per_s": 1e6 / median,
        "first_losses": losses,
        "final_loss": _scalar(step(i)),
    }


def _scalar(value: Any) -> float:
    if hasattr(value, "item"):
        return float(value.item())
    if isinstance(value, (list, tuple)):
        return _scalar(value[0])
    return float(value)


def worker_arguments(description: str) -> argparse.ArgumentParser:
    """The command line every worker understands."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("command", choices=["generate", "train"])
    parser.add_argument("--folder", type=Path, required=True, help="the prepared workload (spec.json, model.onnx, ...)")
    parser.add_argument("--artifacts", type=Path, help="the artifact directory (generate writes it, train reads it)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=0, help="intra-op threads; 0: onnxruntime's default, physical cores for torch"
    )
    parser.add_argument(
        "--interleaved", action="store_true", help="train: pace the repeats by lines on stdin (see measure.Control)"
    )
    return parser


def control(args: argparse.Namespace) -> Control | None:
    """The :class:`Control` that ``time_steps`` gets: one with ``--interleaved``, else ``None``."""
    return Control() if getattr(args, "interleaved", False) else None


def emit(result: dict[str, Any]) -> None:
    """Print the result line (adds the process's peak RSS)."""
    result.setdefault("peak_rss_mib", peak_rss_mib())
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()


def run_worker(main: Callable[[argparse.Namespace], dict[str, Any]], parser: argparse.ArgumentParser) -> int:
    """Parse the command line, run ``main`` and emit its result, or ``{"error": ...}`` with exit status 1."""
    args = parser.parse_args()
    try:
        result = main(args)
    except Exception as error:  # reported, not hidden: the table shows "failed: <reason>"
        traceback.print_exc(file=sys.stderr)
        emit({"error": f"{type(error).__name__}: {_first_line(error)}"})
        return 1
    emit(result)
    return 0


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return (lines[0] if lines else "")[:300]


def parse_result(stdout: str) -> dict[str, Any] | None:
    """The result a worker printed, or ``None``."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    return None
