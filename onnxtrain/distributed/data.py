"""Each rank's rows: ``shard`` for one epoch, ``batch_shares`` of every global batch, and
``batch_communicator`` for the loops that split each batch over the ranks."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxtrain.distributed.communicator import communicator, init


def shard(n_samples: int, seed: int = 0, epoch: int = 0, *, shuffle: bool = True, comm: Any = None) -> np.ndarray:
    """The row indices of this rank for ``epoch``: ``order[rank::size]``.

    ``order`` is a permutation of ``range(n_samples)`` drawn from
    ``(seed, epoch)`` (the identity without ``shuffle``), the same on every
    rank, so the ranks' shards are disjoint and together cover every row
    exactly once per epoch; their sizes differ by at most one. Draw a new
    order each epoch by passing the epoch number.
    """
    if isinstance(n_samples, bool) or not isinstance(n_samples, (int, np.integer)) or n_samples < 0:
        raise ValueError(f"n_samples must be a count of rows (an int >= 0), not {n_samples!r}")
    comm = communicator(comm)
    order = np.random.default_rng([seed, epoch]).permutation(n_samples) if shuffle else np.arange(n_samples)
    return order[comm.Get_rank() :: comm.Get_size()]


def batch_shares(order: np.ndarray, batch_size: int, *, comm: Any = None) -> np.ndarray:
    """This rank's rows of ``order`` when the global batches have ``batch_size`` rows per rank.

    ``order`` (the same on every rank) is cut into global batches of
    ``batch_size * size`` rows, the last one shorter; each is split into
    ``size`` equal consecutive parts, part ``rank`` for this rank (the rows
    beyond a multiple of ``size`` are left out, at most ``size - 1``). So
    batch ``k`` of every rank, taken ``batch_size`` rows at a time, is its
    part of global batch ``k``: averaging the ranks' gradients gives the
    gradient one process computes on the global batch, and every rank runs
    the same number of steps.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, not {batch_size!r}")
    comm = communicator(comm)
    ranks, rank = comm.Get_size(), comm.Get_rank()
    order = np.asarray(order)
    usable = len(order) - len(order) % ranks
    parts = []
    for start in range(0, usable, batch_size * ranks):
        block = order[start : min(start + batch_size * ranks, usable)]
        share = len(block) // ranks
        parts.append(block[rank * share : (rank + 1) * share])
    return np.concatenate(parts) if parts else order[:0]


def batch_communicator(batch_size: int, option: str, comm: Any = None) -> Any:
    """:func:`~onnxtrain.distributed.communicator.init`'s communicator for a loop whose batches of
    ``batch_size`` rows each rank takes an equal part of; ``ValueError`` where they do not split evenly.

    ``option`` spells the setting in the message, ``{}`` standing for its value
    (``"--batch-size {}"`` for the command, ``"batch_size={}"`` for ``fit``).
    """
    comm = init(comm)
    ranks = comm.Get_size()
    if batch_size % ranks:
        fitting = ranks * max(1, batch_size // ranks)
        raise ValueError(
            f"{option.format(batch_size)} is not a multiple of the {ranks} ranks: each rank takes an equal part of "
            f"every batch; use {option.format(fitting)}"
        )
    return comm


__all__ = ["batch_communicator", "batch_shares", "shard"]
