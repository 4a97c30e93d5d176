"""The run record round-trips through checkpoint properties exactly; damaged records are reported."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from onnxtrain import checkpoint
from onnxtrain.loop import EpochLosses, RunRecord, stored_learning_rate, with_learning_rate

RECORD = RunRecord(
    epochs=10, seed=3, val_split=0.2, batch_size=32, samples=1797, data="abc", learning_rate=0.01,
    epoch=2, batch=7, loss_sum=1 / 3, loss_samples=224,
    history=(EpochLosses(1, 0.1 + 0.2, 0.7), EpochLosses(2, 1e-17, None)),
)  # fmt: skip


def test_round_trip_through_a_checkpoint_file(tmp_path: Path):
    state = checkpoint.CheckpointState({"w": np.ones(2, np.float32)}, properties=RECORD.to_properties())
    checkpoint.save(state, tmp_path / "c")
    loaded = RunRecord.from_properties(checkpoint.load(tmp_path / "c").properties)
    assert loaded is not None
    assert (loaded.loss_sum, loaded.history) == (RECORD.loss_sum, RECORD.history)  # floats kept exactly
    assert loaded.val_split == pytest.approx(0.2) and loaded.learning_rate == pytest.approx(0.01)  # float32
    assert not loaded.differences(RECORD)


def test_positions_and_differences():
    assert RECORD.position() == "epoch 3 of 10, batch 7"
    assert replace(RECORD, batch=0).position() == "epoch 2 of 10"
    other = replace(RECORD, samples=100, batch_size=16)
    assert RECORD.differences(other) == ["number of samples 1797 (now 100)", "batch size 32 (now 16)"]
    assert RECORD.differences(replace(RECORD, data="xyz")) == ["the data's values"]


def test_no_record_and_damaged_records():
    assert RunRecord.from_properties({"other": 1}) is None
    with pytest.raises(ValueError, match=r"damaged: onnxtrain.run.seed"):
        RunRecord.from_properties({k: v for k, v in RECORD.to_properties().items() if not k.endswith(".seed")})
    with pytest.raises(ValueError, match="damaged"):
        RunRecord.from_properties({**RECORD.to_properties(), "onnxtrain.run.history": "[{"})


def test_the_learning_rate_property(tmp_path: Path):
    checkpoint.save(checkpoint.CheckpointState({"w": np.ones(2, np.float32)}), tmp_path / "c")
    assert stored_learning_rate(checkpoint.load(tmp_path / "c").properties) is None
    checkpoint.save(with_learning_rate(checkpoint.load(tmp_path / "c"), 0.5), tmp_path / "c")
    assert stored_learning_rate(checkpoint.load(tmp_path / "c").properties) == 0.5
    assert checkpoint.load(tmp_path / "c").trainable["w"].tolist() == [1, 1]
