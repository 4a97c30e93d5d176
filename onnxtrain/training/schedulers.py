"""Learning-rate schedulers: the rate as a function of the optimizer's step count.

As in ONNX Runtime, a scheduler sets the optimizer's initial learning rate
when it is made, then each ``step()`` sets ``lr = schedule(optimizer step
count)``: the count of optimizer steps taken so far (the checkpoint's
``step``), not a counter of its own. The constructor takes one ``step()``, so
the first optimizer step already uses the scheduled rate, and a run resumed
from a checkpoint with optimizer state continues on the same schedule when
the scheduler is made again with the same arguments. Call ``step()`` after
each ``optimizer.step()``.

Each scheduler keeps its own ``initial_lr``. As in ONNX Runtime, the one made
last on an optimizer is attached to it: the optimizer's initial learning rate
(the one a checkpoint stores) is its ``initial_lr``, and ``train_epoch``
steps it. Making another does not change an earlier scheduler's rates (in
ONNX Runtime, which reads the initial rate from the optimizer at every step,
it did: its next ``step()`` scaled the new ``initial_lr``).

``LinearLRScheduler`` is ONNX Runtime's, with the arguments in the order its
documentation gives (ORT's Python wrapper swaps warm-up and total when it
calls the C++ code; this one does not). The formulas are the functions below.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import numpy as np

from onnxtrain.training.optimizer import Optimizer


def linear_lr(step: int, warmup_step_count: int, total_step_count: int, initial_lr: float) -> float:
    """ONNX Runtime's linear schedule, in float32 as its C++ code computes it.

    warm-up (``step < warmup``): ``initial * step / max(1, warmup)``;
    after: ``initial * max(0, (total - step) / max(1, total - warmup))``.
    """
    f32 = np.float32
    if step < warmup_step_count:
        factor = f32(step) / max(f32(1), f32(warmup_step_count))
    else:
        remaining = f32(total_step_count - step)
        factor = max(f32(0), remaining / max(f32(1), f32(total_step_count - warmup_step_count)))
    return float(f32(initial_lr) * f32(factor))


def cosine_lr(
    step: int, warmup_step_count: int, total_step_count: int, initial_lr: float, min_lr: float = 0.0
) -> float:
    """Linear warm-up from 0, then a half cosine from ``initial_lr`` down to ``min_lr`` at ``total_step_count``.

    warm-up: ``initial * step / max(1, warmup)``; after:
    ``min + (initial - min) * (1 + cos(pi * p)) / 2`` with
    ``p = min(1, (step - warmup) / max(1, total - warmup))``.
    """
    if step < warmup_step_count:
        return initial_lr * step / max(1, warmup_step_count)
    progress = min(1.0, (step - warmup_step_count) / max(1, total_step_count - warmup_step_count))
    return min_lr + (initial_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def step_lr(step: int, step_size: int, initial_lr: float, gamma: float = 0.1) -> float:
    """``initial * gamma ** (step // step_size)`` (torch's ``StepLR``)."""
    return initial_lr * gamma ** (step // step_size)


def exponential_lr(step: int, initial_lr: float, gamma: float) -> float:
    """``initial * gamma ** step`` (torch's ``ExponentialLR``)."""
    return initial_lr * gamma**step


def _count(value: int, what: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, not {value}")
    return int(value)


def _rate(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what} must be a float, not {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be finite and >= 0, not {value!r}")
    return float(value)


class LRScheduler(ABC):
    """Base class: sets the initial learning rate, then ``step()`` sets ``lr_at(optimizer step count)``."""

    def __init__(self, optimizer: Optimizer, initial_lr: float) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"optimizer must be an onnxtrain Optimizer, not {type(optimizer).__name__}")
        self._optimizer = optimizer
        optimizer.attach_scheduler(self, _rate(initial_lr, "initial_lr"))
        self._initial_lr = optimizer.initial_learning_rate  # as the optimizer holds it (float32)
        self.step()

    @property
    def optimizer(self) -> Optimizer:
        """The optimizer whose learning rate this scheduler sets."""
        return self._optimizer

    @property
    def initial_lr(self) -> float:
        """This scheduler's initial learning rate (float32, as the optimizer model reads it), which its
        schedule scales; a scheduler made later on the same optimizer does not change it."""
        return self._initial_lr

    @abstractmethod
    def lr_at(self, step: int) -> float:
        """The learning rate after ``step`` optimizer steps."""

    def step(self) -> None:
        """Set the optimizer's learning rate for its current step count."""
        self._optimizer.schedule_learning_rate(self.lr_at(self._optimizer.step_count))


class LinearLRScheduler(LRScheduler):
    """ONNX Runtime's linear warm-up then linear decay to 0 (:func:`linear_lr`)."""

    def __init__(self, optimizer: Optimizer, warmup_step_count: int, total_step_count: int, initial_lr: float) -> None:
        self.warmup_step_count = _count(warmup_step_count, "warmup_step_count")
        self.total_step_count = _count(total_step_count, "total_step_count")
        if self.total_step_count < self.warmup_step_count:
            raise ValueError(
                f"total_step_count={total_step_count} is less than warmup_step_count={warmup_step_count}; "
                "the order is (optimizer, warmup_step_count, total_step_count, initial_lr)"
            )
        super().__init__(optimizer, initial_lr)

    def lr_at(self, step: int) -> float:
        return linear_lr(step, self.warmup_step_count, self.total_step_count, self.initial_lr)


class CosineLRScheduler(LRScheduler):
    """Linear warm-up, then cosine decay to ``min_lr`` (:func:`cosine_lr`)."""

    def __init__(
        self,
        optimizer: Optimizer,
        warmup_step_count: int,
        total_step_count: int,
        initial_lr: float,
        min_lr: float = 0.0,
    ) -> None:
        self.warmup_step_count = _count(warmup_step_count, "warmup_step_count")
        self.total_step_count = _count(total_step_count, "total_step_count")
        if self.total_step_count < self.warmup_step_count:
            raise ValueError(f"total_step_count={total_step_count} is less than warmup_step_count={warmup_step_count}")
        self.min_lr = _rate(min_lr, "min_lr")
        if self.min_lr > initial_lr:
            raise ValueError(f"min_lr={min_lr} is greater than initial_lr={initial_lr}")
        super().__init__(optimizer, initial_lr)

    def lr_at(self, step: int) -> float:
        return cosine_lr(step, self.warmup_step_count, self.total_step_count, self.initial_lr, self.min_lr)


class StepLRScheduler(LRScheduler):
    """Multiply the rate by ``gamma`` every ``step_size`` optimizer steps (:func:`step_lr`)."""

    def __init__(self, optimizer: Optimizer, step_size: int, initial_lr: float, gamma: float = 0.1) -> None:
        self.step_size = _count(step_size, "step_size", minimum=1)
        self.gamma = _rate(gamma, "gamma")
        super().__init__(optimizer, initial_lr)

    def lr_at(self, step: int) -> float:
        return step_lr(step, self.step_size, self.initial_lr, self.gamma)


class ExponentialLRScheduler(LRScheduler):
    """Multiply the rate by ``gamma`` every optimizer step (:func:`exponential_lr`)."""

    def __init__(self, optimizer: Optimizer, initial_lr: float, gamma: float) -> None:
        self.gamma = _rate(gamma, "gamma")
        super().__init__(optimizer, initial_lr)

    def lr_at(self, step: int) -> float:
        return exponential_lr(step, self.initial_lr, self.gamma)


__all__ = [
    "CosineLRScheduler",
    "ExponentialLRScheduler",
    "LRScheduler",
    "LinearLRScheduler",
    "StepLRScheduler",
    "cosine_lr",
    "exponential_lr",
    "linear_lr",
    "step_lr",
]
