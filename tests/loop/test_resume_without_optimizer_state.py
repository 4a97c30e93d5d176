"""A run whose checkpoint was saved again without its optimizer state is not resumed: its moments would restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from onnxtrain import api, artifacts, checkpoint
from onnxtrain.loop import ArtifactFiles, Settings, train
from onnxtrain.training.state import OPTIMIZER_STATE_DROPPED
from tests.cli.helpers import classification, tiny_mlp


def test_resume_refuses_a_run_without_optimizer_state(tmp_path: Path):
    model = tiny_mlp()
    artifacts.generate_artifacts(
        model, requires_grad=[t.name for t in model.graph.initializer], loss="CrossEntropyLoss", optimizer="AdamW",
        artifact_directory=tmp_path,
    )  # fmt: skip
    files = ArtifactFiles(tmp_path)
    data = classification()
    train(files, data, Settings(1, 20), echo=None)
    state = api.CheckpointState.load_checkpoint(files.trained_checkpoint)
    api.CheckpointState.save_checkpoint(state, files.trained_checkpoint)  # ORT's default: no optimizer state
    saved = checkpoint.load(files.trained_checkpoint)
    assert saved.optimizer is None and saved.properties[OPTIMIZER_STATE_DROPPED] > 0
    with pytest.raises(ValueError, match=r"holds a training run \(epoch 1 of 1\) but no optimizer state") as caught:
        train(files, data, Settings(2, 20), resume=True, echo=None)
    assert "include_optimizer_state=True, or pass --restart" in str(caught.value)
