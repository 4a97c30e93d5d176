"""``Module.train_epoch``: a pass over in-memory data, its full batches in one run of the epoch model.

:class:`EpochTrainer` decides which batches run one by one (as
:class:`~onnxtrain.training.batch_step.BatchStep`, the per-step loop) and
which in one run of the epoch model (:class:`~onnxtrain.training.epoch.EpochStep`,
a ``Scan`` of the fused step), and keeps the state exactly as the per-step
loop leaves it: the same losses, parameters, moments, statistics, gradients
and step count (docs/runtime.md, "Many steps in one call").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from onnxtrain.training.batch_step import BatchRates, BatchStep, StepOptimizer
from onnxtrain.training.binding import BoundSession
from onnxtrain.training.device import Device
from onnxtrain.training.epoch import EpochStep
from onnxtrain.training.finite import first_non_finite, raise_if_not_finite
from onnxtrain.training.fused import FusedStep
from onnxtrain.training.labels import HostLabelChecks
from onnxtrain.training.model_io import TrainingModelIO
from onnxtrain.training.models import LoadedModel
from onnxtrain.training.state import TrainingState

#: The epoch steps a module keeps (one per shape of batch, the most recent).
EPOCH_SESSIONS = 4
#: The most trainable elements a model may have for its epoch to run as one ``Scan``: the ``Scan`` carries the
#: parameters, gradients and moments from iteration to iteration, copies that grow with them, and gains only what
#: onnxruntime spends per call. 2 cores, 2026-11-29, AdamW, batches of 32, per step: an MLP of 85,002 parameters
#: 297 us against 351 us step by step; 176,650: 490 against 471 us; 1,126,410: 2.74 against 2.02 ms; a
#: 1,000,000 x 32 embedding 107 against 82 ms, with 3,638 against 254 MiB more resident memory.
EPOCH_SCAN_MAX_ELEMENTS = 1 << 17


class EpochOptimizer(StepOptimizer, Protocol):
    """What ``Module.train_epoch`` uses of an ``Optimizer`` (all public there)."""

    @property
    def module(self) -> object: ...

    @property
    def fused_step(self) -> FusedStep | None: ...

    def recorded_update(self) -> tuple[float, int]: ...

    def record_applied(self, count: int) -> None: ...


class EpochModule(Protocol):
    """What ``train_epoch`` uses of the ``Module`` it trains (all public there)."""

    training: bool

    def __call__(self, *user_inputs: Any) -> Any: ...

    def train_step(self, *user_inputs: Any) -> Any: ...

    def lazy_reset_grad(self) -> None: ...

    def scale_grad(self, factor: float) -> None: ...

    def count_loss_items(self, *user_inputs: Any) -> float | None: ...

    @property
    def io(self) -> TrainingModelIO: ...

    @property
    def state(self) -> TrainingState: ...

    @property
    def device(self) -> Device: ...

    @property
    def runs_unbound(self) -> bool: ...

    @property
    def accumulates(self) -> bool: ...

    @property
    def checks_finite(self) -> bool: ...

    @property
    def train_step_count(self) -> int: ...

    def count_train_steps(self, count: int) -> None: ...

    def open_session(self, model: LoadedModel, what: str, *, alone: bool = False) -> BoundSession: ...

    def raise_if_labels_out_of_range(
        self, error: Exception, names: Sequence[str], feeds: Sequence[Any], step: str
    ) -> None: ...

    def check_labels(self, feeds: Sequence[Any], step: str) -> None: ...

    def check_ids(self, feeds: Sequence[Any], step: str) -> None: ...

    def get_parameters_size(self, trainable_only: bool = True) -> int: ...


class EpochTrainer:
    """``train_epoch`` for one module; keeps its epoch steps, one per shape of batch (``steps``)."""

    def __init__(self, module: EpochModule) -> None:
        self.module = module
        self.steps: dict[tuple[FusedStep, tuple[tuple[int, ...], ...]], EpochStep] = {}

    def train_epoch(
        self,
        optimizer: EpochOptimizer,
        inputs: np.ndarray | Sequence[np.ndarray],
        labels: np.ndarray | None,
        batch_size: int,
        shuffle: bool = False,
        seed: int | None = None,
        *,
        learning_rates: Sequence[float] | np.ndarray | None = None,
        accumulate: int = 1,
    ) -> np.ndarray:
        """One pass; the loss of every batch, ``[batches]`` (``Module.train_epoch`` says what it does)."""
        module = self.module
        if getattr(optimizer, "module", None) is not module:
            raise TypeError("train_epoch needs the Optimizer made over this module: Optimizer(optimizer_uri, module)")
        data = self._epoch_data(inputs, labels)
        rows = len(data[0])
        size = _count(batch_size, "batch_size")
        accumulate = _count(accumulate, "accumulate")
        self._check_epoch_batches(data, size)
        store = module.state.store
        store.check_loaded(store.tensors, "Cannot perform TrainStep with a nominal state.")
        order = np.random.default_rng(seed).permutation(rows) if shuffle else np.arange(rows)
        batches = -(-rows // size)
        steps = -(-batches // accumulate)
        step = BatchStep(module, optimizer, BatchRates(optimizer, learning_rates, steps), accumulate, batches)
        full = rows // size  # the batches of `size` rows
        shapes = [(size, *array.shape[1:]) for array in data]
        module.check_labels(data, "train_epoch")  # the labels the module checks on the host: all, before any batch
        module.check_ids(data, "train_epoch")  # and the ids of the tables the inputs look up
        # accumulated batches run step by step: the epoch model takes an optimizer step after every batch
        epoch = self._epoch_step(optimizer.fused_step, shapes) if full and accumulate == 1 else None
        if epoch is not None:  # those its model does not check either (its shapes fixed a class count), here too
            HostLabelChecks.of(epoch.epoch.label_checks, module.io.inputs.names).raise_if_out_of_range(
                data, "train_epoch"
            )
        # by steps: every batch without an epoch step, else the first where no update is recorded yet (which
        # records one) and a last, shorter batch; the others in one run of the epoch model
        first = 0
        if epoch is None:
            first = full = batches
        elif module.accumulates or store.gradient_status == "ready" or store.recorded_update is not optimizer:
            first = 1
        by_step = [_batch_by_step(step, data, order[b * size : (b + 1) * size], b) for b in range(first)]
        scanned = np.zeros(0)
        if epoch is not None and first < full:
            rows_of = order[first * size : full * size] if shuffle else slice(first * size, full * size)  # a view
            batched = [array[rows_of].reshape(full - first, *shape) for array, shape in zip(data, shapes, strict=True)]
            scanned = self._batches_in_one_run(epoch, step, optimizer, batched, first, _Rows(data, rows_of))
        for b in range(full, batches):
            by_step.append(_batch_by_step(step, data, order[b * size : (b + 1) * size], b))
        return np.concatenate([by_step[:first], scanned, by_step[first:]]).astype(np.float64)

    def _epoch_data(self, inputs: Any, labels: Any) -> list[np.ndarray]:
        """The arrays of the user inputs, in model order, with as many rows each (``ValueError`` otherwise)."""
        names = self.module.io.inputs.names
        given = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
        if labels is not None:
            given.append(labels)
        if len(given) != len(names):
            rows = not isinstance(inputs, np.ndarray) and any(not isinstance(v, np.ndarray) for v in inputs)
            hint = ": inputs holds rows, not arrays; pass one numpy.ndarray per input (np.asarray(x))" if rows else ""
            raise TypeError(
                f"train_epoch: the training model takes {len(names)} user input(s) {list(names)}; got {len(given)} "
                f"array(s) (inputs, then labels){hint}"
            )
        arrays = []
        for name, value in zip(names, given, strict=True):
            if not isinstance(value, np.ndarray) or value.ndim == 0:
                raise TypeError(f"train_epoch: the data of input {name!r} must be a numpy.ndarray of rows")
            arrays.append(np.ascontiguousarray(value))
        counts = {name: len(array) for name, array in zip(names, arrays, strict=True)}
        if set(counts.values()) == {0}:  # the per-step loop would run no step: no loss, nothing trained
            raise ValueError(
                f"train_epoch: input {names[0]!r} holds 0 rows: a slice past the end of the data? An epoch over no "
                "rows runs no step; pass at least one row"
            )
        if len(set(counts.values())) != 1:
            raise ValueError(
                f"train_epoch: every input needs the same number of rows (at least 1); got {counts}{self._rows_hint()}"
            )
        return arrays

    def _rows_hint(self) -> str:
        """Why the model's inputs cannot be cut into batches of rows: their first axes differ (labels
        ``[batch*seq]`` of a loss over flattened tokens); ``""`` where they do not."""
        firsts = {spec.name: spec.dims[0] for spec in self.module.io.inputs.specs if spec.dims}
        if len(set(firsts.values())) < 2:
            return ""
        listed = ", ".join(f"{name}: {first}" for name, first in firsts.items())
        return (
            f". The model's inputs do not share their first axis ({listed}), and train_epoch cuts every input into "
            "batches of rows: train a loss over flattened tokens with a step per batch "
            "(module(ids, labels.reshape(-1))), or export the scores as [batch, classes, seq] with labels [batch, seq]"
        )

    def _check_epoch_batches(self, data: Sequence[np.ndarray], size: int) -> None:
        """Check a full batch and the last batch against the model's inputs, as a train step would."""
        rows = len(data[0])
        for count in dict.fromkeys((min(size, rows), rows % size or size)):
            try:
                self.module.io.inputs.collect([array[:count] for array in data], {})
            except ValueError as error:
                raise ValueError(f"{error}{self._rows_hint()}") from None

    def _epoch_step(self, fused: FusedStep | None, shapes: Sequence[tuple[int, ...]]) -> EpochStep | None:
        """The epoch step over ``fused`` for batches of ``shapes`` (one per user input; made on first use);
        ``None`` without a fused step, for a module that seeds each step's random draws, and on the CPU for a
        model of more than :data:`EPOCH_SCAN_MAX_ELEMENTS` trainable elements (step by step, it is faster and
        holds less)."""
        module = self.module
        if fused is None or module.runs_unbound or module.seeds_each_step:
            return None
        large = module.get_parameters_size(trainable_only=True) > EPOCH_SCAN_MAX_ELEMENTS
        if large and module.device.type == "cpu":  # on a GPU a call costs more: not measured where it stops paying
            return None
        key = (fused, tuple(shapes))
        epoch = self.steps.get(key)
        if epoch is None:
            if len(self.steps) >= EPOCH_SESSIONS:  # batches of yet another shape: forget the oldest
                del self.steps[next(iter(self.steps))]
            io, tensors = module.io, module.state.store.tensors
            trainable, statistics = set(io.trainable), io.statistics
            frozen = {n: tensors[n] for n in io.parameters if n not in trainable and n not in statistics}
            epoch = self.steps[key] = EpochStep.create(
                fused,
                dict(zip(io.inputs.names, shapes, strict=True)),
                io.outputs[0],
                {p: (out, tensors[p]) for p, out in statistics.items()},
                frozen,
                lambda model, what: module.open_session(model, what, alone=True),
                module.device,
            )
        return epoch

    def _batches_in_one_run(
        self,
        epoch: EpochStep,
        step: BatchStep,
        optimizer: EpochOptimizer,
        batched: list[np.ndarray],
        first: int,
        rows: _Rows,
    ) -> np.ndarray:
        """Batches ``first, first + 1, ...`` of ``train_epoch`` (``batched``: ``[M, B, ...]`` per input, ``rows``
        of the data given) in one run of the epoch model, after the update the optimizer recorded."""
        module = self.module
        store = module.state.store
        batches = len(batched[0])
        first_rate, first_step = optimizer.recorded_update()
        # iteration j applies the recorded update (j = 0), then that of batch first + j - 1
        applied = np.empty(batches, np.float32)
        applied[0] = first_rate
        applied[1:] = step.rates.of_batches(first, batches - 1, first_step)
        try:
            losses = epoch.run(batched, applied, first_step)
        except Exception as error:  # onnxruntime's own exception types
            span = f"batch {first + 1}" if batches == 1 else f"batches {first + 1}-{first + batches}"
            where = f"train_epoch, {span}"
            # the labels the run failed on, named at their rows of the data given, not at [batch, row] of the scan
            module.raise_if_labels_out_of_range(error, module.io.inputs.names, rows.only(), where)
            raise
        bad = first_non_finite(losses) if module.checks_finite else None
        trained = batches if bad is None else bad.batch
        if bad is not None and trained:  # again, up to the batch before the failed one: the state a per-step loop keeps
            losses = epoch.run([array[:trained] for array in batched], applied[:trained], first_step)
        if trained:
            epoch.commit()
            store.recorded_update = None  # the run's first iteration applied it
            optimizer.record_applied(trained - 1)  # and the updates of all but the last batch after it
            module.count_train_steps(trained)
            store.gradient_status = "ready"  # the last batch's: its optimizer step records its update
            step.update(first + trained - 1)
        if bad is not None:  # the state is as after the batches before (the last one's update recorded)
            raise_if_not_finite(np.asarray(bad.loss).reshape(1), module.train_step_count + 1, store.step)
        return losses


