"""What a training process holds: resident memory, GPU memory, and the training state's tensors by kind.

- :func:`reset_peak_rss`: the kernel's high-water mark (``VmHWM``) set back
  to the current RSS (``/proc/self/clear_refs``), so that a later peak is that
  of what ran since;
- :func:`gpu_used_mib`: this process's GPU memory by NVML (the device's used
  memory where NVML does not list the process), read through ``ctypes``;
- :func:`onnxtrain_state`: the sizes of the parameters, gradients and
  optimizer moments that onnxtrain's runtime holds (``module.state.store``),
  with the number of buffers of each: the value, a spare where a step wrote
  one, a host copy where one is still alive;
- :func:`torch_state` and :func:`torch_saved`: the same for PyTorch, and
  the bytes of the tensors autograd saves for the backward (found by
  ``torch.autograd.graph.saved_tensors_hooks``, each storage once,
  parameters left out).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from benchmarks.measure import peak_rss_mib, rss_mib

MIB = float(1 << 20)


def reset_peak_rss() -> bool:
    """Set ``VmHWM`` back to the current RSS; false where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def rss_marks() -> dict[str, float]:
    """The current and peak RSS, in MiB."""
    return {"rss_mib": rss_mib(), "peak_rss_mib": peak_rss_mib()}


class _ProcessInfo(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("used", ctypes.c_ulonglong),
        ("gpu_instance", ctypes.c_uint),
        ("compute_instance", ctypes.c_uint),
    ]


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def gpu_used_mib(index: int = 0) -> dict[str, float] | None:
    """GPU memory by NVML: ``process_mib`` (this process's, where NVML lists it) and ``device_mib`` (used on the
    whole device); ``None`` without NVML."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return None
        handle = ctypes.c_void_p()
        if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
            return None
        memory = _Memory()
        result: dict[str, float] = {}
        if nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) == 0:
            result["device_mib"] = memory.used / MIB
        processes = (_ProcessInfo * 64)()
        count = ctypes.c_uint(len(processes))
        if nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), processes) == 0:
            mine = [p.used for p in processes[: count.value] if p.pid == os.getpid()]
            if mine:
                result["process_mib"] = mine[0] / MIB
        return result
    except (OSError, AttributeError):
        return None


def _buffers(tensors: Iterable[Any]) -> dict[str, float]:
    """Bytes of one copy of ``tensors`` (StateTensors) and the buffers held per tensor: value, spares, host."""
    tensors = list(tensors)
    nbytes = sum(t.size * t.dtype.itemsize for t in tensors)
    values = sum(t.value is not None for t in tensors)
    spares = sum(getattr(t, "_spare", None) is not None for t in tensors)
    host = sum(getattr(t, "_array", None) is not None for t in tensors)
    count = max(len(tensors), 1)
    return {
        "mib": nbytes / MIB,
        "tensors": len(tensors),
        "copies": (values + spares + host) / count,
        "spares": spares / count,
        "host_copies": host / count,
    }


def onnxtrain_state(module: Any) -> dict[str, dict[str, float]]:
    """Parameters, gradients and optimizer moments of onnxtrain's runtime (``module.state.store``)."""
    store = module.state.store
    moments = [m for ms in (store.optimizer.moments.values() if store.optimizer else ()) for m in ms]
    return {
        "parameters": _buffers(store.tensors.values()),
        "gradients": _buffers(store.gradients.values()),
        "moments": _buffers(moments),
    }


def torch_state(model: Any, optimizer: Any) -> dict[str, dict[str, float]]:
    """Parameters, gradients (as they are: call between backward and ``zero_grad``) and AdamW's moments."""
    parameters = list(model.parameters())
    grads = [p.grad for p in parameters if p.grad is not None]
    moments = [v for state in optimizer.state.values() for k, v in state.items() if k in ("exp_avg", "exp_avg_sq")]

    def entry(tensors: list[Any]) -> dict[str, float]:
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        return {"mib": nbytes / MIB, "tensors": len(tensors), "copies": 1.0}  # each tensor is its one buffer

    return {"parameters": entry(parameters), "gradients": entry(grads), "moments": entry(moments)}


def torch_saved(model: Any, forward: Callable[[], Any], listed: int = 8) -> dict[str, Any]:
    """The tensors autograd saves for the backward while ``forward()`` runs (its loss is dropped, and the graph
    with it), each storage once, the parameters' left out: ``mib`` in all, and the largest ``groups`` by
    shape and dtype."""
    import torch

    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, tuple[str, int]] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            kind = f"{'x'.join(map(str, tensor.shape)) or 'scalar'} {str(tensor.dtype).removeprefix('torch.')}"
            saved[storage.data_ptr()] = (kind, storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = forward()
    del loss
    groups: dict[str, list[float]] = {}
    for kind, nbytes in saved.values():
        entry = groups.setdefault(kind, [0, 0.0])
        entry[0] += 1
        entry[1] += nbytes / MIB
    ranked = sorted(groups.items(), key=lambda item: -item[1][1])[:listed]
    return {
        "mib": sum(nbytes for _, nbytes in saved.values()) / MIB,
        "groups": [{"kind": kind, "count": int(count), "mib": mib} for kind, (count, mib) in ranked],
    }


__all__ = [
    "gpu_used_mib",
    "onnxtrain_state",
    "reset_peak_rss",
    "rss_marks",
    "torch_saved",
    "torch_state",
]
