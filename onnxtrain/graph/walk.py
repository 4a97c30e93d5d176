"""Walking a graph with its subgraphs (the branches and bodies of ``If``, ``Loop`` and ``Scan``): the one home
of graph traversal.

Value names are unique across a model and its subgraphs, so a name a
subgraph reads without defining it is always a value of an enclosing scope.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence

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


def node_label(node: onnx.NodeProto, index: int) -> str:
    """``MatMul 'mm_3'`` (or ``MatMul #3`` for an unnamed node), for messages."""
    return f"{node.op_type} {node.name!r}" if node.name else f"{node.op_type} #{index}"


def _outer_references(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads from the enclosing scopes."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        used.update(name for name in node.input if name)
        used.update(subgraph_references(node))
        defined.update(node.output)
    return used - defined


def outer_references(graph: onnx.GraphProto) -> list[str]:
    """The values ``graph`` (a subgraph) reads from the enclosing scopes, sorted."""
    return sorted(_outer_references(graph))


def subgraph_references(node: onnx.NodeProto) -> set[str]:
    """The values ``node``'s subgraphs (``If`` branches, ``Loop``/``Scan`` bodies) read from the enclosing scopes."""
    refs: set[str] = set()
    for graph in subgraphs(node):
        refs |= _outer_references(graph)
    return refs


def constant_tensors(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """``graph``'s constant tensors by name: its initializers and its ``Constant`` nodes given as a tensor."""
    found = {tensor.name: tensor for tensor in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
            found[node.output[0]] = node.attribute[0].t
    return found


def names_read(node: onnx.NodeProto) -> set[str]:
    """The values ``node`` reads: its inputs, and the outer values its subgraphs read, at any depth."""
    return {name for name in node.input if name} | subgraph_references(node)


def inputs_read(node: onnx.NodeProto) -> list[str]:
    """``node``'s inputs, each once, in order, without the empty names of inputs left out."""
    return list(dict.fromkeys(name for name in node.input if name))


def readers_of(
    nodes: Iterable[onnx.NodeProto], read: Callable[[onnx.NodeProto], Iterable[str]] = inputs_read
) -> dict[str, list[onnx.NodeProto]]:
    r"""``{value: the nodes that read it}``, in the order of ``nodes``, each node once per value it ``read``\ s
    (by default its inputs, :func:`inputs_read`; :func:`names_read` adds what its subgraphs read)."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in read(node):
            readers.setdefault(name, []).append(node)
    return readers


def rename_references(node: onnx.NodeProto, renames: Mapping[str, str]) -> None:
    """Rename the values ``node`` reads, in its inputs and in its subgraphs (recursively), where a subgraph does
    not define the name itself."""
    if not renames:
        return
    node.input[:] = [renames.get(name, name) for name in node.input]
    for graph in subgraphs(node):
        defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
        defined.update(name for inner in graph.node for name in inner.output)
        outer = {old: new for old, new in renames.items() if old not in defined}
        for inner in graph.node:
            rename_references(inner, outer)
        for value in graph.output:
            value.name = outer.get(value.name, value.name)


def rename_values(graph: onnx.GraphProto, renames: Mapping[str, str]) -> None:
    """Rename values everywhere in ``graph`` and its subgraphs: node inputs and outputs, graph outputs and value
    infos (for names that are unique across the model, as ONNX requires)."""
    for node in graph.node:
        node.input[:] = [renames.get(name, name) for name in node.input]
        node.output[:] = [renames.get(name, name) for name in node.output]
        for subgraph in subgraphs(node):
            rename_values(subgraph, renames)
    for value in (*graph.output, *graph.value_info):
        value.name = renames.get(value.name, value.name)


def needed_nodes(nodes: Sequence[onnx.NodeProto], outputs: Iterable[str]) -> list[onnx.NodeProto]:
    """The nodes of ``nodes`` (in graph order) that ``outputs`` depend on, in their order."""
    needed = set(outputs)
    kept: list[onnx.NodeProto] = []
    for node in reversed(nodes):
        if any(name in needed for name in node.output if name):
            kept.append(node)
            needed.update(names_read(node))
    kept.reverse()
    return kept


def computed_from(sources: Iterable[str], edges: Sequence[tuple[Collection[str], Sequence[str]]]) -> set[str]:
    """``sources`` and every value computed from them: the names each edge ``(reads, writes)`` writes once it
    reads one already reached, until no edge reaches more, whatever the edges' order (a node's inputs and
    outputs; a loop's body input, from what enters the loop and what the body returns for it)."""
    reached = set(sources)
    grew = bool(reached)
    while grew:
        grew = False
        for reads, writes in edges:
            if not reached.isdisjoint(reads):
                fresh = [name for name in writes if name and name not in reached]
                reached.update(fresh)
                grew = grew or bool(fresh)
    return reached


def topological_order(nodes: Sequence[onnx.NodeProto]) -> list[int]:
    """Indices of ``nodes`` in a topological order, stable with respect to the given one."""
    producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}
    deps: list[set[int]] = []
    users: list[list[int]] = [[] for _ in nodes]
    for i, node in enumerate(nodes):
        before = {producer[n] for n in names_read(node) if n in producer and producer[n] != i}
        deps.append(before)
        for j in before:
            users[j].append(i)
    remaining = [len(d) for d in deps]
    ready = collections.deque(i for i, r in enumerate(remaining) if r == 0)
    order: list[int] = []
    while ready:
        i = ready.popleft()
        order.append(i)
        for j in sorted(users[i]):
            remaining[j] -= 1
            if remaining[j] == 0:
                ready.append(j)
    if len(order) != len(nodes):
        stuck = [node_label(nodes[i], i) for i, r in enumerate(remaining) if r > 0][:5]
        raise ValueError(f"the graph has a cycle (nodes {stuck} wait on each other); an ONNX graph must be acyclic")
    return order


__all__ = [
    "all_nodes",
    "computed_from",
    "constant_tensors",
    "inputs_read",
    "names_read",
    "needed_nodes",
    "node_label",
    "outer_references",
    "readers_of",
    "rename_references",
    "rename_values",
    "subgraph_references",
    "subgraphs",
    "topological_order",
]
