"""``shard``: each rank's rows of a data set for one epoch."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxtrain.distributed.communicator import communicator


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


__all__ = ["shard"]
