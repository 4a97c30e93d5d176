"""The transpose pass: transposes stacked on each other, or on a product, folded.

Gradients of a transposed weight (``MatMul(x, Transpose(W))``, as PyTorch
exports ``nn.Linear`` on 3-D inputs) are full of these:

- ``Transpose(Transpose(x, p), q)`` becomes ``Transpose(x, p[q])``, or ``x``
  when ``p[q]`` is the identity;
- ``Transpose(Gemm(a, b), [1, 0])`` (no ``C``, its only use) becomes
  ``Gemm(b, a)`` with ``transA = not transB`` and ``transB = not transA``.
"""

from __future__ import annotations

from collections import Counter

import onnx

from onnxtrain.graph.attributes import attributes as node_attributes
from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import rename_references


def fold_transposes(model: onnx.ModelProto, *, fixed: int = 0) -> onnx.ModelProto:
    """``model`` with its stacked transposes folded (see the module docstring), in place.

    ``fixed``: the graph's first nodes (the forward graph a gradient is
    drafted after), which are read but never changed. The graph's outputs
    keep their names; nodes left unused stay for
    :func:`~onnxtrain.graph.passes.unused.prune_unused_nodes`.
    """
    graph = model.graph
    results = {value.name for value in graph.output}
    nodes = list(graph.node[fixed:])
    producer = {name: node for node in graph.node for name in node.output if name}
    backward = {id(node) for node in nodes}
    uses = Counter(name for node in nodes for name in node.input if name)
    aliases: dict[str, str] = {}
    kept: list[onnx.NodeProto] = []
    for node in nodes:
        rename_references(node, aliases)
        outer = _perm(node)
        source = producer.get(node.input[0]) if outer is not None else None
        if outer is None or source is None:
            kept.append(node)
            continue
        inner = _perm(source)
        if inner is not None and len(inner) == len(outer):
            composed = [inner[axis] for axis in outer]
            if composed == list(range(len(composed))) and node.output[0] not in results:
                aliases[node.output[0]] = source.input[0]
                continue
            node.input[0] = source.input[0]
            del node.attribute[:]
            node.attribute.append(onnx.helper.make_attribute("perm", composed))
        elif (
            outer == [1, 0]
            and source.op_type == "Gemm"
            and is_standard(source)
            and id(source) in backward
            and len([name for name in source.input if name]) == 2
            and uses[source.output[0]] == 1
            and source.output[0] not in results
        ):
            attributes = node_attributes(source)
            trans_a, trans_b = int(attributes.pop("transA", 0)), int(attributes.pop("transB", 0))
            source.input[:] = [source.input[1], source.input[0]]
            del source.attribute[:]
            source.attribute.extend(
                onnx.helper.make_attribute(name, value)
                for name, value in {**attributes, "transA": 1 - trans_b, "transB": 1 - trans_a}.items()
            )
            source.output[0] = node.output[0]
            producer[node.output[0]] = source
            continue
        kept.append(node)
    del graph.node[fixed:]
    graph.node.extend(kept)
    return model


def _perm(node: onnx.NodeProto) -> list[int] | None:
    """The ``perm`` of a standard Transpose node, ``None`` when absent (it then depends on the rank)."""
    if node.op_type != "Transpose" or not is_standard(node):
        return None
    for attribute in node.attribute:
        if attribute.name == "perm":
            return list(attribute.ints)
    return None


__all__ = ["fold_transposes"]
