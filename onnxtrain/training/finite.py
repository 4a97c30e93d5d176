"""The one check for losses that are NaN or infinite: :func:`first_non_finite`, and the train step's error;
and :func:`check_finite_rows`, which refuses data that would make them so before any step.

Every place that watches the loss asks :func:`first_non_finite`: a train
step with ``check_finite`` (:func:`raise_if_not_finite`), ``train_epoch``'s
run of many batches (which keeps the state of the batches before the first
bad one), and ``fit`` after each iteration, whose ranks must all stop
together: given a communicator, the answer is the same on every rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from onnxtrain.graph.naming import first_names
from onnxtrain.training import values
from onnxtrain.training.ranks import sum_over_ranks


@dataclass(frozen=True)
class NonFiniteLoss:
    """The first batch whose loss is NaN or infinite, and where it is."""

    batch: int  #: its index; 0 where only another rank's loss is not finite
    loss: Any  #: ``losses[batch]``, as given
    rank: int | None = None  #: this rank, where its own loss is not finite (with a communicator)
    elsewhere: bool = False  #: whether only another rank's loss is not finite

    @property
    def where(self) -> str:
        """``""`` in one process, ``" on rank 2"`` for this rank's loss, ``" on another rank"`` for another's."""
        if self.elsewhere:
            return " on another rank"
        return "" if self.rank is None else f" on rank {self.rank}"


def first_non_finite(losses: np.ndarray, comm: Any = None) -> NonFiniteLoss | None:
    """The first batch of ``losses`` whose loss is NaN or infinite; ``None`` when every loss is finite.

    ``losses``: one loss per batch along the first axis (``[batches]``, or
    ``[batches, ...]`` for losses that are arrays: a batch's loss is finite
    when all its values are). With ``comm`` (an MPI communicator), the ranks
    agree (one :func:`~onnxtrain.training.ranks.sum_over_ranks`): ``None``
    only where every rank's losses are finite.
    """
    finite = np.isfinite(losses)
    here = bool(finite.all())
    if comm is None:
        if here:
            return None
    elif not sum_over_ranks([0.0 if here else 1.0], comm)[0]:
        return None
    per_batch = finite.reshape(len(finite), -1).all(axis=1) if finite.ndim > 1 else finite
    batch = int(np.argmin(per_batch))
    rank = int(comm.Get_rank()) if comm is not None and not here else None
    return NonFiniteLoss(batch, losses[batch], rank, elsewhere=comm is not None and here)


def raise_if_not_finite(loss: ort.OrtValue | np.ndarray, step: int, optimizer_steps: int) -> None:
    """``FloatingPointError`` naming train step ``step`` (after ``optimizer_steps``) where its ``loss`` is not
    finite; the caller discards the step."""
    value = loss if isinstance(loss, np.ndarray) else values.to_numpy(loss, copy=False)
    if first_non_finite(value.reshape(1, -1)) is not None:
        shown = value.item() if value.size == 1 else value
        raise FloatingPointError(
            f"train step {step} (after {optimizer_steps} optimizer steps): the loss is {shown}; the step "
            "was discarded (gradients and running statistics are as before it). Lower the learning rate or "
            "check the inputs"
        )


#: Operators through which a model reads NaN as a value of its own: a missing value it imputes.
NAN_READERS = frozenset({"IsNaN", "Imputer"})


def check_finite_rows(
    arrays: Sequence[np.ndarray], inputs: Sequence[str], what: str, model: onnx.ModelProto, *, trained: bool = True
) -> None:
    """``ValueError`` naming the rows of ``arrays`` (one per input named in ``inputs``) that hold a NaN or an
    infinity in a float input, unless ``model`` reads NaN itself (:data:`NAN_READERS`, as skl2onnx's imputers
    write).

    One such row makes the loss NaN, then every parameter: the run would end with a checkpoint of NaNs
    (``trained``; data only evaluated, as validation data, would give a NaN loss)."""
    if any(node.op_type in NAN_READERS for node in model.graph.node):
        return
    for array, name in zip(arrays, inputs, strict=True):
        if array.dtype.kind != "f" or len(array) == 0:
            continue
        finite = np.isfinite(array.reshape(len(array), -1)).all(axis=1)
        if finite.all():
            continue
        rows = np.flatnonzero(~finite)
        shown = first_names(rows.tolist(), 5)
        consequence = (
            "the loss and then every parameter would become NaN" if trained else "its loss would be NaN, or infinite"
        )
        raise ValueError(
            f"{what}: input {name!r} has NaN or infinite values in {len(rows)} row(s) ({shown}; rows counted "
            f"from 0): {consequence}; drop or impute those rows"
        )


__all__ = ["NAN_READERS", "NonFiniteLoss", "check_finite_rows", "first_non_finite", "raise_if_not_finite"]
