"""The epochs of one run: batches, the optimizer steps, validation, early stopping, and saving where it stands.

:class:`Loop` keeps ``record`` (:class:`~onnxtrain.loop.record.RunRecord`)
equal to where the saved state would stand after every step, so that a save
at any point (every ``checkpoint_every`` steps, after an epoch, on Ctrl-C,
when the reader of the output goes away) writes parameters, optimizer state
and record that belong together. With early stopping, the state after the
epoch with the lowest validation loss also goes to the best checkpoint; the
run stops once ``patience`` epochs have passed without a lower one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from onnxtrain.distributed import batch_shares
from onnxtrain.loop.batches import batch_count, epoch_order
from onnxtrain.loop.files import remove_checkpoint
from onnxtrain.loop.interrupts import DeferredInterrupt, ImmediateInterrupt
from onnxtrain.loop.metrics import Accuracy
from onnxtrain.loop.record import EpochLosses, RunRecord
from onnxtrain.loop.settings import Settings
from onnxtrain.progress import Progress
from onnxtrain.training import Module, Optimizer, TrainingState
from onnxtrain.training.batch_step import BatchRates, BatchStep
from onnxtrain.training.ranks import sum_over_ranks

Echo = Callable[[str], None]


@dataclass(frozen=True)
class RunResult:
    """Where the run ended (its record), the checkpoint holding it, and the optimizer steps this call took."""

    record: RunRecord
    checkpoint: Path
    steps: int


@dataclass(frozen=True)
class Rows:
    """The rows of ``arrays`` (one array per user input) that a part of the run uses: training or validation."""

    arrays: list[np.ndarray]
    rows: np.ndarray

    def batch(self, rows: np.ndarray) -> list[np.ndarray]:
        """The arrays' values at ``rows``."""
        return [array[rows] for array in self.arrays]


@dataclass(frozen=True)
class Measures:
    """What the loop measures besides the loss: the accuracy of the training and of the eval model's outputs."""

    train: Accuracy | None = None
    val: Accuracy | None = None


class TrainingInterrupted(KeyboardInterrupt):
    """A ``KeyboardInterrupt`` during a run, after the state of the last completed step was saved."""

    def __init__(self, record: RunRecord, checkpoint: Path) -> None:
        super().__init__(f"interrupted at {record.position()}; the state is saved in {checkpoint}")
        self.record = record
        self.checkpoint = checkpoint


