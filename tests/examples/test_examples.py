"""The example scripts run and do what they say."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_digits_demo_learns_the_digits(tmp_path: Path) -> None:
    """A few epochs of the demo: the exported model classifies most held-out digits."""
    pytest.importorskip("sklearn")
    accuracy = _load("digits_demo").main(tmp_path, epochs=3)
    assert accuracy > 0.85
    assert {p.name for p in tmp_path.iterdir()} >= {
        "training_model.onnx",
        "eval_model.onnx",
        "optimizer_model.onnx",
        "checkpoint",
        "digits.onnx",
    }


def test_custom_loss_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    _load("custom_loss").main()
    assert "loss on a random batch of 32" in capsys.readouterr().out
