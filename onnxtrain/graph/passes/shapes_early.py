"""The early-shape pass: each ``Shape`` and ``Size`` node right after the node that makes its input.

A gradient reads the shapes of forward values (to un-broadcast, to make
zeros of a value's size) where it needs them, late in the backward. The
value itself is then kept alive until that ``Shape`` runs, which in
onnxruntime's order (the graph's, or its priority order) is the backward:
GPT-2 small at 4 x 128 kept 216 MiB of forward tensors for their shapes
alone. Read right after the value is made, the shape is a few integers and
the value may die as soon as its real readers are done.
"""

from __future__ import annotations

import onnx

from onnxtrain.graph.versions import is_standard

#: The operators that read only their input's shape.
SHAPE_READERS = frozenset({"Shape", "Size"})


def read_shapes_early(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every top-level ``Shape`` and ``Size`` node moved right after the producer of its input
    (to the front for a graph input or initializer), in place; the other nodes keep their order."""
    graph = model.graph
    producer = {name: index for index, node in enumerate(graph.node) for name in node.output if name}
    keys = []
    for index, node in enumerate(graph.node):
        if node.op_type in SHAPE_READERS and is_standard(node) and len(node.input) == 1:
            keys.append((producer.get(node.input[0], -1), 1, index))  # after its producer, in their own order
        else:
            keys.append((index, 0, index))
    order = sorted(range(len(keys)), key=keys.__getitem__)
    if order == list(range(len(keys))):
        return model
    nodes = [graph.node[index] for index in order]
    del graph.node[:]
    graph.node.extend(nodes)
    return model


__all__ = ["SHAPE_READERS", "read_shapes_early"]
