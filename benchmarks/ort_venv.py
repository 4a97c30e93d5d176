"""The onnxruntime-training 1.19.2 environment, created on first use.

onnxruntime-training conflicts with onnxruntime, ships wheels for CPython
<= 3.11 only and its Python package imports torch, so it gets its own virtual
environment: ``benchmarks/.venv-ort-training`` (ignored by git). ``python -m
benchmarks.ort_venv`` creates it (``make bench`` does); an environment that
cannot be built is a reason, reported in the table, not a crash.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

DEFAULT_VENV = Path(__file__).resolve().parent / ".venv-ort-training"
PACKAGES = ("onnxruntime-training-cpu==1.19.2", "onnx==1.16.2", "numpy<2", "torch==2.13.0")
PYTHONS = ("python3.11", "python3.10", "python3.9", "python3.8")
#: Written once the environment imports what the worker needs.
READY = ".ready"
CHECK = "import numpy, onnx, onnxruntime.training.api, onnxruntime.training.artifacts"


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def find_python() -> str | None:
    """The newest CPython that onnxruntime-training 1.19.2 has wheels for."""
    for name in PYTHONS:
        found = shutil.which(name)
        if found:
            return found
    return None


def ensure(venv: Path = DEFAULT_VENV, *, create: bool = True) -> tuple[Path | None, str]:
    """``(python, "")`` of a ready environment, or ``(None, reason)``; builds it first when ``create``."""
    python = python_of(venv)
    if (venv / READY).exists() and python.exists():
        return python, ""
    if python.exists() and _imports(python):  # built before, by hand or by an interrupted run
        (venv / READY).write_text(" ".join(PACKAGES) + "\n")
        return python, ""
    if not create:
        return None, f"{venv} is not set up (python -m benchmarks.ort_venv, or make bench)"
    interpreter = find_python()
    if interpreter is None:
        return None, "no CPython 3.8-3.11 found; onnxruntime-training 1.19.2 has no wheel for newer versions"
    print(f"creating {venv} with {interpreter}: {' '.join(PACKAGES)}", file=sys.stderr)
    steps = [
        [interpreter, "-m", "venv", "--clear", str(venv)],
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *PACKAGES],
        [str(python), "-c", CHECK],
    ]
    for command in steps:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
            return None, f"{' '.join(command[:4])} failed: {tail[0]}"
    (venv / READY).write_text(" ".join(PACKAGES) + "\n")
    return python, ""


def _imports(python: Path) -> bool:
    return subprocess.run([str(python), "-c", CHECK], capture_output=True, check=False).returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    args = parser.parse_args(argv)
    python, reason = ensure(args.venv)
    if python is None:
        print(f"onnxruntime-training unavailable: {reason}; the benchmark will report it", file=sys.stderr)
    else:
        print(python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
