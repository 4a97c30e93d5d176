"""Kill a write at every file-system boundary, and at random moments: the worker of the crash tests.

``python -m tests.kill_points SCENARIO FOLDER [--random N --seed S]`` writes
``FOLDER/old`` and ``FOLDER/new`` (the scenario's earlier and new file sets,
written normally), then, for k = 0, 1, 2, ..., copies ``old`` to
``FOLDER/k<k>`` and forks a child that writes the new set over it and kills
itself with SIGKILL right after its k-th call to a function that changes the
file system (``os.replace``, ``os.rename``, ``os.fsync``, ``os.symlink``,
``os.link``, ``os.unlink``, ``os.mkdir``, ``os.rmdir``) — until a child
finishes before its kill. With ``--random N`` it also runs children killed
by this process after a random delay within the write's duration (the
fastest of three, each boundary slowed by 1 ms so that the delays spread over
the write), until N kills land before their write ends (4N children at
most). It prints
one JSON line per trial: ``{"folder": ..., "killed": bool}``.

The worker imports onnxtrain once and forks (never after starting a thread),
so the trials cost milliseconds each; the tests check the folders.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from onnxtrain import artifacts, checkpoint
from tests.artifacts.models import FROZEN, REQUIRES_GRAD, dense

BOUNDARIES = ("replace", "rename", "fsync", "symlink", "link", "unlink", "mkdir", "rmdir")


def _artifacts(loss: str, optimizer: str, nominal: bool) -> Callable[[Path], None]:
    built = artifacts.build_artifacts(dense(), REQUIRES_GRAD, FROZEN, loss=loss, optimizer=optimizer)

    def write(folder: Path) -> None:
        artifacts.write_artifacts(built, folder, nominal_checkpoint=nominal)

    return write


def _plain_copy(write: Callable[[Path], None]) -> Callable[[Path], None]:
    """``write``, then every file replaced by a plain copy (a set copied with ``cp -L``, or written before
    file groups)."""

    def copy(folder: Path) -> None:
        staging = folder.with_name(folder.name + ".staging")
        write(staging)
        folder.mkdir(parents=True)
        for name in os.listdir(staging):
            if (staging / name).is_file() and not name.startswith(".onnxtrain."):
                shutil.copyfile(staging / name, folder / name)
        shutil.rmtree(staging)

    return copy


def _state(value: float, size: int) -> checkpoint.CheckpointState:
    weight = np.full(size, value, np.float32)
    return checkpoint.CheckpointState(
        {"w": weight}, {"f": np.arange(size, dtype=np.float64)},
        checkpoint.OptimizerState({"w": [weight, weight * 2]}, step=int(value)), {"epoch": int(value)},
    )  # fmt: skip


def _checkpoint(value: float, external: bool) -> Callable[[Path], None]:
    state = _state(value, 64 if external else 8)

    def write(folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        checkpoint.save(state, folder / "ckpt", external_data_threshold=0 if external else 10**9)

    return write


def scenarios() -> dict[str, tuple[Callable[[Path], None], Callable[[Path], None]]]:
    """``{name: (write the earlier set, write the new set over it)}``."""
    earlier = _artifacts("MSELoss", "AdamW", nominal=True)
    new = _artifacts("L1Loss", "SGD", nominal=False)  # another optimizer; no nominal checkpoint
    return {
        "artifacts": (earlier, new),
        "artifacts-over-plain-files": (_plain_copy(earlier), new),
        "checkpoint-external-over-external": (_checkpoint(1.0, True), _checkpoint(2.0, True)),
        "checkpoint-external-over-inline": (_checkpoint(1.0, False), _checkpoint(2.0, True)),
        "checkpoint-inline-over-external": (_checkpoint(1.0, True), _checkpoint(2.0, False)),
    }


def _kill_after(k: int, delay: float) -> None:
    """Make this process SIGKILL itself right after its k-th file-system change (never, for k = 0...:
    before the first); sleep ``delay`` seconds at each."""
    count = 0
    for name in BOUNDARIES:
        original = getattr(os, name)

        def boundary(*args: object, _original: Callable[..., object] = original, **kwargs: object) -> object:
            nonlocal count
            if delay:
                time.sleep(delay)
            result = _original(*args, **kwargs)
            count += 1
            if count == k:
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        setattr(os, name, boundary)
    if k == 0:
        os.kill(os.getpid(), signal.SIGKILL)


def _child(write: Callable[[Path], None], folder: Path, k: int | None, delay: float) -> int:
    """Fork a child that writes over ``folder`` (killing itself after boundary ``k``); its pid."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        try:
            if k is not None:
                _kill_after(k, delay)
            elif delay:
                _kill_after(-1, delay)
            write(folder)
        finally:
            os._exit(0)
    return pid


def _killed(pid: int) -> bool:
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=sorted(scenarios()))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--random", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    write_old, write_new = scenarios()[args.scenario]
    root: Path = args.folder
    write_old(root / "old")
    write_old(root / "new")
    write_new(root / "new")
    trials = []
    for k in range(10_000):
        folder = root / f"k{k}"
        write_old(folder)
        killed = _killed(_child(write_new, folder, k, 0.0))
        trials.append({"folder": str(folder), "killed": killed, "k": k})
        if not killed:
            break
    if args.random:
        rng = random.Random(args.seed)
        slow = 0.001
        durations = []
        for timing in range(3):  # the fastest of three writes: a machine under load spreads the others out
            folder = root / f"timing{timing}"
            write_old(folder)
            start = time.perf_counter()
            _killed(_child(write_new, folder, None, slow))
            durations.append(time.perf_counter() - start)
        duration = min(durations)
        landed = 0
        for trial in range(4 * args.random):  # until N kills land inside a write (a kill may come after its end)
            if landed >= args.random:
                break
            folder = root / f"r{trial}"
            write_old(folder)
            pid = _child(write_new, folder, None, slow)
            time.sleep(rng.uniform(0.0, duration))  # a random moment of the write, not a wait for something
            os.kill(pid, signal.SIGKILL)
            killed = _killed(pid)
            landed += killed
            trials.append({"folder": str(folder), "killed": killed, "k": None})
    for trial in trials:
        print(json.dumps(trial))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
