"""The one all-reduce of a loop's figures over the ranks of a data-parallel run.

``fit`` and the command's run add up what each rank measured (the loss
summed over its rows, its row count, its correct answers; whether a loss
was not finite) with :func:`sum_over_ranks`, so that every rank records the
same figures and takes the same branch. ``comm`` is an MPI communicator
(``mpi4py.MPI.Comm``, from :mod:`onnxtrain.distributed`); this module only
calls its ``allreduce``, and never imports MPI.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def sum_over_ranks(figures: Sequence[float], comm: Any) -> np.ndarray:
    """``figures`` summed element-wise over the ranks of ``comm``, as float64, the same on every rank.

    One ``allreduce`` of a float64 array (ints up to 2**53 stay exact). Every
    rank must call it at the same point of its loop, with as many figures.
    """
    return comm.allreduce(np.array(figures, np.float64))


__all__ = ["sum_over_ranks"]
