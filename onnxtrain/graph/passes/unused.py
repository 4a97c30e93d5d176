"""The unused-value passes: nodes no output needs, and initializers nothing reads, removed."""

from __future__ import annotations

import onnx

from onnxtrain.graph.walk import names_read, needed_nodes


def prune_unused_nodes(model: onnx.ModelProto, *, fixed: int = 0) -> onnx.ModelProto:
    """``model`` without the nodes its outputs do not depend on, nor the initializers only they read, in place.

    ``fixed``: the graph's first nodes, kept whatever is read of them (the
    forward graph a gradient is drafted after).
    """
    graph = model.graph
    outputs = {value.name for value in graph.output}
    kept = [*graph.node[:fixed], *needed_nodes(graph.node[fixed:], outputs)]
    needed = outputs.union(*(names_read(node) for node in kept))
    del graph.node[:]
    graph.node.extend(kept)
    initializers = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    return model


def drop_unread_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` without the initializers no node, subgraph or output reads (the inputs of folded nodes)."""
    graph = model.graph
    read = {name for node in graph.node for name in names_read(node)} | {value.name for value in graph.output}
    kept = [tensor for tensor in graph.initializer if tensor.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return model


__all__ = ["drop_unread_initializers", "prune_unused_nodes"]
