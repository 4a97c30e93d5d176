"""Progress bars: drawn on a terminal or when asked, never into a pipe or a log."""

from __future__ import annotations

import io

import pytest

from onnxtrain.progress import Progress, stdout_is_terminal


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_bar_when_stdout_is_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    assert not stdout_is_terminal()  # pytest captures standard output
    with Progress(3, "epoch") as bar:
        assert not bar.shown
        bar.update()
        bar.describe("loss 0.1")
        bar.write("epoch 1/3: train loss 0.1")
    assert capsys.readouterr().out == "epoch 1/3: train loss 0.1\n"


def test_a_bar_on_a_terminal_and_lines_above_it(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal()
    monkeypatch.setattr("sys.stdout", terminal)
    with Progress(2, "epoch", leave=True) as bar:
        assert bar.shown
        bar.update(2)
        bar.write("done")
    text = terminal.getvalue()
    assert "epoch" in text and "2/2" in text and "done\n" in text


def test_enabled_forces_the_bar_either_way(capsys: pytest.CaptureFixture[str]) -> None:
    with Progress(1, "fit", enabled=True, leave=True) as bar:
        bar.update()
    assert "1/1" in capsys.readouterr().out
    terminal = Terminal()
    with Progress(1, "fit", enabled=False, file=terminal) as bar:
        assert not bar.shown
    assert terminal.getvalue() == ""
