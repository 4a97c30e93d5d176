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
    stored = replace(RECORD, val_split=float(np.float32(0.2)))  # as a checkpoint's float32 property gives it back
    assert stored.differences(replace(RECORD, val_split=0.3)) == ["validation split 0.2 (now 0.3)"]


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


def test_a_record_written_before_validation_files_schedules_and_accuracies(tmp_path: Path):
    """Records of an earlier onnxtrain lack val_data, schedule, patience, epoch_accuracy, accumulate and the
    accuracies."""
    properties = replace(RECORD, accumulate=4).to_properties()
    for name in ("val_data", "schedule", "patience", "epoch_accuracy", "accumulate"):
        del properties[f"onnxtrain.run.{name}"]
    properties["onnxtrain.run.history"] = '[{"epoch": 1, "train_loss": 0.5, "val_loss": null}]'
    record = RunRecord.from_properties(properties)
    assert record is not None
    assert (record.val_data, record.schedule, record.patience, record.correct, record.counted) == ("", "", 0, 0, 0)
    assert record.accumulate == 1  # a step per batch, as every run before the option
    assert record.history == (EpochLosses(1, 0.5, None, None, None),)


def test_the_best_epoch_and_early_stopping():
    history = (EpochLosses(1, 1.0, 0.5), EpochLosses(2, 0.9, 0.4), EpochLosses(3, 0.8, 0.4), EpochLosses(4, 0.7, 0.6))
    record = replace(RECORD, epoch=4, batch=0, history=history, patience=2)
    assert record.best == history[1]  # the first of equal losses
    assert record.stopped_early and record.finished
    assert not replace(record, patience=3).stopped_early
    assert not replace(record, patience=0).stopped_early
    assert replace(record, history=(EpochLosses(1, 1.0, None),)).best is None


def test_differences_in_validation_schedule_and_early_stopping():
    schedule = '{"kind": "cosine", "warmup_steps": 10, "min_lr": null, "step_size": null, "gamma": null}'
    assert RECORD.differences(replace(RECORD, val_data="f1")) == ["validation data none (now from a file)"]
    assert replace(RECORD, val_data="f1").differences(replace(RECORD, val_data="f2")) == ["other validation data"]
    assert RECORD.differences(replace(RECORD, schedule=schedule)) == [
        "learning-rate schedule constant (now cosine (warmup_steps 10))"
    ]
    assert RECORD.differences(replace(RECORD, patience=3)) == [
        "early stopping off (now after 3 epochs without improvement)"
    ]


def test_accumulation_differs_and_round_trips():
    assert RECORD.differences(replace(RECORD, accumulate=4)) == ["gradient accumulation off (now 4 batches a step)"]
    record = replace(RECORD, accumulate=4)
    assert RunRecord.from_properties(record.to_properties()) == record


def test_accuracy_counts_round_trip():
    record = replace(RECORD, correct=17, counted=20, history=(EpochLosses(1, 0.25, 0.5, 0.75, 1 / 3),))
    assert RunRecord.from_properties(record.to_properties()) == record