class _Rows:
    """The rows ``rows`` (indices or a slice) of ``data``, the arrays given to ``train_epoch``: those of its batches
    in one run."""

    def __init__(self, data: Sequence[np.ndarray], rows: np.ndarray | slice) -> None:
        self.data = data
        self.rows = rows

    def only(self) -> list[np.ndarray]:
        """``data`` with its integer arrays zero outside ``rows``, for the loss's label check to find the labels
        of these batches out of range at their rows of the data (a zero is a class in range, never listed);
        the other arrays as they are (a label check reads integers)."""
        kept = []
        for array in self.data:
            if array.dtype.kind not in "iu":
                kept.append(array)
                continue
            only = np.zeros_like(array)
            only[self.rows] = array[self.rows]
            kept.append(only)
        return kept


def _batch_by_step(step: BatchStep, data: list[np.ndarray], rows: np.ndarray, index: int) -> float:
    """Batch ``index`` (``rows`` of ``data``) of ``train_epoch`` as the per-step loop runs it; its loss."""
    outputs = step([array[rows] for array in data], index)
    loss = outputs[0] if isinstance(outputs, tuple) else outputs
    return float(np.asarray(loss, dtype=np.float64).mean())


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{what} must be >= 1, not {value}")
    return int(value)


__all__ = ["EPOCH_SCAN_MAX_ELEMENTS", "EPOCH_SESSIONS", "EpochModule", "EpochOptimizer", "EpochTrainer"]
