"""The epochs of one run: batches, the optimizer steps, validation, and saving where the run stands.

:class:`Loop` keeps ``record`` (:class:`~onnxtrain.loop.record.RunRecord`)
equal to where the saved state would stand after every step, so that a save
at any point (every ``checkpoint_every`` steps, after an epoch, on Ctrl-C)
writes parameters, optimizer state and record that belong together.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from onnxtrain.distributed import batch_shares
from onnxtrain.loop.batches import batch_count, epoch_order
from onnxtrain.loop.interrupts import DeferredInterrupt, ImmediateInterrupt
from onnxtrain.loop.record import EpochLosses, RunRecord
from onnxtrain.loop.settings import Settings
from onnxtrain.progress import Progress
from onnxtrain.training import Module, Optimizer, TrainingState

Echo = Callable[[str], None]


@dataclass(frozen=True)
class RunResult:
    """Where the run ended (its record), the checkpoint holding it, and the optimizer steps this call took."""

    record: RunRecord
    checkpoint: Path
    steps: int


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
        arrays: list[np.ndarray],
        rows: tuple[np.ndarray, np.ndarray],
        comm: Any = None,
    ) -> None:
        self.module, self.optimizer, self.state, self.path = module, optimizer, state, path
        self.comm = comm  # an MPI communicator: this rank trains on its part of every batch
        self.record = record
        self.arrays = arrays
        self.train_rows, self.val_rows = rows
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
                if fresh:
                    self.save()
                for epoch in range(self.record.epoch, settings.epochs):
                    started = time.perf_counter()
                    self._train_epoch(epoch, settings, progress)
                    entry = self._finish_epoch(epoch)
                    if echo is not None and (entry.epoch in (1, settings.epochs) or entry.epoch % max(every, 1) == 0):
                        echo(_line(entry, settings.epochs, val_label, time.perf_counter() - started))
                    if settings.checkpoint_every is None:
                        self.save()
                    self.interrupt.check()
                self.save()
            except ImmediateInterrupt:  # the state may be halfway through a step: the last checkpoint stands
                if self._saved is None:
                    raise
                raise TrainingInterrupted(self._saved, self.path) from None
            except KeyboardInterrupt:
                self.save()
                raise TrainingInterrupted(self.record, self.path) from None
        return RunResult(self.record, self.path, self.optimizer.step_count - start)

    def _train_epoch(self, epoch: int, settings: Settings, progress: bool | None) -> None:
        rows = self.train_rows[epoch_order(len(self.train_rows), settings.seed, epoch)]
        size = settings.batch_size
        if self.comm is not None:  # this rank's part of every batch; the same number of batches on every rank
            size //= self.comm.Get_size()
            rows = batch_shares(rows, size, comm=self.comm)
        count = batch_count(len(rows), size)
        with Progress(count, f"epoch {epoch + 1}/{settings.epochs}", enabled=progress) as bar:
            bar.update(self.record.batch)
            for index in range(self.record.batch, count):
                self.interrupt.check()
                batch = rows[index * size : (index + 1) * size]
                loss = _loss(self.module(*[array[batch] for array in self.arrays]))
                weighted, samples = loss * len(batch), len(batch)
                if self.comm is not None:  # the batch's loss over all ranks: the same record everywhere
                    summed = self.comm.allreduce(np.array([weighted, samples], np.float64))
                    weighted, samples = float(summed[0]), int(summed[1])
                    loss = weighted / samples
                record = self.record
                after = replace(
                    record, batch=index + 1, loss_sum=record.loss_sum + weighted,
                    loss_samples=record.loss_samples + samples,
                )  # fmt: skip
                self._next = (after, self.optimizer.step_count + 1)
                self.optimizer.step()
                self.module.lazy_reset_grad()
                self.record, self._next = after, None
                bar.update()
                bar.describe(f"loss {loss:.4f}")
                every = settings.checkpoint_every
                if every is not None and self.optimizer.step_count % every == 0:
                    self.save()

    def _finish_epoch(self, epoch: int) -> EpochLosses:
        record = self.record
        train_loss = record.loss_sum / record.loss_samples if record.loss_samples else math.nan
        entry = EpochLosses(epoch + 1, train_loss, self._validation_loss(record.batch_size))
        self.record = replace(
            record, epoch=epoch + 1, batch=0, loss_sum=0.0, loss_samples=0, history=(*record.history, entry)
        )
        return entry

    def _validation_loss(self, size: int) -> float | None:
        if not len(self.val_rows):
            return None
        self.module.eval()
        try:
            total = 0.0
            for start in range(0, len(self.val_rows), size):
                batch = self.val_rows[start : start + size]
                total += _loss(self.module(*[array[batch] for array in self.arrays])) * len(batch)
        finally:
            self.module.train()
        return total / len(self.val_rows)

    def save(self) -> None:
        """Write the state and the record of the last completed step to the trained checkpoint (atomically)."""
        if self._next is not None and self.optimizer.step_count == self._next[1]:
            self.record, self._next = self._next[0], None  # interrupted after optimizer.step() counted the step
        where = (self.optimizer.step_count, self.record.epoch, self.record.batch)
        if where == self._saved_at:
            return
        for name, value in self.record.to_properties().items():
            self.state.properties[name] = value
        if self.comm is None or self.comm.Get_rank() == 0:  # the ranks hold the same state: rank 0 writes it
            TrainingState.save_checkpoint(self.state, self.path, include_optimizer_state=True)
        self._saved_at, self._saved = where, self.record


def _loss(outputs: np.ndarray | tuple[np.ndarray, ...]) -> float:
    """The loss (the first output) as a Python float; the mean of a loss with ``reduction="none"``."""
    value = outputs[0] if isinstance(outputs, tuple) else outputs
    return float(np.asarray(value).mean())


def _line(entry: EpochLosses, epochs: int, val_label: str, seconds: float) -> str:
    """``epoch 3/10: train loss 0.1234, val loss 0.2345 (0.8 s)``."""
    val = "" if entry.val_loss is None else f", {val_label} loss {entry.val_loss:.4f}"
    took = f"{seconds:.1f} s" if seconds >= 1 else f"{seconds * 1000:.0f} ms"
    return f"epoch {entry.epoch}/{epochs}: train loss {entry.train_loss:.4f}{val} ({took})"


__all__ = ["Echo", "Loop", "RunResult", "TrainingInterrupted"]
