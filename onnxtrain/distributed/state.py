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
    mine = _layout(state)
    difference = _first_difference(mine, comm.bcast(mine, root=root))
    if difference:
        raise ValueError(
            f"rank {comm.Get_rank()}'s state differs from rank {root}'s: {difference}; load the same artifacts and "
            "checkpoint on every rank (and make the Optimizer on every rank, or on none, before this call)"
        )
    for name, tensor in store.tensors.items():
        state.parameters[name] = broadcast(tensor.numpy(), comm, root)
    record = store.optimizer
    if record is None:
        return
    record.step, record.initial_learning_rate, record.learning_rate = comm.bcast(
        (record.step, record.initial_learning_rate, record.learning_rate), root=root
    )
    for name, moments in sorted(record.moments.items()):
        for k, moment in enumerate(moments):
            moment.write(broadcast(moment.numpy(), comm, root), f"moment {k} of {name!r}")


#: What must agree between the ranks' states: each parameter's ``(name, dtype, shape)``, then the optimizer
#: state's moments per parameter (``None`` without an optimizer state).
Layout = tuple[list[tuple[str, str, tuple[int, ...]]], dict[str, int] | None]


def _layout(state: TrainingState) -> Layout:
    """``state``'s :data:`Layout`."""
    store = state.store
    tensors = [(name, tensor.dtype.name, tuple(tensor.shape)) for name, tensor in store.tensors.items()]
    record = store.optimizer
    moments = None if record is None else {name: len(moments) for name, moments in sorted(record.moments.items())}
    return tensors, moments


def _first_difference(mine: Layout, theirs: Layout) -> str:
    """The first difference between this rank's layout and the root's, in words; ``""`` where they agree."""
    names = [name for name, _, _ in mine[0]]
    root_names = [name for name, _, _ in theirs[0]]
    if names != root_names:
        extra, missing = sorted(set(names) - set(root_names)), sorted(set(root_names) - set(names))
        return f"its parameters are {names}, the root's {root_names} (here only: {extra}; there only: {missing})"
    for (name, dtype, shape), (_, root_dtype, root_shape) in zip(mine[0], theirs[0], strict=True):
        if (dtype, shape) != (root_dtype, root_shape):
            return f"parameter {name!r} is {dtype}{list(shape)} here, {root_dtype}{list(root_shape)} on the root"
    if (mine[1] is None) != (theirs[1] is None):
        where = "here" if mine[1] is not None else "on the root"
        return f"an optimizer state is made {where} only"
    if mine[1] != theirs[1]:
        return f"the optimizer keeps moments {mine[1]} here, {theirs[1]} on the root (another optimizer)"
    return ""


__all__ = ["broadcast_parameters"]
