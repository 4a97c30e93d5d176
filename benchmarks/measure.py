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
import math
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
#: ``--spinning``: each runtime's own defaults, or every session's intra-op threads spinning, or none.
SPINNING = ("default", "on", "off")
#: The session config entry that lets intra-op threads spin.
SPINNING_ENTRY = "session.intra_op.allow_spinning"


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
    step: Callable[[int], Any],
    warmup: int,
    steps: int,
    repeats: int,
    control: Control | None = None,
    *,
    per_call: int = 1,
) -> dict[str, Any]:
    """Run ``warmup`` calls, then ``repeats`` times ``steps`` timed calls; per-step times in microseconds.

    ``step(i)`` runs call ``i`` (counted from 0 over warm-up and all repeats,
    so each call sees the next batch) and returns its loss: one training step,
    or with ``per_call`` > 1 that many (a pass over the data), returning their
    losses. The time per step is a repeat's time over its ``steps * per_call``
    steps. The result has the median (the figure reported) and the minimum
    over the repeats, the losses of the first :data:`CHECKED_STEPS` steps and
    ``next_call``, the index of the first call not made. With a ``control``,
    each repeat waits for the parent's word (:class:`Control`).
    """
    if warmup < 1 or warmup * per_call < CHECKED_STEPS or steps < 1 or repeats < 1 or per_call < 1:
        raise ValueError(
            f"need warm-up steps >= {CHECKED_STEPS}, steps >= 1, repeats >= 1; "
            f"got {warmup} x {per_call}, {steps}, {repeats}"
        )
    losses: list[float] = []
    for i in range(warmup):
        loss = step(i)
        if len(losses) < CHECKED_STEPS:
            losses += _losses(loss)[: CHECKED_STEPS - len(losses)]
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
        per_step.append((clock() - start) / (steps * per_call) * 1e6)
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
        "final_loss": _losses(step(i))[-1],
        "next_call": i + 1,
    }


def _losses(value: Any) -> list[float]:
    """The loss or losses ``value`` holds, flattened (a step's loss, a pass's losses, or the first output)."""
    if hasattr(value, "tolist") and getattr(value, "ndim", 0) > 0:
        return [float(v) for v in _flat(value.tolist())]
    return [_scalar(value)]


def _flat(values: Any) -> list[Any]:
    return [x for v in values for x in _flat(v)] if isinstance(values, list) else [values]


def _scalar(value: Any) -> float:
    if hasattr(value, "item"):
        return float(value.item())
    if isinstance(value, (list, tuple)):
        return _scalar(value[0])
    return float(value)


class RunCounter:
    """Counts the calls into onnxruntime that run a model, by label, and the wall time spent inside them.

    :meth:`wrap` times a callable with ``perf_counter`` around it; only the
    counted pass (:func:`counted_pass`) runs wrapped calls, never the timed
    repeats. :meth:`calibrate` measures the wrapper's own time outside the
    timed span, which :func:`counted_pass` takes off the time outside.
    """

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.seconds: dict[str, float] = {}  # inside the runs, by label
        self.inside_s = 0.0
        self.wrapper_s = 0.0  # per call: the wrapper's time outside its own timed span

    def record(self, label: str, seconds: float) -> None:
        self.calls[label] = self.calls.get(label, 0) + 1
        self.seconds[label] = self.seconds.get(label, 0.0) + seconds
        self.inside_s += seconds

    def wrap(self, label: str, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function``, counted under ``label`` and timed."""
        clock, record = time.perf_counter, self.record

        def counted(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return function(*args, **kwargs)
            finally:
                record(label, clock() - start)

        return counted

    def reset(self) -> None:
        self.calls.clear()
        self.seconds.clear()
        self.inside_s = 0.0

    def calibrate(self, calls: int = 20000) -> None:
        """Measure :attr:`wrapper_s` on a wrapped no-op (the best of 5 rounds)."""
        noop = self.wrap("calibration", lambda: None)
        best = math.inf
        for _ in range(5):
            self.reset()
            start = time.perf_counter()
            for _ in range(calls):
                noop()
            best = min(best, (time.perf_counter() - start - self.inside_s) / calls)
        self.wrapper_s = max(0.0, best)
        self.reset()


def counted_pass(
    step: Callable[[int], Any], first: int, calls: int, counter: RunCounter, *, per_call: int = 1
) -> dict[str, Any]:
    """Run ``step(first)``, ... ``step(first + calls - 1)`` (``per_call`` steps each) with ``counter``'s wrappers
    installed; per step: the model runs by label, all of them, the µs inside them (all, and by label) and the µs
    outside them.

    Outside: the pass's wall time less the time inside the runs and the
    wrappers' own overhead, that is the Python (and whatever else is not a
    model run) of a step.
    """
    counter.reset()
    start = time.perf_counter()
    for i in range(first, first + calls):
        step(i)
    wall = time.perf_counter() - start
    steps = calls * per_call
    runs = sum(counter.calls.values())
    outside = wall - counter.inside_s - runs * counter.wrapper_s
    return {
        "counted_steps": steps,
        "runs_per_step": runs / steps,
        "runs_by_label": {label: count / steps for label, count in sorted(counter.calls.items())},
        "us_inside_runs_per_step": counter.inside_s / steps * 1e6,
        "us_inside_by_label": {label: seconds / steps * 1e6 for label, seconds in sorted(counter.seconds.items())},
        "us_outside_runs_per_step": outside / steps * 1e6,
        "us_counted_step": wall / steps * 1e6,
    }


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
    parser.add_argument(
        "--spinning",
        choices=SPINNING,
        default="default",
        help="intra-op threads spin (on), sleep (off), or as each runtime's defaults have it",
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
