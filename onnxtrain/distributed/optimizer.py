"""``DistributedOptimizer``: an optimizer whose step averages the gradients of all ranks first."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from onnxtrain.distributed.buckets import Bucket, DeviceBucket, HostBucket
from onnxtrain.distributed.communicator import communicator, cuda_aware
from onnxtrain.training.device import Device
from onnxtrain.training.store import StateTensor

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
    per all-reduce (:mod:`onnxtrain.distributed.buckets`), kept from step to
    step: in host memory (``reduce_on_device=False``), or on the module's
    device, packed and unpacked by onnxruntime (``True``; on a GPU this needs
    an MPI library built CUDA-aware, and the gradients never leave the GPU).
    ``None`` chooses the device where the module is on a GPU and
    :func:`~onnxtrain.distributed.communicator.cuda_aware` says MPI takes its
    memory, else the host.

    Everything else (learning rate, schedulers, ``module``) is the wrapped
    optimizer's. Its fused step is not used (``fused_step`` is ``None``):
    ``Module.train_epoch`` then runs the per-step loop, calling this
    ``step()`` after every batch. ``reduced_bytes`` and ``reduce_seconds``
    count what the all-reduces sent per rank and the time they took (packing
    and unpacking included) since the optimizer was made.
    """

    def __init__(
        self, optimizer: Any, comm: Any = None, op: Reduction = "average", reduce_on_device: bool | None = None
    ) -> None:
        if op not in ("average", "sum"):
            raise ValueError(f"op must be 'average' or 'sum', not {op!r}")
        if not hasattr(optimizer, "module") or not hasattr(optimizer, "step"):
            raise TypeError(f"DistributedOptimizer wraps an onnxtrain.api.Optimizer, not {type(optimizer).__name__}")
        if reduce_on_device not in (None, True, False):
            raise TypeError(f"reduce_on_device must be None, True or False, not {reduce_on_device!r}")
        self._optimizer = optimizer
        self._comm = communicator(comm)
        self._average = op == "average"
        self._on_device = reduce_on_device
        self._buckets: dict[str, tuple[tuple[StateTensor, ...], list[Bucket]]] = {}  # what: (its tensors, buckets)
        self.reduced_bytes = 0
        self.reduce_seconds = 0.0

    @property
    def optimizer(self) -> Any:
        """The wrapped optimizer."""
        return self._optimizer

    @property
    def fused_step(self) -> None:
        """``None``: every update follows an all-reduce (see the class docstring)."""
        return None

    @property
    def reduces_on_device(self) -> bool:
        """Whether the flat buffers lie on the module's device (``reduce_on_device``, or what ``None`` chose)."""
        device = self._optimizer.module.device
        if self._on_device is None:
            return device.type != "cpu" and cuda_aware()
        return self._on_device

    def step(self) -> None:
        """All-reduce the accumulated gradients (and BatchNormalization's running statistics), then step."""
        module = self._optimizer.module
        store = module.state.store
        if store.gradient_status == "ready":
            store.settle()
            start = time.perf_counter()
            ranks = self._comm.Get_size()
            gradients = [store.gradients[name] for name in module.io.trainable if name in store.gradients]
            self._reduce("gradients", gradients, 1 / ranks if self._average else 1.0)
            statistics = [store.tensors[name] for name in module.io.statistics]
            self._reduce("statistics", statistics, 1 / ranks)  # a sum of running means is no running mean
            self.reduce_seconds += time.perf_counter() - start
        self._optimizer.step()

    def _reduce(self, what: str, tensors: Sequence[StateTensor], scale: float) -> None:
        """Sum ``tensors`` over the ranks in place, times ``scale``, through the buckets kept for ``what``."""
        kept = self._buckets.get(what)
        if kept is None or kept[0] != tuple(tensors):  # the same tensor objects (compared by identity)
            kept = self._buckets[what] = (tuple(tensors), self._make_buckets(tensors))
        for bucket in kept[1]:
            bucket.reduce(self._comm, scale)
            self.reduced_bytes += bucket.nbytes

    def _make_buckets(self, tensors: Sequence[StateTensor]) -> list[Bucket]:
        """One bucket per element type, in the order the types first appear."""
        device: Device = self._optimizer.module.device
        if self._on_device and device.type != "cpu" and not cuda_aware():
            raise RuntimeError(
                f"reduce_on_device=True on {device} needs an MPI library built CUDA-aware, and this one's "
                "MPIX_Query_cuda_support() says it is not (or it has no such query): pass reduce_on_device=None "
                "or False to reduce through host memory, or run with a CUDA-aware MPI (docs/distributed.md)"
            )
        on_device = self.reduces_on_device
        buckets: list[Bucket] = []
        for dtype in dict.fromkeys(np.dtype(t.dtype) for t in tensors):
            group = [t for t in tensors if np.dtype(t.dtype) == dtype]
            buckets.append(DeviceBucket(group, device) if on_device else HostBucket(group))
        return buckets

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)


__all__ = ["DistributedOptimizer"]
