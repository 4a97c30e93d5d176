"""Operations per training step that launch work on a device, counted the same on any machine.

On a GPU each operation that computes is a kernel launch, whose cost on the
host (a few microseconds) is paid whatever the tensor's size: a step of many
small operations is bound by launches. Both frameworks' counts are read on
the CPU, where the graph and the program are the same as on a GPU:

- **onnxtrain**: the nodes of the fused step as onnxruntime optimizes it,
  less those that compute nothing on the device (:data:`ALIASES`: a
  ``Reshape`` and its kin give their input another shape, in place; a
  ``Shape`` or ``Size`` reads the tensor's shape on the host);
- **PyTorch eager**: the ATen operations one step dispatches below autograd
  (``torch.utils._python_dispatch.TorchDispatchMode``), less the views
  (operations whose result aliases an input: ``view``, ``transpose``,
  ``expand``...) and the host's reads of a scalar (``_local_scalar_dense``:
  ``loss.item()``, and on the CPU the optimizer's step counts). A
  ``_foreach_*`` operation of the multi-tensor optimizer counts once here
  and launches about one kernel per 320 chunks of 65,536 elements on CUDA
  (``multi_tensor_apply``): its count is given apart.

These are the least each framework launches: a library kernel may launch
several (cuBLAS's split-K, a reduction in two passes), the same in both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import onnx

#: Operators onnxruntime runs without computing on the device: new shapes for the same buffer, shapes read.
ALIASES = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Shape", "Size"})
#: ATen operations that read a device scalar back to the host (no kernel of their own on the CPU's tensors).
HOST_READS = frozenset({"_local_scalar_dense", "item"})
#: How many of the most frequent operations a count lists.
LISTED = 10


def onnx_launches(model: onnx.ModelProto) -> dict[str, Any]:
    """``{"launches", "aliases", "top"}`` of ``model``'s nodes: those that compute on the device, those that do
    not (:data:`ALIASES`), and the ``top`` operators of the former."""
    kinds = Counter(operator_label(node) for node in model.graph.node)
    aliases = sum(count for kind, count in kinds.items() if kind in ALIASES)
    computing = Counter({kind: count for kind, count in kinds.items() if kind not in ALIASES})
    return {"launches": sum(computing.values()), "aliases": aliases, "top": computing.most_common(LISTED)}


def torch_launches(step: Callable[[], object]) -> dict[str, Any]:
    """``{"launches", "views", "host_reads", "foreach", "top"}`` of the ATen operations that ``step()`` dispatches
    (see the module docstring)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    kinds: Counter[str] = Counter()
    views = host = 0

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            nonlocal views, host
            name = func.overloadpacket.__name__
            if name in HOST_READS:
                host += 1
            elif _is_view(func):
                views += 1
            else:
                kinds[name] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        step()
    foreach = sum(count for name, count in kinds.items() if name.startswith("_foreach_"))
    return {
        "launches": sum(kinds.values()),
        "views": views,
        "host_reads": host,
        "foreach": foreach,
        "top": kinds.most_common(LISTED),
    }


def _is_view(func: Any) -> bool:
    """Whether ATen operation ``func`` returns a view of an input (an alias it does not write): no kernel.
    ``_unsafe_view`` declares no alias but is one (a view of a fresh result)."""
    if func.overloadpacket.__name__ == "_unsafe_view":
        return True
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def operator_label(node: onnx.NodeProto) -> str:
    """``node``'s operator, ``domain.op_type`` outside ONNX's own domain."""
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


__all__ = ["ALIASES", "HOST_READS", "onnx_launches", "operator_label", "torch_launches"]
