"""The runtime's default onnxruntime session options, and the arena its sessions share on a device.

A module runs up to four sessions over one model's activations (the
training model, the reset step, the fused step, the eval model), one at a
time. Each onnxruntime session keeps its own memory arena, which never gives
memory back while the session lives, so each would hold the activations of
its largest run: the reset step's arena, used for the first step only, would
stay beside the fused step's for the whole of training. The default options
make the sessions allocate from one arena per device registered in
onnxruntime's environment instead, so they reuse each other's free memory
(measured on the CPU: the transformer layer of ``benchmarks/`` peaks 19 MiB
lower, 55 instead of 74 MiB above its imports; on a GPU the reset step's
arena would hold a second copy of a step's activations). That arena belongs
to onnxruntime's process-wide environment: it is registered once per process
and device and keeps its largest size until the process ends, for the next
module to reuse. A CUDA arena grows by what each allocation asks
(``onnxtrain.training.device``). Sessions with options of the user's own,
and CUDA providers with arena settings of the user's own
(``device.shares_arena``), keep their own arenas; so do all sessions where
this onnxruntime cannot register an arena for the device (a CPU-only build
asked for CUDA's).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence

import onnx
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

from onnxtrain.graph.attributes import attribute
from onnxtrain.training.device import CUDA_PROVIDER, Device

#: What registering an arena raises where it cannot be done: an older binding (AttributeError, TypeError), the
#: binding's refusal (RuntimeError), or onnxruntime's own errors from the provider (a CUDA failure).
_REGISTRATION_ERRORS = (
    AttributeError,
    RuntimeError,
    TypeError,
    ort_errors.Fail,
    ort_errors.RuntimeException,
    ort_errors.InvalidArgument,
    ort_errors.NotImplemented,
    ort_errors.EPFail,
)
#: onnxruntime's ``ArenaExtendStrategy`` values (``OrtArenaCfg``): the default, and each growth the size requested.
_DEFAULT_EXTEND, _SAME_AS_REQUESTED = -1, 1


def default_session_options(
    *,
    spinning: bool = False,
    update_first: bool = False,
    shared_arena: Device | None = None,
    threads: int = 0,
    memory_pattern: bool = True,
    memory_reuse: bool = True,
) -> ort.SessionOptions:
    """All graph optimizations, default thread counts; intra-op threads spin only with ``spinning``.

    Where a train step and an optimizer step run in two sessions, one after
    the other, spinning threads of one keep cores busy while the other runs
    (measured: about 1.3x slower steps on 2 cores, far worse on a busy
    machine), so they do not spin. The fused step's session, which runs alone
    once per step, spins: its runs start faster. ``update_first`` selects
    onnxruntime's priority-based execution order, which runs the nodes listed
    first before the others wherever both are ready: the fused model's update
    (onnxtrain.training.fused). ``shared_arena``: allocate that device's
    memory from the arena all such sessions share (see the module docstring). ``threads``:
    the intra-op thread count (0: onnxruntime's default, the physical cores).
    ``memory_pattern``: onnxruntime's memory pattern, which plans one block
    for a run's tensors after the first run of each input shape. A session
    whose step sizes are not all fixed and small gets it off: the planned
    block comes on top of what the arena kept from the first runs (GPT-2 small,
    4 x 128 on the CPU: 1.30 GiB more at the third step, 4.8 against 3.5 GiB
    above the start, the step no faster; 2026-11-27).
    ``memory_reuse``: onnxruntime's planned reuse of buffers, which hands a
    dead tensor's buffer to the next tensor of the same symbolic shape in the
    session's plan, however far away. In a training step the forward's dead
    buffers are planned for the backward's tensors, so they stay allocated
    through the rest of the forward: without it each tensor's buffer goes
    back to the arena at its last read (GPT-2 small, 16 x 256 on the CPU:
    peak RSS above the loaded state 8.06 -> 7.04 GiB, with activation
    checkpointing 3.72 -> 2.57 GiB, the step no slower; the small
    workloads of ``benchmarks/`` within noise; 2026-11-28). Kernels still
    write over an input that dies at them.
    """
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_mem_pattern = memory_pattern
    options.enable_mem_reuse = memory_reuse
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    if threads:
        options.intra_op_num_threads = threads
    if update_first:
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    if shared_arena is not None and register_shared_arena(shared_arena):
        options.add_session_config_entry("session.use_env_allocators", "1")
    return options


@functools.cache
def register_shared_arena(device: Device) -> bool:
    """Register an arena for ``device`` in onnxruntime's environment, once per process and device.

    The CPU's with onnxruntime's default settings; a CUDA device's growing by
    what each allocation asks, as ``device="cuda"``'s providers set it. The
    cache mirrors the environment, which is process-wide too. ``False`` where
    this onnxruntime cannot (a build without CUDA): the sessions then keep
    arenas of their own.
    """
    arena = ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR
    try:
        if device.type == "cpu":
            info = ort.OrtMemoryInfo("Cpu", arena, 0, ort.OrtMemType.DEFAULT)
            ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, _DEFAULT_EXTEND, -1, -1))
        else:
            info = ort.OrtMemoryInfo("Cuda", arena, device.id, ort.OrtMemType.DEFAULT)
            config = ort.OrtArenaCfg(0, _SAME_AS_REQUESTED, -1, -1)
            ort.create_and_register_allocator_v2(CUDA_PROVIDER, info, {"device_id": str(device.id)}, config)
    except _REGISTRATION_ERRORS:  # the binding raises RuntimeError; onnxruntime's own errors are not subclasses
        return False
    return True


#: Elements below which every input of a step keeps a session alone on one thread (``Module.open_session``),
#: and the fused step makes a session for fixed shapes (``FusedStep.session_for``): a step of so little data
#: costs its nodes and bindings, which these save; a larger one costs its arithmetic.
SMALL_TENSOR = 1 << 15


def largest_step_input(model: onnx.ModelProto, fixed: Mapping[str, Sequence[int]] | None = None) -> int | None:
    """The elements of the largest input of one step of ``model``, ``None`` where some size is not fixed.

    A step is a run, or an iteration of its ``Scan`` (the epoch model's body); initializers count as inputs;
    ``fixed`` gives the shapes of inputs whose declared ones are not.
    """
    graph = model.graph
    scans = [node for node in graph.node if node.op_type == "Scan"]
    if len(scans) == 1:
        graph = attribute(scans[0], "body")
    sizes = [math.prod(t.dims) for t in graph.initializer]
    for value in graph.input:
        if fixed is not None and value.name in fixed:
            sizes.append(math.prod(fixed[value.name]))
            continue
        dims = value.type.tensor_type.shape.dim
        if not value.type.tensor_type.HasField("shape") or not all(d.HasField("dim_value") for d in dims):
            return None
        sizes.append(math.prod(d.dim_value for d in dims))
    return max(sizes, default=0)


__all__ = ["SMALL_TENSOR", "default_session_options", "largest_step_input"]
