"""The epoch step: many train and optimizer steps in one onnxruntime run (:mod:`onnxtrain.artifacts.epoch`).

``Module.train_epoch`` drives it: :class:`EpochOptimizer` is what it needs of
the optimizer, :class:`EpochRates` the learning rate of each batch's step.

:class:`EpochStep` holds the session of the epoch model built from a fused
step (:class:`~onnxtrain.training.fused.FusedStep`) for one shape of batch,
and runs it over batches in memory. The tensors the scan carries (parameters,
moments, gradients, running statistics) are its inputs; their new values are
written into the tensors' spares, which :meth:`EpochStep.commit` swaps in. A
run that fails, or whose result the module discards (a loss that is not
finite, with ``check_finite``), leaves the state as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np

from onnxtrain.artifacts.epoch import EpochModel, epoch_scan_model
from onnxtrain.sessions import inferred_shapes
from onnxtrain.training import values
from onnxtrain.training.binding import BoundSession
from onnxtrain.training.device import Device
from onnxtrain.training.fused import FusedStep
from onnxtrain.training.interface import LoadedModel
from onnxtrain.training.store import StateTensor

_HOST = Device("cpu")


def unpacks_with_slices(device: Device) -> bool:
    """Whether the epoch model on ``device`` splits its packed parameters back with ``Slice`` nodes rather than
    one ``Split``: on CUDA, whose ``Split`` waits for a host copy of its axis' map at every run
    (:mod:`onnxtrain.artifacts.vectorize`)."""
    return device.type == "cuda"


class EpochStep:
    """The epoch model's session over one fused step's tensors; see the module docstring."""

    def __init__(
        self,
        epoch: EpochModel,
        session: BoundSession,
        carried: Sequence[StateTensor],
        frozen: Mapping[str, StateTensor],
    ) -> None:
        self.epoch = epoch
        self.session = session
        self.carried = list(zip(epoch.carried, carried, strict=True))
        self.frozen = dict(frozen)

    @classmethod
    def create(
        cls,
        fused: FusedStep,
        batches: Mapping[str, Sequence[int]],
        loss: str,
        statistics: Mapping[str, tuple[str, StateTensor]],
        frozen: Mapping[str, StateTensor],
        open_session: Callable[[LoadedModel, str], BoundSession],
        device: Device,
    ) -> EpochStep:
        """The epoch step over ``fused`` for batches of the shapes ``batches`` (``{user input: shape}``);
        ``statistics``: ``{parameter: (the output of its new value, its tensor)}``; ``open_session(model, what)``
        makes the session on ``device``."""
        carried = [(name, out) for name, _, out in fused.in_place]
        tensors = [tensor for _, tensor, _ in fused.in_place]
        for name, (out, tensor) in statistics.items():
            carried.append((name, out))
            tensors.append(tensor)
        epoch = epoch_scan_model(
            fused.model.proto,
            carried,
            batches,
            loss,
            fused.learning_rate,
            fused.step,
            fused.updates,
            inferred_shapes,
            unpack_with_slices=unpacks_with_slices(device),
        )
        model = LoadedModel(epoch.model, epoch.model.SerializeToString())
        session = open_session(model, "epoch model")
        used = {value.name for value in epoch.model.graph.input}
        return cls(epoch, session, tensors, {name: t for name, t in frozen.items() if name in used})

    def run(self, batches: Sequence[np.ndarray], learning_rates: np.ndarray, first_step: int) -> np.ndarray:
        """Train on batch ``j`` of each user input's ``batches`` (``[M, B, ...]``, in model order) in iteration
        ``j``, after the update of step ``first_step + j`` with ``learning_rates[j]``; the losses, ``[M]``.

        The new state is in the spares until :meth:`commit`.
        """
        epoch, session = self.epoch, self.session
        session.bind_output(epoch.losses, _HOST)  # first: the only output read back
        for name, array in zip(epoch.data.values(), batches, strict=True):
            session.bind_input(name, array)
        session.bind_input(epoch.learning_rates, np.ascontiguousarray(learning_rates.reshape(-1)))
        if epoch.steps is not None:
            steps = np.arange(first_step, first_step + len(learning_rates), dtype=np.int64)
            session.bind_input(epoch.steps, steps)
        for name, tensor in self.frozen.items():
            session.bind_value(name, tensor.value)
        for (before, after), tensor in self.carried:
            session.bind_value(before, tensor.value)
            session.bind_output_into(after, tensor.spare())
        session.run()
        return values.to_numpy(session.outputs(1)[0])

    def commit(self) -> None:
        """Swap in the state the last run wrote."""
        for _, tensor in self.carried:
            tensor.swap()


class Schedule(Protocol):
    """A learning-rate scheduler (:mod:`onnxtrain.training.schedulers`), as an optimizer holds it."""

    def lr_at(self, step: int) -> float:
        """The learning rate after ``step`` optimizer steps."""

    def step(self) -> None:
        """Set the optimizer's learning rate for its current step count."""


class EpochOptimizer(Protocol):
    """What ``Module.train_epoch`` uses of an ``Optimizer`` (all public there)."""

    @property
    def module(self) -> object: ...

    @property
    def fused_step(self) -> FusedStep | None: ...

    @property
    def scheduler(self) -> Schedule | None: ...

    def recorded_update(self) -> tuple[float, int]: ...

    def record_applied(self, count: int) -> None: ...

    def step(self) -> None: ...

    def set_learning_rate(self, learning_rate: float) -> None: ...

    def get_learning_rate(self) -> float: ...


class EpochRates:
    """The learning rate of each batch's optimizer step in ``train_epoch``, as the per-step loop sets it.

    Given per batch (``optimizer.set_learning_rate`` before the step), else
    the scheduler's for the step count before the step (``scheduler.step()``
    after each step), else the optimizer's rate when the pass starts.
    """

    def __init__(self, optimizer: EpochOptimizer, given: Sequence[float] | np.ndarray | None, batches: int) -> None:
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


__all__ = ["EpochOptimizer", "EpochRates", "EpochStep", "Schedule", "unpacks_with_slices"]
