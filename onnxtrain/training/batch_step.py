"""One batch of the ORT-style loop: the one place where onnxtrain's loops step (:class:`BatchStep`).

``Module.train_epoch`` runs a batch by itself through it wherever its epoch
model does not (and ``fit`` trains through ``train_epoch``), and the
command's run (:mod:`onnxtrain.loop.steps`) steps through it too::

    outputs = module(*batch)        # the train step (module.train_step(*batch) in eval mode)
    rates.before_step(index)        # the batch's own rate, where the loop gives one
    optimizer.step()
    rates.after_step()              # scheduler.step(), where a scheduler is attached
    module.lazy_reset_grad()

With gradient accumulation (``accumulate=k``), batches ``0 .. k-1``, ``k ..
2k-1``, ... of the pass (the last group what remains) each make one
optimizer step: every batch's train step adds its gradients, and before the
step :meth:`Module.scale_grad <onnxtrain.training.module.Module.scale_grad>`
weights each batch by what its loss is a mean over (its rows; the labels a
mean cross-entropy counts: ``Module.count_loss_items``,
:mod:`onnxtrain.training.loss_items`), so that the step takes the gradient
of the loss over all the group's items, as one batch of them gives. Batches
of ``n`` items each: ``scale_grad(1 / k)`` before the step. A batch of
``r`` items after one of ``n``: the sum so far is scaled by ``n / r`` before
its train step, and the whole by ``r / (sum of items)`` after the last,
which weights each batch ``items / sum of items``. A loss summed over its
batch (``count_loss_items`` gives ``None``) is the sum over the group's rows
with the gradients added as they are: no weights.

:class:`BatchRates` sets each step's learning rate as that loop would.
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

    def scale_grad(self, factor: float) -> None: ...

    def count_loss_items(self, *user_inputs: Any) -> float | None: ...


class BatchRates:
    """The learning rate of each batch's optimizer step, as the per-step loop sets it.

    Given per batch (``optimizer.set_learning_rate`` before the step), else
    the scheduler's for the step count before the step (``scheduler.step()``
    after each step), else the optimizer's rate when the pass starts.
    ``batches``: how many rates ``given`` must hold (one per optimizer step).
    """

    def __init__(
        self, optimizer: StepOptimizer, given: Sequence[float] | np.ndarray | None = None, batches: int = 0
    ) -> None:
        self._optimizer = optimizer
        self._given = None if given is None else np.asarray(given, dtype=np.float64).reshape(-1)
        if self._given is not None and self._given.size != batches:
            raise ValueError(
                f"learning_rates has {self._given.size} values; the pass takes {batches} optimizer steps: give one "
                "rate per step"
            )
        self._scheduler = optimizer.scheduler if given is None else None
        self._fixed = optimizer.get_learning_rate()

    def of_batches(self, first: int, count: int, step_count: int) -> np.ndarray:
        """The rates of batches ``first .. first + count - 1``, the first's taken after ``step_count`` steps."""
        if self._given is not None:
            return self._given[first : first + count]
        if self._scheduler is not None:
            return np.array([self._scheduler.lr_at(step_count + j) for j in range(count)])
        return np.full(count, self._fixed)

    def before_step(self, step: int) -> None:
        """Set the optimizer's rate for the pass's step ``step`` (batch ``step``'s, without accumulation)."""
        if self._given is not None:
            self._optimizer.set_learning_rate(float(self._given[step]))
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
    calling the object runs both. ``accumulate``: the batches of one
    optimizer step (the module docstring); ``batches``: the pass's batches,
    whose last ends the last group (needed where ``accumulate`` > 1).
    """

    def __init__(
        self, module: StepModule, optimizer: StepOptimizer, rates: BatchRates, accumulate: int = 1, batches: int = 0
    ) -> None:
        if accumulate > 1 and batches < 1:
            raise ValueError("BatchStep: accumulating needs the pass's number of batches")
        self.module = module
        self.optimizer = optimizer
        self.rates = rates
        self.accumulate = accumulate
        self.batches = batches
        self._items = 0.0  # the loss items of the group's batches so far (module.count_loss_items)
        self._last = 0.0  # and of its last batch with any

    def ends_step(self, index: int) -> bool:
        """Whether batch ``index``'s :meth:`update` takes an optimizer step (the last batch of its group)."""
        return self.accumulate == 1 or (index + 1) % self.accumulate == 0 or index + 1 == self.batches

    def train(self, batch: Sequence[Any]) -> Any:
        """The batch's train step, ``module(*batch)`` as a user's loop calls it (``module.train_step(*batch)``
        in eval mode, where that call would evaluate); the module's outputs."""
        module = self.module
        if self.accumulate > 1:
            items = module.count_loss_items(*batch)
            if items is None:  # a loss summed over its batch: the gradients added as they are
                items = 0.0
            elif self._items and items and items != self._last:  # weigh the batches so far as this one will be
                module.scale_grad(self._last / items)
            if items:  # a batch of no items (every label ignored) adds its gradient as it is: torch's 0 / 0
                self._last = items
            self._items += items
        return module(*batch) if module.training else module.train_step(*batch)

    def update(self, index: int) -> None:
        """After batch ``index``'s train step, at the end of its group: the gradients' weights, its rate, the
        optimizer step, the scheduler's, the gradients reset. Within a group, nothing."""
        if not self.ends_step(index):
            return
        if self._items and self._items != self._last:  # more than one batch: the mean over the group's items
            self.module.scale_grad(self._last / self._items)
        self._items = self._last = 0
        self.rates.before_step(index // self.accumulate)
        self.optimizer.step()
        self.rates.after_step()
        self.module.lazy_reset_grad()

    def __call__(self, batch: Sequence[Any], index: int) -> Any:
        """Batch ``index``'s whole step; the train step's outputs."""
        outputs = self.train(batch)
        self.update(index)
        return outputs


__all__ = ["BatchRates", "BatchStep", "Schedule", "StepModule", "StepOptimizer"]
