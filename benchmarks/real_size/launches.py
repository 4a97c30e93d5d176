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

With each count goes the **bytes moved**: per operation, the bytes of its
tensor inputs and outputs, as if each input were read once in whole and
each output written once; a selection (:data:`SELECTIONS`,
:data:`TORCH_SELECTIONS`: a slice, a gather, an embedding) reads of its data
only what it writes. On a GPU the element-wise operations are bound by
memory, so this predicts their time on any GPU from its bandwidth; the
matrix products' bytes are counted too, and their arithmetic is not.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import onnx

#: Operators onnxruntime runs without computing on the device: new shapes for the same buffer, shapes read.
ALIASES = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Shape", "Size"})
#: ATen operations that read a device scalar back to the host (no kernel of their own on the CPU's tensors).
HOST_READS = frozenset({"_local_scalar_dense", "item"})
#: ONNX operators that read of their data input (the first) only what they write.
SELECTIONS = frozenset({"Slice", "Gather", "GatherElements", "GatherND"})
#: ATen operations that read of their data input (the first tensor) only what they write.
TORCH_SELECTIONS = frozenset({"embedding", "index_select", "gather", "index"})
#: How many of the most frequent operations a count lists.
LISTED = 10


def onnx_launches(model: onnx.ModelProto, sizes: Mapping[str, int | None] | None = None) -> dict[str, Any]:
    """``{"launches", "aliases", "top"}`` of ``model``'s nodes: those that compute on the device, those that do
    not (:data:`ALIASES`), and the ``top`` operators of the former. With ``sizes`` (each value's bytes, ``None``
    where unknown), also ``"bytes"`` moved by the former (see the module docstring), ``"bytes_top"`` by
    operator, and ``"unsized"``: the nodes left out of it for a size not known."""
    kinds = Counter(operator_label(node) for node in model.graph.node)
    aliases = sum(count for kind, count in kinds.items() if kind in ALIASES)
    computing = Counter({kind: count for kind, count in kinds.items() if kind not in ALIASES})
    counted: dict[str, Any] = {"launches": sum(computing.values()), "aliases": aliases}
    counted["top"] = computing.most_common(LISTED)
    if sizes is None:
        return counted
    moved: Counter[str] = Counter()
    unsized = 0
    for node in model.graph.node:
        kind = operator_label(node)
        if kind in ALIASES:
            continue
        nbytes = node_bytes(node, sizes)
        if nbytes is None:
            unsized += 1
        else:
            moved[kind] += nbytes
    return {**counted, "bytes": sum(moved.values()), "bytes_top": moved.most_common(LISTED), "unsized": unsized}


def node_bytes(node: onnx.NodeProto, sizes: Mapping[str, int | None]) -> int | None:
    """The bytes ``node`` reads and writes (see the module docstring); ``None`` where a size is not known."""
    outputs = [sizes.get(name) for name in node.output if name]
    data, *rest = [sizes.get(name) for name in node.input if name] or [0]
    if any(size is None for size in (*outputs, data, *rest)):
        return None
    written = sum(outputs)  # type: ignore[arg-type]
    read = (written if node.op_type in SELECTIONS and node.domain in ("", "ai.onnx") else data) + sum(rest)  # type: ignore[operator,arg-type]
    return read + written


def torch_launches(step: Callable[[], object]) -> dict[str, Any]:
    """``{"launches", "views", "host_reads", "foreach", "top", "bytes", "bytes_top"}`` of the ATen operations
    that ``step()`` dispatches (see the module docstring)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    kinds: Counter[str] = Counter()
    moved: Counter[str] = Counter()
    views = host = 0

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            nonlocal views, host
            name = func.overloadpacket.__name__
            out = func(*args, **(kwargs or {}))
            if name in HOST_READS:
                host += 1
            elif _is_view(func):
                views += 1
            else:
                kinds[name] += 1
                moved[name] += aten_bytes(name, args, kwargs or {}, out)
            return out

    with Count():
        step()
    foreach = sum(count for name, count in kinds.items() if name.startswith("_foreach_"))
    return {
        "launches": sum(kinds.values()),
        "views": views,
        "host_reads": host,
        "foreach": foreach,
        "top": kinds.most_common(LISTED),
        "bytes": sum(moved.values()),
        "bytes_top": moved.most_common(LISTED),
    }


def aten_bytes(name: str, args: Any, kwargs: Mapping[str, Any], out: Any) -> int:
    """The bytes ATen operation ``name`` reads and writes (see the module docstring): its tensor arguments and
    results, lists of them included; an in-place operation of no result (``_foreach_add_``) writes its first
    argument."""
    import torch
    from torch.utils._pytree import tree_leaves

    def nbytes(tree: Any) -> int:
        return sum(t.numel() * t.element_size() for t in tree_leaves(tree) if isinstance(t, torch.Tensor))

    written = nbytes(out) if out is not None else (nbytes(args[0]) if name.endswith("_") and args else 0)
    if name in TORCH_SELECTIONS and args:
        return written + nbytes(args[1:]) + nbytes(kwargs) + written
    return nbytes(args) + nbytes(kwargs) + written


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


__all__ = [
    "ALIASES",
    "HOST_READS",
    "SELECTIONS",
    "TORCH_SELECTIONS",
    "aten_bytes",
    "node_bytes",
    "onnx_launches",
    "operator_label",
    "torch_launches",
]
