"""Data-parallel training across processes on MPI, in Horovod's style.

Each process (an MPI rank, started by ``mpiexec -n N``) trains the same model
on its own part of every batch; before each update the ranks average their
gradients, so every rank applies the same update and the parameters stay
equal. The ORT-style loop does not change; three lines make it
data-parallel::

    from onnxtrain import distributed

    distributed.init()
    distributed.broadcast_parameters(state, root=0)          # every rank starts from rank 0's values
    optimizer = distributed.DistributedOptimizer(optimizer)  # step() averages the gradients, then updates

- :func:`init`, :func:`rank`, :func:`size`, :func:`local_rank`,
  :func:`local_size`: the communicator (``MPI.COMM_WORLD`` unless one is
  given); :func:`cuda_aware`: whether the MPI library takes GPU memory;
- :func:`session_options`: onnxruntime's options for a rank's ``Module``,
  its share of the machine's cores;
- :func:`broadcast_parameters`: rank ``root``'s parameters and optimizer
  state to every rank;
- :class:`DistributedOptimizer`: wraps an ``onnxtrain.api.Optimizer``; its
  ``step()`` all-reduces the accumulated gradients, one flat buffer per
  element type (in host memory, or on the GPU with a CUDA-aware MPI), then
  steps;
- :func:`shard`: each rank's rows of a data set, disjoint and covering,
  reshuffled identically on every rank each epoch; :func:`batch_shares`:
  each rank's part of every global batch of a given order;
  :func:`batch_communicator`: :func:`init`, checking that every batch splits
  evenly over the ranks.

Needs ``mpi4py`` and an MPI library: ``pip install onnxtrain[mpi]`` installs
both (MPICH's wheel). docs/distributed.md says how to run on several machines.
"""

from __future__ import annotations

from onnxtrain.distributed.communicator import cuda_aware, init, local_rank, local_size, rank, size
from onnxtrain.distributed.data import batch_communicator, batch_shares, shard
from onnxtrain.distributed.optimizer import DistributedOptimizer
from onnxtrain.distributed.sessions import session_options
from onnxtrain.distributed.state import broadcast_parameters

__all__ = [
    "DistributedOptimizer",
    "batch_communicator",
    "batch_shares",
    "broadcast_parameters",
    "cuda_aware",
    "init",
    "local_rank",
    "local_size",
    "rank",
    "session_options",
    "shard",
    "size",
]
