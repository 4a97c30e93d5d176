"""The line a run starts with says what it trains on, and on several ranks which rows each epoch leaves out."""

from __future__ import annotations

from pathlib import Path

from onnxtrain.loop.record import RunRecord
from onnxtrain.loop.run import _start_line

RECORD = RunRecord(epochs=2, seed=0, val_split=0.0, batch_size=8, samples=183, data="", learning_rate=0.01)


def test_one_process_trains_on_every_sample() -> None:
    line = _start_line(RECORD, Path("run"), 183, 0, 0, None)
    assert line == "training from run: 183 samples, 23 batches of 8 per epoch, learning rate 0.01"


def test_ranks_say_the_samples_beyond_a_multiple_of_them_are_left_out_of_each_epoch() -> None:
    """``batch_shares`` gives every rank an equal part of each batch, so 183 rows on 2 ranks train as 182 (a
    different row left out each epoch); the command said "183 samples" and trained on 182."""
    line = _start_line(RECORD, Path("run"), 183, 0, 0, None, ranks=2)
    assert "183 samples (1 left out of each epoch, drawn anew each time: the 2 ranks take equal parts" in line
    assert "left out" not in _start_line(RECORD, Path("run"), 184, 0, 0, None, ranks=2)
    assert "(2 left out of each epoch" in _start_line(RECORD, Path("run"), 182, 0, 0, None, ranks=4)
