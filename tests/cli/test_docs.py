"""The examples of docs/cli.md run as written: its command lines through the command, its loss class as a file."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxtrain import checkpoint
from onnxtrain.artifacts.metadata import LOSS_KEY, read_metadata
from onnxtrain.loop import split
from tests.cli.docs import console_commands, python_example, section_commands
from tests.cli.helpers import classification, cli

HISTORY = "onnxtrain.run.history"


def _run(capsys: pytest.CaptureFixture[str], command: str) -> str:
    """Run a documented ``onnxtrain ...`` line; its output."""
    status, out, err = cli(capsys, *shlex.split(command)[1:])
    assert (status, err) == (0, ""), f"{command}: {err}"
    return out


def _linear_model() -> onnx.ModelProto:
    """``x float32[batch, 3] -> Gemm(w [3, 1], b [1]) -> y float32[batch, 1]``, opset 17."""
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"])], "linear",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 1])],
        [onnx.numpy_helper.from_array(np.full((3, 1), 0.1, np.float32), "w"),
         onnx.numpy_helper.from_array(np.zeros(1, np.float32), "b")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_example_session(capsys, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """docs/cli.md's session: inspect, generate, train on houses.csv, resume with more epochs, export."""
    monkeypatch.chdir(tmp_path)
    onnx.save(_linear_model(), "linear.onnx")
    rng = np.random.default_rng(0)
    features = rng.normal(size=(500, 3))
    price = 5 + features @ np.array([1.0, -0.5, 0.25]) + rng.normal(scale=0.1, size=500)
    np.savetxt("houses.csv", np.column_stack([features, price]), delimiter=",", fmt="%.5f",
               header="rooms,age,distance,price", comments="")  # fmt: skip
    commands = section_commands("An example session")
    assert [shlex.split(c)[1] for c in commands] == ["inspect", "generate", "train", "train", "export"]
    outputs = [_run(capsys, command) for command in commands]
    assert "400 samples (100 more held out for validation)" in outputs[2]
    assert "resuming linear/trained_checkpoint at epoch 20 of 30 (step 260)" in outputs[3]
    assert Path("linear-trained.onnx").is_file()


def test_the_custom_loss_from_a_file_trains(capsys, monkeypatch: pytest.MonkeyPatch, model_path: Path, tmp_path: Path):
    """docs/cli.md's loss class, saved as mse_plus_l1.py, in its generate command; then trained."""
    monkeypatch.chdir(tmp_path)
    Path("mse_plus_l1.py").write_text(python_example("# mse_plus_l1.py"))
    shutil.copy(model_path, "model.onnx")
    (command,) = console_commands("--loss mse_plus_l1.py:MSEPlusL1")
    _run(capsys, command)
    training = onnx.load("art/training_model.onnx")
    assert read_metadata(training)[LOSS_KEY] == "MSEPlusL1"
    assert [i.name for i in training.graph.input][:2] == ["x", "target"]
    x, labels = classification()
    np.savez("data.npz", X=x, y=np.eye(3, dtype=np.float32)[labels])
    _run(capsys, "onnxtrain train art --data data.npz --epochs 3 --batch-size 20 --lr 0.05")
    history = json.loads(str(checkpoint.load(tmp_path / "art" / "trained_checkpoint").properties[HISTORY]))
    assert history[-1]["train_loss"] < history[0]["train_loss"]


def test_validation_data_a_schedule_early_stopping_and_the_best_state(
    capsys, monkeypatch: pytest.MonkeyPatch, shared: Path, tmp_path: Path
):
    """docs/cli.md's early-stopping example, on the samples --val-split 0.2 would split (seed 0), as shown."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(shared / "art", "mlp")
    x, y = classification()
    train_rows, val_rows = split(len(x), 0.2, 0)
    np.savez("train.npz", X=x[train_rows], y=y[train_rows])
    np.savez("val.npz", X=x[val_rows], y=y[val_rows])
    (train,) = console_commands("--early-stopping")
    (export,) = console_commands("--checkpoint best")
    out = _run(capsys, train)
    assert "stopped early after epoch 26: no lower val loss for 3 epochs; the best, epoch 23" in out
    assert "wrote mlp.onnx with the parameters of mlp/best_checkpoint" in _run(capsys, export)
