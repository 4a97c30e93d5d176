"""The runtime's default onnxruntime session options, and the CPU arena its sessions share.

A module runs up to four sessions over one model's activations (the
training model, the reset step, the fused step, the eval model), one at a
time. Each onnxruntime session keeps its own memory arena, which never gives
memory back while the session lives, so each would hold the activations of
its largest run: the reset step's arena, used for the first step only, would
stay beside the fused step's for the whole of training. On the CPU the
default options make the sessions allocate from one arena registered in
onnxruntime's environment instead, so they reuse each other's free memory
(measured: the transformer layer of ``benchmarks/`` peaks 19 MiB lower, 55
instead of 74 MiB above its imports). That arena belongs to onnxruntime's
process-wide environment: it is registered once per process and keeps its
largest size until the process ends, for the next module to reuse. Sessions
with options of the user's own keep their own arenas.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence

import onnx
import onnxruntime as ort


def default_session_options(
    *,
    spinning: bool = False,
    update_first: bool = False,
    shared_cpu_arena: bool = False,
    threads: int = 0,
    memory_pattern: bool = True,
) -> ort.SessionOptions:
    """All graph optimizations, default thread counts; intra-op threads spin only with ``spinning``.

    Where a train step and an optimizer step run in two sessions, one after
    the other, spinning threads of one keep cores busy while the other runs
    (measured: about 1.3x slower steps on 2 cores, far worse on a busy
    machine), so they do not spin. The fused step's session, which runs alone
    once per step, spins: its runs start faster. ``update_first`` selects
    onnxruntime's priority-based execution order, which runs the nodes listed
    first before the others wherever both are ready: the fused model's update
    (onnxtrain.training.fused). ``shared_cpu_arena``: allocate CPU memory from
    the arena all such sessions share (see the module docstring). ``threads``:
    the intra-op thread count (0: onnxruntime's default, the physical cores).
    ``memory_pattern``: onnxruntime's memory pattern, which plans one block
    for a run's tensors after the first run of each input shape. A session
    whose step sizes are not all fixed and small gets it off: the planned
    block comes on top of what the arena kept from the first runs (GPT-2 small,
    4 x 128 on the CPU: 1.30 GiB more at the third step, 4.8 against 3.5 GiB
    above the start, the step no faster; 2026-11-27).
    """
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_mem_pattern = memory_pattern
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    if threads:
        options.intra_op_num_threads = threads
    if update_first:
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    if shared_cpu_arena and _register_shared_cpu_arena():
        options.add_session_config_entry("session.use_env_allocators", "1")
    return options


@functools.cache
def _register_shared_cpu_arena() -> bool:
    """Register a CPU arena with default settings in onnxruntime's environment, once per process.

    The cache mirrors the environment, which is process-wide too. ``False``
    where this onnxruntime cannot: the sessions then keep arenas of their own.
    """
    try:
        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, -1, -1, -1))
    except (AttributeError, RuntimeError, TypeError):  # onnxruntime raises its own RuntimeError subclasses
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
        graph = next(a.g for a in scans[0].attribute if a.name == "body")
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
