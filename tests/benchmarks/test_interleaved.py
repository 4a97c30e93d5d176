"""The interleaved protocol without any framework: :class:`benchmarks.measure.Control` and its parent's side.

The worker's side is driven through injected streams; the parent's side
(:func:`benchmarks.run.train_interleaved`) through stand-in workers
(:mod:`tests.benchmarks.paced_worker`) that log every step to a shared file.
Timings are never asserted.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from benchmarks import run
from benchmarks.measure import FINISH, GO, READY, REPEAT_PREFIX, Control, time_steps


class _Commands(io.StringIO):
    """The parent's lines, each read logged into ``events``."""

    def __init__(self, events: list[object], lines: str) -> None:
        super().__init__(lines)
        self.events = events

    def readline(self, size: int | None = -1) -> str:
        line = super().readline(-1 if size is None else size)
        self.events.append(f"read {line.strip()}" if line else "read EOF")
        return line


class _Replies(io.StringIO):
    """The worker's lines, each logged into ``events``."""

    def __init__(self, events: list[object]) -> None:
        super().__init__()
        self.events = events

    def write(self, text: str) -> int:
        self.events.append(text.strip())
        return super().write(text)


def test_each_repeat_waits_for_its_go_and_reports_its_time():
    events: list[object] = []

    def step(i: int) -> float:
        events.append(i)
        return 10.0 - i

    replies = _Replies(events)
    result = time_steps(step, 3, 2, 2, Control(_Commands(events, f"{GO}\n{GO}\n{FINISH}\n"), replies))
    repeats = [event for event in events if isinstance(event, str) and event.startswith(REPEAT_PREFIX)]
    assert len(repeats) == 2
    go, finish = f"read {GO}", f"read {FINISH}"
    assert events == [0, 1, 2, READY, go, 3, 4, repeats[0], go, 5, 6, repeats[1], finish, 7]
    assert [float(r[len(REPEAT_PREFIX) :]) for r in repeats] == result["us_per_step_repeats"]
    assert result["first_losses"] == [10.0, 9.0, 8.0] and result["final_loss"] == 3.0  # step 7, after FINISH
    assert replies.getvalue().splitlines()[0] == READY


@pytest.mark.parametrize(
    ("lines", "reason"),
    [("", "expected 'GO', stdin closed"), ("STOP\n", "expected 'GO', got 'STOP'"), ("GO\n", "'FINISH', stdin closed")],
)
def test_a_closed_or_unexpected_command_stops_the_worker(lines, reason):
    steps: list[int] = []
    with pytest.raises(RuntimeError, match=reason):
        time_steps(lambda i: steps.append(i) or 1.0, 3, 2, 1, Control(io.StringIO(lines), io.StringIO()))
    assert steps == ([0, 1, 2, 3, 4] if lines == "GO\n" else [0, 1, 2])  # no timed step without its GO


def test_without_control_nothing_is_printed(capsys):
    result = time_steps(lambda i: 1.0, 3, 2, 2)
    assert capsys.readouterr().out == "" and len(result["us_per_step_repeats"]) == 2


def _paced(monkeypatch, tmp_path: Path, names: list[str], repeats: int) -> tuple[dict[str, dict], list[str]]:
    """Train the stand-in workers ``names`` interleaved; their results and the steps they logged, in order."""
    monkeypatch.setattr(run, "WORKERS", dict.fromkeys(names, "tests.benchmarks.paced_worker"))
    monkeypatch.setattr(run, "SETTLE_S", 0.0)
    folder = tmp_path / "paced"
    folder.mkdir()
    settings = run.Settings(warmup=3, repeats=repeats, steps=2, quick=True, threads=1)
    trainers = {name: (Path(sys.executable), folder / f"artifacts-{name}") for name in names}
    results = run.train_interleaved(trainers, folder, settings, 2)
    log = folder / "steps.log"
    return results, log.read_text().splitlines() if log.exists() else []


def test_the_workers_warm_up_in_turn_then_take_rotating_turns_one_at_a_time(monkeypatch, tmp_path):
    names = ["a", "b", "c"]
    results, log = _paced(monkeypatch, tmp_path, names, repeats=4)
    expected = [f"{name} {i}" for name in names for i in range(3)]  # set-up and warm-up, one after the other
    for r in range(4):  # repeat r: a b c, b c a, c a b, a b c
        for name in names[r % 3 :] + names[: r % 3]:
            expected += [f"{name} {3 + 2 * r}", f"{name} {4 + 2 * r}"]
    expected += [f"{name} 11" for name in names]  # the last, untimed step, one after the other
    assert log == expected
    assert list(results) == names
    for name, result in results.items():
        assert "error" not in result, result
        assert result["framework"] == name and result["workload"] == "paced" and result["peak_rss_mib"] > 0
        assert len(result["us_per_step_repeats"]) == 4 and result["us_per_step_min"] == min(
            result["us_per_step_repeats"]
        )
        assert result["first_losses"] == [1.0, 1 / 2, 1 / 3] and result["final_loss"] == 1 / 12


def test_a_worker_that_fails_or_hangs_drops_out_and_the_others_go_on(monkeypatch, tmp_path):
    monkeypatch.setattr(run, "TIMEOUT", 3)
    names = ["a", "fails-setup", "fails-repeat", "hangs", "b"]
    results, log = _paced(monkeypatch, tmp_path, names, repeats=3)
    assert results["fails-setup"]["error"] == "RuntimeError: set-up failed"
    assert results["fails-repeat"]["error"] == "RuntimeError: step failed"
    assert results["hangs"]["error"] == "train ran over 3 s"
    assert "fails-setup 0" not in log and "fails-repeat 4" in log and "fails-repeat 5" not in log
    for name in ("a", "b"):
        assert "error" not in results[name] and len(results[name]["us_per_step_repeats"]) == 3
    timed = " ".join(line.split()[0] for line in log if int(line.split()[1]) >= 3)
    assert timed == (
        "a a fails-repeat fails-repeat b b"  # repeat 1: hangs hung, and was ended
        " b b a a"  # repeat 2: fails-repeat failed
        " b b a a"  # repeat 3
        " a b"  # the last steps
    )
