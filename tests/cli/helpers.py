"""Small models, data and checks for the ``onnxtrain`` command's tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import onnxtrain.onnxblock as onnxblock
from onnxtrain.cli import main

#: Features and classes of the tiny classification problem.
FEATURES, CLASSES = 4, 3


class TinyMLP(onnxblock.ForwardBlock):
    """x [batch, 4] -> Linear(4, hidden) -> Relu -> Linear(hidden, 3): class scores."""

    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.hidden = onnxblock.blocks.Linear(FEATURES, hidden, seed=0)
        self.relu = onnxblock.blocks.Relu()
        self.scores = onnxblock.blocks.Linear(hidden, CLASSES, seed=1)

    def build(self, x: str) -> str:
        return self.scores(self.relu(self.hidden(x)))


def tiny_mlp() -> onnx.ModelProto:
    """The :class:`TinyMLP` as a forward-only model with a symbolic batch dimension."""
    net = TinyMLP()
    with onnxblock.empty_base() as base:
        base.add_input("x", onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, ["batch", FEATURES]))
        net("x")
    return net.to_model_proto()


def classification(samples: int = 120, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(x float32 [N, 4], labels int64 [N])``: the class is how many of the first two features are positive."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, FEATURES)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0).astype(np.int64)


def cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    """``onnxtrain *argv`` in this process: ``(exit status, stdout, stderr)``."""
    status = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return status, out, err


def assert_error(err: str, subcommand: str, *fragments: str) -> None:
    """``err`` is one line, ``onnxtrain <subcommand>: error: ...``, with each fragment and no traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith(f"onnxtrain {subcommand}: error: "), lines[0]
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"


def assert_no_progress_bar(out: str) -> None:
    """Nothing a progress bar draws: carriage returns or tqdm's ``%|``."""
    assert "\r" not in out and "%|" not in out


def corrupt(path: Path, size: int = 256) -> Path:
    """Overwrite ``path`` with random bytes (a fixed seed; never valid protobuf or checkpoint data)."""
    path.write_bytes(b"\xff\xff" + np.random.default_rng(7).bytes(size))
    return path
