"""What a training run does: epochs, batch size, gradient accumulation, seed, validation split, checkpoints,
learning rate and schedule, early stopping."""

from __future__ import annotations

import math
from dataclasses import dataclass

from onnxtrain.loop.schedule import Schedule


@dataclass(frozen=True)
class Settings:
    """What a run does: epochs, batch size, seed, validation split, checkpoints, learning rate, early stopping.

    ``checkpoint_every=None`` saves after every epoch; ``learning_rate=None``
    takes the rate the checkpoint stores (``onnxtrain generate --lr``, or the
    saved optimizer state when resuming), else 1e-3. ``schedule`` changes
    the rate with the step count (:mod:`onnxtrain.loop.schedule`; ``None``:
    constant). ``early_stopping``: stop once this many epochs have passed
    without a lower validation loss, keeping the best state (needs
    validation data); ``None``: run every epoch. ``accumulate``: the
    batches whose gradients one optimizer step takes, each weighted by what
    its loss is a mean over (:mod:`onnxtrain.training.batch_step`): the step
    of a batch of ``accumulate * batch_size`` rows in the memory of one of
    ``batch_size``; an epoch's last group takes the batches that remain.
    """

    epochs: int
    batch_size: int
    seed: int = 0
    val_split: float = 0.0
    checkpoint_every: int | None = None
    learning_rate: float | None = None
    schedule: Schedule | None = None
    early_stopping: int | None = None
    accumulate: int = 1

    def __post_init__(self) -> None:
        for name, minimum in (("epochs", 1), ("batch_size", 1), ("seed", 0), ("accumulate", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}, not {value!r}")
        every = self.checkpoint_every
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise ValueError(f"checkpoint_every must be an integer >= 1 or None, not {every!r}")
        if not 0.0 <= self.val_split < 1.0:
            raise ValueError(f"val_split must be a fraction in (0, 1), or 0 for none, not {self.val_split!r}")
        rate = self.learning_rate
        if rate is not None and not (math.isfinite(rate) and rate >= 0):
            raise ValueError(f"the learning rate must be finite and >= 0, not {rate!r}")
        if self.schedule is not None and not isinstance(self.schedule, Schedule):
            raise TypeError(f"schedule must be an onnxtrain.loop.Schedule or None, not {type(self.schedule).__name__}")
        patience = self.early_stopping
        if patience is not None and (isinstance(patience, bool) or not isinstance(patience, int) or patience < 1):
            raise ValueError(f"early_stopping must be an integer >= 1 (epochs) or None, not {patience!r}")


__all__ = ["Settings"]
