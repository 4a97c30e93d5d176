"""``DistributedOptimizer``: an optimizer whose step averages the gradients of all ranks first."""

from __future__ import annotations

from typing import Any, Literal

from onnxtrain.distributed.communicator import communicator
from onnxtrain.distributed.reduce import allreduce

Reduction = Literal["average", "sum"]


class DistributedOptimizer:
    """Wraps an ``onnxtrain.api.Optimizer``: ``step()`` all-reduces the module's accumulated gradients over
    the ranks of ``comm``, then runs the wrapped optimizer's step.

    ``op="average"`` (the mean over ranks: with each rank on its part of the
    batch, the gradient of the whole batch's mean loss when the parts are of
    equal size) or ``"sum"``. The running statistics of training-mode
    BatchNormalization are averaged over the ranks at each step too, so they
    stay equal everywhere (each rank still normalizes its part with its own
    batch statistics). Gradients of one element type go in one flat buffer
    per all-reduce, through host memory. Everything else (learning rate,
    schedulers, ``module``) is the wrapped optimizer's. Its fused step is not
    used (``fused_step`` is ``None``): ``Module.train_epoch`` then runs the
    per-step loop, calling this ``step()`` after every batch.
    """

    def __init__(self, optimizer: Any, comm: Any = None, op: Reduction = "average") -> None:
        if op not in ("average", "sum"):
            raise ValueError(f"op must be 'average' or 'sum', not {op!r}")
        if not hasattr(optimizer, "module") or not hasattr(optimizer, "step"):
            raise TypeError(f"DistributedOptimizer wraps an onnxtrain.api.Optimizer, not {type(optimizer).__name__}")
        self._optimizer = optimizer
        self._comm = communicator(comm)
        self._average = op == "average"

    @property
    def optimizer(self) -> Any:
        """The wrapped optimizer."""
        return self._optimizer

    @property
    def fused_step(self) -> None:
        """``None``: every update follows an all-reduce (see the class docstring)."""
        return None

    def step(self) -> None:
        """All-reduce the accumulated gradients (and BatchNormalization's running statistics), then step."""
        module = self._optimizer.module
        store = module.state.store
        if store.gradient_status == "ready":
            store.settle()
            names = [name for name in module.io.trainable if name in store.gradients]
            gradients = [store.gradients[name] for name in names]
            reduced = allreduce([tensor.numpy() for tensor in gradients], self._comm, average=self._average)
            for name, tensor, array in zip(names, gradients, reduced, strict=True):
                tensor.write(array, f"the gradient of {name!r}")
            statistics = [store.tensors[name] for name in module.io.statistics]
            if statistics:  # averaged whatever op is: a sum of running means is no running mean
                averaged = allreduce([tensor.numpy() for tensor in statistics], self._comm, average=True)
                for tensor, array in zip(statistics, averaged, strict=True):
                    tensor.write(array, "a running statistic")
        self._optimizer.step()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)


__all__ = ["DistributedOptimizer"]
