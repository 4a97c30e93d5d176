"""``broadcast_parameters``: every rank starts from one rank's parameters and optimizer state."""

from __future__ import annotations

from typing import Any

from onnxtrain.distributed.communicator import communicator
from onnxtrain.distributed.reduce import broadcast
from onnxtrain.training.state import TrainingState


def broadcast_parameters(state: TrainingState, root: int = 0, *, comm: Any = None) -> None:
    """Overwrite, on every rank, ``state``'s parameters (trainable and frozen) with rank ``root``'s, and its
    optimizer state (step, learning rates, moments) where ``state`` has one.

    Call it on every rank, after loading the checkpoint (and after making the
    ``Module`` and ``Optimizer``, so that the moments exist): every rank must
    have loaded the same artifacts, so that the tensors' names, dtypes and
    shapes agree. A pending optimizer update is applied first.
    """
    comm = communicator(comm)
    if not isinstance(state, TrainingState):
        raise TypeError(f"broadcast_parameters takes a CheckpointState, not {type(state).__name__}")
    store = state.store
    store.settle()
    names = list(store.tensors)
    if comm.bcast(names, root=root) != names:
        raise ValueError(
            f"rank {comm.Get_rank()}'s state has other parameters than rank {root}'s; load the same artifacts "
            "on every rank"
        )
    for name, tensor in store.tensors.items():
        state.parameters[name] = broadcast(tensor.numpy(), comm, root)
    record = store.optimizer
    present = comm.bcast(record is not None, root=root)
    if record is None or not present:
        return
    record.step, record.initial_learning_rate, record.learning_rate = comm.bcast(
        (record.step, record.initial_learning_rate, record.learning_rate), root=root
    )
    for name, moments in sorted(record.moments.items()):
        for k, moment in enumerate(moments):
            moment.write(broadcast(moment.numpy(), comm, root), f"moment {k} of {name!r}")


__all__ = ["broadcast_parameters"]
