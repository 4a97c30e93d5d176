"""The onnxruntime-training 1.19.2 environment that the interoperability tests drive in a subprocess.

``make ort-training`` builds ``.venv-ort-training`` with the newest CPython
<= 3.11 found (1.19.2 has no wheel for newer ones), or writes why it could
not into ``.venv-ort-training/UNAVAILABLE``. ``ONNXTRAIN_ORT_TRAINING_PYTHON``
names another interpreter.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-ort-training"


def ort_training_python(venv: Path | None = None) -> Path:
    """The onnxruntime-training interpreter, or skip saying why there is none."""
    override = os.environ.get("ONNXTRAIN_ORT_TRAINING_PYTHON")
    if override:
        return Path(override)
    venv = VENV if venv is None else venv
    unavailable = venv / "UNAVAILABLE"
    if unavailable.exists():
        pytest.skip(f"onnxruntime-training is unavailable: {unavailable.read_text().strip()}")
    python = venv / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no onnxruntime-training environment at {venv}; create it with `make ort-training`")
    return python


def run_ort_side(script: Path, work: Path, timeout: float = 300) -> None:
    """Run ``script work`` with the onnxruntime-training interpreter; fail with its output if it fails."""
    result = subprocess.run(
        [str(ort_training_python()), str(script), str(work)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")},
    )
    assert result.returncode == 0, f"ORT side failed:\n{result.stdout}\n{result.stderr}"
