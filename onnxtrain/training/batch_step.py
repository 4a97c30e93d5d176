"""One batch of the ORT-style loop: the one place where onnxtrain's loops step (:class:`BatchStep`).

``Module.train_epoch`` runs a batch by itself through it wherever its epoch
model does not (and ``fit`` trains through ``train_epoch``), and the
command's run (:mod:`onnxtrain.loop.steps`) steps through it too::

    outputs = module(*batch)        # the train step (module.train_step(*batch) in eval mode)
    rates.before_step(index)        # the batch's own rate, where the loop gives one
    optimizer.step()
    rates.after_step()              # scheduler.step(), where a scheduler is attached
    module.lazy_reset_grad()

:class:`BatchRates` sets each batch's learning rate as that loop would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np


class Schedule(Protocol):
    """A learning-rate scheduler (:mod:`onnxtrain.training.schedulers`), as an optimizer holds it."""

    def lr_at(self, step: int) -> float:
        """The learning rate after ``step`` optimizer steps."""

    def step(self) -> None:
        """Set the optimizer's learning rate for its current step count."""


class StepOptimizer(Protocol):
    """What a batch's step uses of an ``Optimizer`` (or a ``DistributedOptimizer`` around one)."""

    @property
    def scheduler(self) -> Schedule | None: ...

    def step(self) -> None: ...

    def set_learning_rate(self, learning_rate: float) -> None: ...

    def get_learning_rate(self) -> float: ...


class StepModule(Protocol):
    """What a batch's step uses of a ``Module``."""

    training: bool

    def __call__(self, *user_inputs: Any) -> Any: ...

    def train_step(self, *user_inputs: Any) -> Any: ...

    def lazy_reset_grad(self) -> None: ...


class BatchRates:
    """The learning rate of each batch's optimizer step, as the per-step loop sets it.

    Given per batch (``optimizer.set_learning_rate`` before the step), else
    the scheduler's for the step count before the step (``scheduler.step()``
    after each step), else the optimizer's rate when the pass starts.
    ``batches``: how many rates ``given`` must hold.
    """

    def __init__(
        self, optimizer: StepOptimizer, given: Sequence[float] | np.ndarray | None = None, batches: int = 0
    ) -> None:
        self._optimizer = optimizer
        self._given = None if given is None else np.asarray(given, dtype=np.float64).reshape(-1)
        if self._given is not None and self._given.size != batches:
            raise ValueError(f"learning_rates has {self._given.size} values; the pass has {batches} batches")
        self._scheduler = optimizer.scheduler if given is None else None
        self._fixed = optimizer.get_learning_rate()

    def of_batches(self, first: int, count: int, step_count: int) -> np.ndarray:
        """The rates of batches ``first .. first + count - 1``, the first's taken after ``step_count`` steps."""
        if self._given is not None:
            return self._given[first : first + count]
        if self._scheduler is not None:
            return np.array([self._scheduler.lr_at(step_count + j) for j in range(count)])
        return np.full(count, self._fixed)

    def before_step(self, batch: int) -> None:
        """Set the optimizer's rate for batch ``batch``'s step."""
        if self._given is not None:
            self._optimizer.set_learning_rate(float(self._given[batch]))
        elif self._scheduler is not None:
            self._scheduler.step()  # for the step count now (a run may have applied steps since the last)

    def after_step(self) -> None:
        """What the per-step loop does after the optimizer step: the scheduler's step."""
        if self._scheduler is not None:
            self._scheduler.step()


class BatchStep:
    """The step of one batch (the module docstring's loop), in two halves.

    :meth:`train` runs the train step and :meth:`update` the rest, so that
    a loop can record what the train step gave before the optimizer counts
    the step (the command's run, whose saves must match a step count);
    calling the object runs both.
    """

    def __init__(self, module: StepModule, optimizer: StepOptimizer, rates: BatchRates) -> None:
        self.module = module
        self.optimizer = optimizer
        self.rates = rates

    def train(self, batch: Sequence[Any]) -> Any:
        """The batch's train step, ``module(*batch)`` as a user's loop calls it (``module.train_step(*batch)``
        in eval mode, where that call would evaluate); the module's outputs."""
        module = self.module
        return module(*batch) if module.training else module.train_step(*batch)

    def update(self, index: int) -> None:
        """After batch ``index``'s train step: its rate, the optimizer step, the scheduler's, the gradients reset."""
        self.rates.before_step(index)
        self.optimizer.step()
        self.rates.after_step()
        self.module.lazy_reset_grad()

    def __call__(self, batch: Sequence[Any], index: int) -> Any:
        """Batch ``index``'s whole step; the train step's outputs."""
        outputs = self.train(batch)
        self.update(index)
        return outputs


__all__ = ["BatchRates", "BatchStep", "Schedule", "StepModule", "StepOptimizer"]
