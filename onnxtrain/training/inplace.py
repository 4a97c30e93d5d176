"""Which outputs of a graph may be written into the buffers of its inputs (an update in place).

onnxruntime treats inputs as read-only and never checks whether an output
buffer the caller binds is also an input's. Binding output ``y`` into the
buffer of input ``x`` is safe exactly when no node can read ``x`` after the
node that writes ``y`` has started: every node that reads ``x`` is an
ancestor of that writer (data dependencies order them in any execution
order), or is the writer itself and an element-wise operator, whose kernels
read each element before writing the element at the same place. ``x`` must
not be an output itself, nor share its buffer with another pair.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx

from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import names_read, readers_of

#: Operators whose output element ``i`` depends on input element ``i`` only (same shapes), so that the
#: output may overwrite an input of the same shape while the kernel runs.
ELEMENT_WISE = frozenset(
    {
        "Abs", "Add", "Cast", "Ceil", "Clip", "Div", "Exp", "Floor", "Identity", "Log", "Max", "Min", "Mul",
        "Neg", "Pow", "Reciprocal", "Relu", "Sigmoid", "Sign", "Sqrt", "Sub", "Tanh", "Where",
    }
)  # fmt: skip


def unsafe_in_place(graph: onnx.GraphProto, pairs: Mapping[str, str]) -> dict[str, str]:
    """``{input: why}`` for the pairs ``{input: output}`` whose output may not overwrite the input's buffer."""
    producers = {name: node for node in graph.node for name in node.output if name}
    readers = readers_of(graph.node, names_read)
    outputs = {value.name for value in graph.output}
    inputs = {value.name for value in graph.input}
    unsafe: dict[str, str] = {}
    if len(set(pairs.values())) != len(pairs):
        seen: set[str] = set()
        for source, target in pairs.items():
            if target in seen:
                unsafe[source] = f"output {target!r} is paired with two inputs"
            seen.add(target)
    for source, target in pairs.items():
        if source in unsafe:
            continue
        writer = producers.get(target)
        if source not in inputs:
            unsafe[source] = "it is not an input of the graph"
        elif target not in outputs or writer is None:
            unsafe[source] = f"{target!r} is not an output a node of the graph writes"
        elif source in outputs:
            unsafe[source] = "it is also an output of the graph"
        else:
            before = _ancestors(writer, producers)
            for reader in readers.get(source, []):
                if reader is writer:
                    if writer.op_type not in ELEMENT_WISE or not is_standard(writer):
                        unsafe[source] = f"{writer.op_type} reads it and writes {target!r}: not element-wise"
                        break
                elif id(reader) not in before:
                    what = reader.name or reader.op_type
                    unsafe[source] = f"node {what!r} may read it after {target!r} is written"
                    break
    return unsafe


def _ancestors(node: onnx.NodeProto, producers: Mapping[str, onnx.NodeProto]) -> set[int]:
    """``id()`` of every node ``node`` depends on, through its inputs and its subgraphs' outer reads."""
    seen: set[int] = set()
    stack = [node]
    while stack:
        for name in names_read(stack.pop()):
            parent = producers.get(name)
            if parent is not None and id(parent) not in seen:
                seen.add(id(parent))
                stack.append(parent)
    return seen


__all__ = ["ELEMENT_WISE", "unsafe_in_place"]