class Loop:
    """One run's loop; ``record`` is always where the saved state would stand."""

    def __init__(
        self,
        module: Module,
        optimizer: Optimizer,
        state: TrainingState,
        path: Path,
        record: RunRecord,
        data: tuple[Rows, Rows],
        comm: Any = None,
        *,
        measures: Measures | None = None,
        best_path: Path | None = None,
        replaced: Sequence[Path] = (),
    ) -> None:
        self.module, self.optimizer, self.state, self.path = module, optimizer, state, path
        self.comm = comm  # an MPI communicator: this rank trains on its part of every batch
        self.record = record
        self.training, self.validation = data
        self.measures = measures or Measures()
        self.best_path = best_path  # with early stopping: where the state of the best epoch goes
        # checkpoints of the earlier run this one replaces, removed when it first saves: a run that fails before
        # then leaves the earlier run as it was
        self._replaced = list(replaced)
        # the record of the step under way and the step count it is for: once optimizer.step() has counted
        # that step, it is the current one even if an interrupt came before `record` was updated
        self._next: tuple[RunRecord, int] | None = None
        self._saved_at: tuple[int, int, int] | None = None
        self._saved: RunRecord | None = None  # the record in the trained checkpoint, once this run wrote it
        self.interrupt = DeferredInterrupt()  # Ctrl-C is taken between steps

    def run(
        self, settings: Settings, echo: Echo | None, every: int, val_label: str, progress: bool | None, fresh: bool
    ) -> RunResult:
        start = self.optimizer.step_count
        self._saved = None if fresh else self.record  # a resumed run starts from what the checkpoint holds
        with self.interrupt:
            try:
                for epoch in range(self.record.epoch, settings.epochs):
                    started = time.perf_counter()
                    self._train_epoch(epoch, settings, progress)
                    entry = self._finish_epoch(epoch)
                    stopping = self.record.stopped_early
                    shown = entry.epoch in (1, settings.epochs) or entry.epoch % max(every, 1) == 0 or stopping
                    if echo is not None and shown:
                        echo(_line(entry, settings.epochs, val_label, time.perf_counter() - started))
                    if self.best_path is not None and self.record.best is entry:
                        self.save(self.best_path)
                    if settings.checkpoint_every is None:
                        self.save()
                    if stopping:
                        if echo is not None:
                            echo(stopped_line(self.record, self.best_path, val_label))
                        break
                    self.interrupt.check()
                self.save()
            except ImmediateInterrupt:  # the state may be halfway through a step: the last checkpoint stands
                if self._saved is None:
                    raise
                raise TrainingInterrupted(self._saved, self.path) from None
            except KeyboardInterrupt:
                self.save()
                raise TrainingInterrupted(self.record, self.path) from None
            except BrokenPipeError:  # the reader of the output went away (between steps): keep what was done
                self.save()
                raise
        return RunResult(self.record, self.path, self.optimizer.step_count - start)

    def _train_epoch(self, epoch: int, settings: Settings, progress: bool | None) -> None:
        rows = self.training.rows[epoch_order(len(self.training.rows), settings.seed, epoch)]
        size = settings.batch_size
        if self.comm is not None:  # this rank's part of every batch; the same number of batches on every rank
            size //= self.comm.Get_size()
            rows = batch_shares(rows, size, comm=self.comm)
        count = batch_count(len(rows), size)
        # each batch stepped as every loop of onnxtrain steps it (the optimizer's scheduler after each update);
        # with accumulation, a step per group of batches, which the record counts once the step is taken: a save
        # within a group holds the state and record of the group's start, from where a resume takes it again
        accumulate = settings.accumulate
        step = BatchStep(self.module, self.optimizer, BatchRates(self.optimizer), accumulate, count)
        pending = self.record  # the record with the batches of the group under way
        with Progress(count, f"epoch {epoch + 1}/{settings.epochs}", enabled=progress) as bar:
            bar.update(self.record.batch)
            for index in range(self.record.batch, count):
                self.interrupt.check()
                inputs = self.training.batch(rows[index * size : (index + 1) * size])
                outputs = step.train(inputs)
                loss = _loss(outputs)
                weighted, samples = loss * len(inputs[0]), len(inputs[0])
                correct, counted = (0, 0) if self.measures.train is None else self.measures.train.count(outputs, inputs)
                if self.comm is not None:  # the batch's figures over all ranks: the same record everywhere
                    summed = sum_over_ranks([weighted, samples, correct, counted], self.comm)
                    weighted, samples, correct, counted = float(summed[0]), *(int(value) for value in summed[1:])
                    loss = weighted / samples
                pending = replace(
                    pending, batch=index + 1, loss_sum=pending.loss_sum + weighted,
                    loss_samples=pending.loss_samples + samples, correct=pending.correct + correct,
                    counted=pending.counted + counted,
                )  # fmt: skip
                bar.update()
                bar.describe(f"loss {loss:.4f}")
                if not step.ends_step(index):
                    continue
                self._next = (pending, self.optimizer.step_count + 1)
                step.update(index)
                self.record, self._next = pending, None
                every = settings.checkpoint_every
                if every is not None and self.optimizer.step_count % every == 0:
                    self.save()

    def _finish_epoch(self, epoch: int) -> EpochLosses:
        record = self.record
        train_loss = record.loss_sum / record.loss_samples if record.loss_samples else math.nan
        train_accuracy = record.correct / record.counted if record.counted else None
        val_loss, val_accuracy = self._validation(record.batch_size)
        entry = EpochLosses(epoch + 1, train_loss, val_loss, train_accuracy, val_accuracy)
        self.record = replace(
            record, epoch=epoch + 1, batch=0, loss_sum=0.0, loss_samples=0, correct=0, counted=0,
            history=(*record.history, entry),
        )  # fmt: skip
        return entry

    def _validation(self, size: int) -> tuple[float | None, float | None]:
        """The validation loss and accuracy (``None`` without validation data, or without an accuracy)."""
        rows = self.validation.rows
        if not len(rows):
            return None, None
        self.module.eval()
        total, correct, counted = 0.0, 0, 0
        try:
            for start in range(0, len(rows), size):
                inputs = self.validation.batch(rows[start : start + size])
                outputs = self.module(*inputs)
                total += _loss(outputs) * len(inputs[0])
                if self.measures.val is not None:
                    right, seen = self.measures.val.count(outputs, inputs)
                    correct, counted = correct + right, counted + seen
        finally:
            self.module.train()
        return total / len(rows), (correct / counted if counted else None)

    def save(self, path: Path | None = None) -> None:
        """Write the state and the record of the last completed step atomically: to the trained checkpoint (with
        the optimizer state), or to ``path`` (the best checkpoint: the parameters and the record)."""
        if self._next is not None and self.optimizer.step_count == self._next[1]:
            self.record, self._next = self._next[0], None  # interrupted after optimizer.step() counted the step
        where = (self.optimizer.step_count, self.record.epoch, self.record.batch)
        if path is None and where == self._saved_at:
            return
        for name, value in self.record.to_properties().items():
            self.state.properties[name] = value
        if self.comm is None or self.comm.Get_rank() == 0:  # the ranks hold the same state: rank 0 writes it
            written = path or self.path
            TrainingState.save_checkpoint(self.state, written, include_optimizer_state=path is None)
            for earlier in self._replaced:
                if earlier != written:  # the one just written over is this run's now
                    remove_checkpoint(earlier)
        self._replaced = []
        if path is None:
            self._saved_at, self._saved = where, self.record


