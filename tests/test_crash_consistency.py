"""A kill at any instant of a write leaves the earlier file set or the new one, complete; the next write cleans up.

The worker (``tests/kill_points.py``) kills a forked writer right after each of
its file-system changes (every rename, link, unlink, mkdir, rmdir and fsync),
and at random moments; this module checks every folder it leaves: an artifact
set written over an earlier one (written by onnxtrain, or plain files copied
in), and checkpoints with external data over checkpoints with and without.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from onnxtrain import checkpoint
from tests.folders import leftovers, visible_files
from tests.kill_points import scenarios

ROOT = Path(__file__).resolve().parent.parent
RANDOM_KILLS = 8

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the crash tests fork a writer to kill it")


def _trials(scenario: str, folder: Path) -> list[dict]:
    completed = subprocess.run(
        [sys.executable, "-m", "tests.kill_points", scenario, str(folder), "--random", str(RANDOM_KILLS)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    return [json.loads(line) for line in completed.stdout.splitlines()]


@pytest.mark.parametrize("scenario", sorted(scenarios()))
def test_a_kill_at_any_instant_leaves_the_old_or_the_new_files(tmp_path: Path, scenario: str):
    trials = _trials(scenario, tmp_path)
    old, new = visible_files(tmp_path / "old"), visible_files(tmp_path / "new")
    assert old != new and old and new
    boundary = [trial for trial in trials if trial["k"] is not None]
    assert [trial["killed"] for trial in boundary] == [True] * (len(boundary) - 1) + [False]  # every boundary
    assert len(boundary) > 5
    assert sum(trial["killed"] for trial in trials if trial["k"] is None) >= RANDOM_KILLS // 2  # random moments
    seen = []
    for trial in trials:
        folder = Path(trial["folder"])
        files = visible_files(folder)
        assert files in (old, new), f"a mixed set after a kill: {trial}, {sorted(files)}"
        seen.append("new" if files == new else "old")
        if "checkpoint" in scenario:  # the checkpoint loads, with its data
            assert checkpoint.load(folder / "ckpt") in (checkpoint.load(tmp_path / n / "ckpt") for n in ("old", "new"))
    boundary_outcomes = seen[: len(boundary)]
    switch = boundary_outcomes.index("new")  # one switch: old before it, new from it on
    assert boundary_outcomes == ["old"] * switch + ["new"] * (len(boundary) - switch)
    assert leftovers(Path(boundary[-1]["folder"])) == []  # the write that was not killed left nothing behind

    write_new = scenarios()[scenario][1]
    for trial in trials:  # the next write recovers what a kill left behind
        folder = Path(trial["folder"])
        write_new(folder)
        assert visible_files(folder) == new
        assert leftovers(folder) == [], trial
