"""``onnxtrain demo``: the pipeline on scikit-learn's digits, end to end."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from onnxtrain import checkpoint
from tests.cli.helpers import assert_error, assert_no_progress_bar, cli
from tests.folders import visible_names

FILES = {
    "training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint", "trained_checkpoint",
    "digits.onnx", "loss_curve.png",
}  # fmt: skip


def test_two_epochs(capsys, tmp_path: Path):
    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    out_dir = tmp_path / "demo"
    status, out, err = cli(capsys, "demo", "--epochs", "2", "--out", out_dir)
    assert (status, err) == (0, "")
    assert set(visible_names(out_dir)) == FILES
    assert (out_dir / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    accuracy = next(line for line in out.splitlines() if "accuracy on 360 held-out digits" in line)
    assert float(accuracy.rsplit(" ", 1)[1].rstrip("%")) > 85
    assert "epoch 1/2: train loss" in out and "held-out loss" in out and "held-out accuracy" in out
    assert str(out_dir.resolve()) in out
    assert_no_progress_bar(out)
    assert checkpoint.load(out_dir / "trained_checkpoint").optimizer.step == 2 * 45  # 1,437 digits, batches of 32


def test_a_second_demo_in_the_same_folder_starts_again(capsys, tmp_path: Path):
    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    assert cli(capsys, "demo", "--epochs", "1", "--out", tmp_path)[0] == 0
    assert cli(capsys, "demo", "--epochs", "1", "--out", tmp_path)[0] == 0
    assert checkpoint.load(tmp_path / "trained_checkpoint").optimizer.step == 45


def test_without_the_extras(capsys, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # `import sklearn` raises ImportError
    status, out, err = cli(capsys, "demo", "--out", tmp_path / "demo")
    assert status == 1 and out == ""
    assert_error(err, "demo", 'pip install "onnxtrain[demo]"')
    assert not (tmp_path / "demo").exists()


def test_bad_epochs(capsys, tmp_path: Path):
    status, _, err = cli(capsys, "demo", "--epochs", "-1", "--out", tmp_path)
    assert status == 2
    assert_error(err, "demo", "--epochs")
