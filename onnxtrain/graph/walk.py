"""Walking a graph with its subgraphs (the branches and bodies of ``If``, ``Loop`` and ``Scan``)."""

from __future__ import annotations

from collections.abc import Iterator

import onnx


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs ``node``'s attributes hold (``g`` and ``graphs``), in attribute order."""
    found: list[onnx.GraphProto] = []
    for attribute in node.attribute:
        if attribute.HasField("g"):
            found.append(attribute.g)
        found.extend(attribute.graphs)
    return found


def all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph``, each followed by the nodes of its subgraphs, at any depth."""
    for node in graph.node:
        yield node
        for subgraph in subgraphs(node):
            yield from all_nodes(subgraph)


__all__ = ["all_nodes", "subgraphs"]
