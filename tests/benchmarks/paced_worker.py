"""A stand-in ``train`` worker for the interleaved protocol: no framework, a step that logs its calls.

Run as ``python -m tests.benchmarks.paced_worker train --folder F --artifacts F/artifacts-NAME ...``,
which :func:`benchmarks.run.train_interleaved` does where ``run.WORKERS`` maps ``NAME`` to this module.
Every step appends ``NAME i`` to ``F/steps.log`` and returns ``1 / (i + 1)``. ``NAME`` picks a failure:
``fails-setup`` raises before its warm-up, ``fails-repeat`` in its second repeat, ``hangs`` sleeps
through its first; any other name steps normally. It prints some noise on stdout, as frameworks do.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from benchmarks.measure import control, run_worker, time_steps, worker_arguments


def main(args: argparse.Namespace) -> dict[str, Any]:
    name = args.artifacts.name.removeprefix("artifacts-")
    print("noise, then a marker not at the start of its line: BENCHMARK-REPEAT 1.0", flush=True)
    if name == "fails-setup":
        raise RuntimeError("set-up failed")
    log = args.folder / "steps.log"

    def step(i: int) -> float:
        if name == "fails-repeat" and i == args.warmup + args.steps:
            raise RuntimeError("step failed")
        if name == "hangs" and i == args.warmup:
            time.sleep(3600)
        with log.open("a") as file:
            file.write(f"{name} {i}\n")
        if i == args.warmup:
            print("noise in a timed step", flush=True)
        return 1 / (i + 1)

    timing = time_steps(step, args.warmup, args.steps, args.repeats, control(args))
    return {"framework": name, "workload": args.folder.name, **timing}


if __name__ == "__main__":
    sys.exit(run_worker(main, worker_arguments(__doc__ or "")))