def _loss(outputs: np.ndarray | tuple[np.ndarray, ...]) -> float:
    """The loss (the first output) as a Python float; the mean of a loss with ``reduction="none"``."""
    value = outputs[0] if isinstance(outputs, tuple) else outputs
    return float(np.asarray(value).mean())


def measured(entry: EpochLosses, val_label: str = "val") -> str:
    """``train loss 0.1234, accuracy 91.2%, val loss 0.2345, val accuracy 88.0%`` (what the epoch has)."""
    text = f"train loss {entry.train_loss:.4f}"
    if entry.train_accuracy is not None:
        text += f", accuracy {entry.train_accuracy:.1%}"
    if entry.val_loss is not None:
        text += f", {val_label} loss {entry.val_loss:.4f}"
    if entry.val_accuracy is not None:
        text += f", {val_label} accuracy {entry.val_accuracy:.1%}"
    return text


def stopped_line(record: RunRecord, best_path: Path | None, val_label: str = "val") -> str:
    """``stopped early after epoch 9: no lower val loss for 3 epochs; the best, epoch 6 (...), is in ...``."""
    best = record.best
    assert best is not None and best.val_loss is not None
    where = "" if best_path is None else f", is in {best_path}"
    return (
        f"stopped early after epoch {record.epoch}: no lower {val_label} loss for {record.patience} epoch"
        f"{'' if record.patience == 1 else 's'}; the best, epoch {best.epoch} ({val_label} loss "
        f"{best.val_loss:.4f}){where}"
    )


def _line(entry: EpochLosses, epochs: int, val_label: str, seconds: float) -> str:
    """``epoch 3/10: train loss 0.1234, accuracy 91.2%, val loss 0.2345, val accuracy 88.0% (0.8 s)``."""
    took = f"{seconds:.1f} s" if seconds >= 1 else f"{seconds * 1000:.0f} ms"
    return f"epoch {entry.epoch}/{epochs}: {measured(entry, val_label)} ({took})"


__all__ = ["Echo", "Loop", "Measures", "Rows", "RunResult", "TrainingInterrupted", "measured", "stopped_line"]
