"""Fixtures of the ``onnxtrain`` command's tests: a tiny model, its data and its artifacts."""

from __future__ import annotations

import contextlib
import io
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxtrain.cli import main
from tests.cli.helpers import classification, tiny_mlp


@pytest.fixture(scope="session")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with ``mlp.onnx``, ``data.npz`` (X, y) and the artifacts ``art`` (cross-entropy, AdamW, lr 0.05)."""
    folder = tmp_path_factory.mktemp("cli")
    onnx.save(tiny_mlp(), folder / "mlp.onnx")
    x, y = classification()
    np.savez(folder / "data.npz", X=x, y=y)
    argv = ["generate", str(folder / "mlp.onnx"), "--requires-grad", "all-float", "--loss", "ce"]
    with contextlib.redirect_stdout(io.StringIO()):  # not into the first test's capsys
        assert main([*argv, "--lr", "0.05", "-o", str(folder / "art")]) == 0
    return folder


@pytest.fixture
def model_path(shared: Path) -> Path:
    return shared / "mlp.onnx"


@pytest.fixture
def data_path(shared: Path) -> Path:
    return shared / "data.npz"


@pytest.fixture
def fresh_artifacts(shared: Path, tmp_path: Path) -> Callable[[str], Path]:
    """A function giving a private copy of the untrained artifacts, ``tmp_path / name``."""

    def copy(name: str = "art") -> Path:
        return Path(shutil.copytree(shared / "art", tmp_path / name))

    return copy


@pytest.fixture
def artifacts(fresh_artifacts: Callable[[str], Path]) -> Path:
    """A private copy of the untrained artifacts."""
    return fresh_artifacts("art")
