"""Broadcast of NumPy arrays (the all-reduce of the gradients is in :mod:`onnxtrain.distributed.buckets`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxtrain.distributed.communicator import mpi


def broadcast(array: np.ndarray, comm: Any, root: int) -> np.ndarray:
    """Rank ``root``'s ``array`` on every rank (same dtype and shape everywhere; sent as bytes)."""
    MPI = mpi()
    buffer = np.ascontiguousarray(array).copy()
    comm.Bcast([buffer.view(np.uint8), MPI.BYTE], root=root)
    return buffer


__all__ = ["broadcast"]
