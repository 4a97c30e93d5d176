"""Which nodes lie between the values to differentiate and the loss.

A node is *on the path* when one of its differentiable inputs depends on a
``wrt`` value (through float values and differentiable operators) and the
loss depends on one of its outputs. Only those nodes are differentiated.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import onnx

from onnxtrain.autodiff.registry import GradientRegistry, Rule, StraightThrough, domain_key
from onnxtrain.graph import dtypes, versions
from onnxtrain.graph.builder import GraphBuilder
from onnxtrain.graph.walk import names_read, node_label, readers_of, subgraph_references, topological_order

#: The most operators a straight-through pair's values pass between its two (a ``Clip`` of the codes).
_STRAIGHT_THROUGH_DEPTH = 4


@dataclass
class PathNode:
    """A node on the path, with what the engine needs to differentiate it."""

    index: int
    node: onnx.NodeProto
    opset: int
    rule: Rule | None


@dataclass
class Path:
    """The result of :func:`find_path`.

    Attributes:
        nodes: the nodes on the path, in topological order.
        forward: values that depend on a ``wrt`` value.
        backward: values the loss depends on.
    """

    nodes: list[PathNode]
    forward: set[str]
    backward: set[str]
    all_nodes: list[onnx.NodeProto]

    def describe(self, target: int, wrt: Iterable[str], loss: str | Sequence[str]) -> str:
        """``'w' -> MatMul 'mm' -> Foo 'f' -> ReduceSum 'r' -> 'loss'``: a route through node ``target``.

        ``loss`` may be several values (the outputs a vector-Jacobian product seeds).
        """
        ends = {loss} if isinstance(loss, str) else set(loss)
        nodes = self.all_nodes
        producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}
        consumers: dict[str, list[int]] = collections.defaultdict(list)
        for i, node in enumerate(nodes):
            for name in {n for n in node.input if n} | subgraph_references(node):
                consumers[name].append(i)
        wrt = set(wrt)
        up: list[str] = []  # from the target back to a wrt value, through values that depend on one
        current, seen = target, {target}
        while True:
            node = nodes[current]
            up.append(node_label(node, current))
            inputs = [n for n in node.input if n in self.forward]
            inputs += sorted(subgraph_references(node) & self.forward)
            start = next((n for n in inputs if n in wrt), None)
            if start is not None:
                up.append(repr(start))
                break
            nxt = next((producer[n] for n in inputs if n in producer and producer[n] not in seen), None)
            if nxt is None:
                break
            seen.add(nxt)
            current = nxt
        down: list[str] = []  # from the target on to the loss, through values the loss depends on
        current = target
        while not ends & set(nodes[current].output):
            nxt = next(
                (
                    j
                    for name in nodes[current].output
                    if name in self.backward
                    for j in consumers.get(name, [])
                    if j not in seen and any(o in self.backward for o in nodes[j].output)
                ),
                None,
            )
            if nxt is None:
                break
            seen.add(nxt)
            current = nxt
            down.append(node_label(nodes[current], current))
        end = next((name for name in nodes[current].output if name in ends), None)
        return " -> ".join([*reversed(up), *down, repr(end if end is not None else sorted(ends)[0])])


def _is_float_or_unknown(builder: GraphBuilder, name: str) -> bool:
    return carries_float(builder.type_of(name))


def carries_float(type_proto: onnx.TypeProto | None) -> bool:
    """Whether a value of this type can carry a gradient: float tensors, sequences or optionals of them.

    An unknown type counts too: the rule that consumes the value decides.
    """
    if type_proto is None:
        return True
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        return dtypes.is_float(type_proto.tensor_type.elem_type)
    if kind in ("sequence_type", "optional_type"):
        inner = getattr(type_proto, kind)
        return carries_float(inner.elem_type if inner.HasField("elem_type") else None)
    return False


def _passes_straight_through(
    node: onnx.NodeProto,
    registry: GradientRegistry,
    readers: dict[str, list[onnx.NodeProto]],
    outputs: set[str],
    straight: dict[str, StraightThrough],
) -> StraightThrough | None:
    """The pair ``node`` is part of, where its outputs only lead to the pair's second operator
    (:meth:`GradientRegistry.straight_through`): ``node`` is the first, or an operator allowed between, reading a
    value of the pair (``straight``); each of its outputs is read, only by the second operator or by operators
    allowed between whose outputs are read so in turn, and none is an output of the graph."""
    pair = registry.straight_through_of(node.op_type, node.domain)
    if pair is None:
        pair = next((straight[name] for name in node.input[:1] if name in straight), None)
        if pair is None or node.op_type not in pair.through or not versions.is_standard(node):
            return None

    def leads_to_reader(name: str, depth: int) -> bool:
        found = readers.get(name)
        if name in outputs or not found or depth > _STRAIGHT_THROUGH_DEPTH:
            return False
        return all(
            domain_key(r.domain) == domain_key(node.domain)
            and (
                r.op_type == pair.reader
                or (r.op_type in pair.through and all(leads_to_reader(o, depth + 1) for o in r.output if o))
            )
            for r in found
        )

    return pair if all(leads_to_reader(name, 0) for name in node.output if name) else None


def find_path(builder: GraphBuilder, loss: str | Sequence[str], wrt: Sequence[str], registry: GradientRegistry) -> Path:
    """The nodes to differentiate to get ``d loss / d wrt`` (see the module docstring).

    ``loss`` may be several values: the outputs of a vector-Jacobian product.
    A node with subgraphs is reached through the values they read, too.
    """
    model = builder.model
    nodes = list(model.graph.node)
    order = topological_order(nodes)
    forward = set(wrt)
    candidates: list[PathNode] = []
    readers = readers_of(nodes, names_read)
    outputs = {value.name for value in model.graph.output}
    straight: dict[str, StraightThrough] = {}  # the values of straight-through pairs, with their pair
    for i in order:
        node = nodes[i]
        if registry.is_non_differentiable(node.op_type, node.domain):
            continue
        opset = versions.opset_version(model, node.domain) or 0
        rule = registry.lookup(node.op_type, node.domain, opset)
        reached = any(
            name in forward and (rule is None or rule.differentiable(k)) for k, name in enumerate(node.input)
        ) or bool(subgraph_references(node) & forward)
        if not reached:
            continue
        pair = _passes_straight_through(node, registry, readers, outputs, straight)
        if pair is not None:  # the pair's second operator differentiates it
            forward.update(name for name in node.output if name)
            straight.update((name, pair) for name in node.output if name)
            continue
        candidates.append(PathNode(i, node, opset, rule))
        forward.update(name for name in node.output if name and _is_float_or_unknown(builder, name))
    backward = {loss} if isinstance(loss, str) else set(loss)
    for i in reversed(order):
        node = nodes[i]
        if any(name in backward for name in node.output):
            backward.update(name for name in node.input if name)
            backward.update(subgraph_references(node))
    on_path = [p for p in candidates if any(name in backward for name in p.node.output)]
    return Path(on_path, forward, backward, nodes)
