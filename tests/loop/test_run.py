"""The loop as a library: arrays instead of files, progress bars on request, settings checked."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest

from onnxtrain import artifacts, checkpoint
from onnxtrain.loop import ArtifactFiles, RunRecord, Settings, train
from tests.cli.helpers import classification, tiny_mlp


@pytest.fixture
def files(tmp_path: Path) -> ArtifactFiles:
    model = tiny_mlp()
    artifacts.generate_artifacts(
        model, requires_grad=[t.name for t in model.graph.initializer], loss="CrossEntropyLoss", optimizer="SGD",
        artifact_directory=tmp_path,
    )  # fmt: skip
    return ArtifactFiles(tmp_path)


def test_arrays_and_echoed_lines(files: ArtifactFiles):
    lines: list[str] = []
    result = train(files, classification(), Settings(3, 20, learning_rate=0.1), echo=lines.append, report_every=2)
    assert result.steps == 18 and result.checkpoint == files.trained_checkpoint
    assert lines[0].startswith("training from") and "learning rate 0.1" in lines[0]
    assert [line.split(":")[0] for line in lines[1:]] == ["epoch 1/3", "epoch 2/3", "epoch 3/3"]
    assert [entry.epoch for entry in result.record.history] == [1, 2, 3]


def test_progress_bars_when_asked(files: ArtifactFiles):
    drawn = io.StringIO()
    with contextlib.redirect_stdout(drawn):
        train(files, classification(), Settings(1, 20), echo=None, progress=True)
    assert "%|" in drawn.getvalue() or "it/s" in drawn.getvalue() or "\r" in drawn.getvalue()


def test_no_output_when_quiet(files: ArtifactFiles, capsys: pytest.CaptureFixture[str]):
    train(files, classification(), Settings(1, 20), echo=None)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"epochs": 0, "batch_size": 1}, "epochs"),
        ({"epochs": 1, "batch_size": 0}, "batch_size"),
        ({"epochs": 1, "batch_size": 1, "seed": -1}, "seed"),
        ({"epochs": 1, "batch_size": 1, "val_split": 1.0}, "val_split"),
        ({"epochs": 1, "batch_size": 1, "checkpoint_every": 0}, "checkpoint_every"),
        ({"epochs": 1, "batch_size": 1, "learning_rate": float("nan")}, "learning rate"),
        ({"epochs": 1, "batch_size": 1, "accumulate": 0}, "accumulate"),
    ],
)
def test_settings_are_checked(settings: dict[str, object], message: str):
    with pytest.raises(ValueError, match=message):
        Settings(**settings)  # type: ignore[arg-type]


def test_a_checkpoint_of_another_model(files: ArtifactFiles):
    state = checkpoint.load(files.checkpoint)
    extra = {**state.trainable, "extra": np.zeros(2, np.float32)}
    checkpoint.save(checkpoint.CheckpointState(extra), files.checkpoint)
    with pytest.raises(ValueError, match=r"\['extra'\] that the training model does not take"):
        train(files, classification(), Settings(1, 20), echo=None)
    assert not files.trained_checkpoint.exists()


def test_a_reader_gone_away_saves_the_run_before_the_error(files: ArtifactFiles):
    """An echo that raises BrokenPipeError (``onnxtrain train ... | head``) leaves the state of the epochs done."""
    lines: list[str] = []

    def echo(line: str) -> None:
        if line.startswith("epoch 2/"):
            raise BrokenPipeError(32, "Broken pipe")
        lines.append(line)

    with pytest.raises(BrokenPipeError):
        train(files, classification(), Settings(5, 20), echo=echo)
    record = RunRecord.from_properties(checkpoint.load(files.trained_checkpoint).properties)
    assert record is not None and (record.epoch, record.batch) == (2, 0)
    assert checkpoint.load(files.trained_checkpoint).optimizer.step == 12
