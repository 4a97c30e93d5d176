"""All-reduce and broadcast of NumPy arrays: one flat buffer per element type."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from onnxtrain.distributed.communicator import mpi

#: Element types MPI sums natively; others (float16, bfloat16) are summed in float32.
NATIVE = (np.dtype(np.float32), np.dtype(np.float64))


def allreduce(arrays: Sequence[np.ndarray], comm: Any, *, average: bool) -> list[np.ndarray]:
    """The element-wise sums (or means) of ``arrays`` over the ranks of ``comm``, in the arrays' order.

    Arrays of one element type travel together: one ``Allreduce`` per type,
    over the arrays flattened one after the other. A mean is the sum divided
    by the number of ranks, in the arrays' type (float16 and bfloat16 are
    summed in float32, then rounded back).
    """
    MPI = mpi()
    results: list[np.ndarray | None] = [None] * len(arrays)
    groups: dict[np.dtype, list[int]] = {}
    for index, array in enumerate(arrays):
        groups.setdefault(np.dtype(array.dtype), []).append(index)
    ranks = comm.Get_size()
    for dtype, indices in groups.items():
        wire = dtype if dtype in NATIVE else np.dtype(np.float32)
        flat = np.concatenate([np.asarray(arrays[i], wire).ravel() for i in indices])
        comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
        if average:
            np.divide(flat, wire.type(ranks), out=flat)
        offset = 0
        for i in indices:
            count = int(np.prod(arrays[i].shape, dtype=np.int64))
            results[i] = flat[offset : offset + count].reshape(arrays[i].shape).astype(dtype, copy=False)
            offset += count
    return [r for r in results if r is not None]


def broadcast(array: np.ndarray, comm: Any, root: int) -> np.ndarray:
    """Rank ``root``'s ``array`` on every rank (same dtype and shape everywhere; sent as bytes)."""
    MPI = mpi()
    buffer = np.ascontiguousarray(array).copy()
    comm.Bcast([buffer.view(np.uint8), MPI.BYTE], root=root)
    return buffer


__all__ = ["allreduce", "broadcast"]
