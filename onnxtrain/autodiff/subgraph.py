"""Differentiating a subgraph (an ``If`` branch, a ``Loop`` or ``Scan`` body) with the engine itself.

A :class:`Subgraph` copies the subgraph into a model of its own, whose graph
inputs are the subgraph's inputs and the values it reads from the enclosing
scopes (typed from the enclosing graph). A control-flow rule adds inputs
(cotangents, accumulators), runs :meth:`Subgraph.vjp` (the engine that calls
the rule, handed over by its context, so every rule and nested control flow
work inside), emits a
little more algebra through :meth:`Subgraph.context`, and takes the result out
with :meth:`Subgraph.to_graph`: the forward nodes the gradient needs (they are
recomputed inside the gradient subgraph) and the gradient nodes, pruned to the
requested outputs. Values read from the enclosing scopes stay references by
name. Names come from the enclosing build's generator: unique in the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx
from onnx import helper

from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.errors import MissingGradientError, RuleError
from onnxtrain.graph.builder import GraphBuilder
from onnxtrain.graph.walk import needed_nodes, outer_references, subgraph_references


class Subgraph:
    """A copy of a subgraph being differentiated (see the module docstring).

    Attributes:
        builder: the :class:`GraphBuilder` over the copy; gradient nodes are appended to it.
        inputs: the subgraph's input names.
        outputs: the subgraph's output names.
        captured: the values it reads from the enclosing scopes, sorted.
    """

    def __init__(
        self, ctx: RuleContext, graph: onnx.GraphProto, input_types: Sequence[onnx.TypeProto | None] = ()
    ) -> None:
        """A copy of ``graph``, a subgraph of ``ctx``'s node, to differentiate with ``ctx``'s engine.

        ``input_types[k]`` overrides the declared type of the subgraph's input
        ``k`` (``None``: keep it); the values it reads from outside get their
        types from the enclosing graph.
        """
        outer = ctx.builder
        self._outer = outer
        self._vjp = ctx.vjp
        self._where = f"{ctx.node.op_type} {ctx.node.name!r}" if ctx.node.name else ctx.node.op_type
        self.inputs: tuple[str, ...] = tuple(value.name for value in graph.input)
        self.outputs: tuple[str, ...] = tuple(value.name for value in graph.output)
        self.captured: tuple[str, ...] = tuple(outer_references(graph))
        copy = onnx.GraphProto()
        copy.CopyFrom(graph)
        for k, value in enumerate(copy.input):
            override = input_types[k] if k < len(input_types) else None
            if override is not None:
                value.type.CopyFrom(override)
        copy.input.extend(_value_info(name, outer.type_of(name)) for name in self.captured)
        model = helper.make_model(copy, opset_imports=list(outer.model.opset_import))
        self.builder = GraphBuilder(model)
        self.builder.names = outer.names  # one generator: names stay unique across the whole model
        self._added: set[str] = set()

    def type_of(self, name: str) -> onnx.TypeProto | None:
        """The type of ``name`` in the subgraph."""
        return self.builder.type_of(name)

    def add_input(self, hint: str, type_proto: onnx.TypeProto | None) -> str:
        """A new input of the subgraph (a cotangent, an accumulator), named from ``hint``."""
        name = self.builder.names.fresh(hint)
        self.builder.add_input(name, self._known(hint, type_proto))
        self._added.add(name)
        return name

    def outer_value(self, name: str, fallback: onnx.TypeProto | None = None) -> str:
        """Make value ``name`` of the enclosing graph readable here (e.g. an output's cotangent).

        Its type is the enclosing graph's, or ``fallback`` where that one is unknown.
        """
        if not any(value.name == name for value in self.builder.model.graph.input):
            type_proto = self._outer.type_of(name)
            self.builder.add_input(name, self._known(name, type_proto if _is_known(type_proto) else fallback))
        return name

    def _known(self, name: str, type_proto: onnx.TypeProto | None) -> onnx.TypeProto:
        if type_proto is None or not _is_known(type_proto):
            raise TypeError(
                f"the gradient of {self._where} needs the type of {name!r}, which is unknown; declare it in "
                "graph.value_info (or the subgraph's inputs and outputs)"
            )
        return type_proto

    def vjp(self, seeds: Mapping[str, str], wrt: Sequence[str]) -> dict[str, str | None]:
        """``sum_y <seeds[y], d y / d x>`` for ``x`` in ``wrt`` (inputs or captured values), or ``None``.

        Errors name the node this subgraph belongs to.
        """
        if not seeds or not wrt:
            return dict.fromkeys(wrt)
        try:
            return self._vjp(self.builder, seeds, wrt)
        except (MissingGradientError, RuleError) as error:
            raise type(error)(f"in a subgraph of {self._where}: {error}") from error

    def context(self) -> RuleContext:
        """A context over the subgraph, for the algebra a rule adds (``ctx.add``, ``ctx.zeros_like``)."""
        node = helper.make_node("Identity", [], [], name=self._where)
        return RuleContext(self.builder, node, 0, [], {}, vjp=self._vjp)

    def reads(self, outputs: Sequence[str]) -> set[str]:
        """The values the nodes computing ``outputs`` read without computing them (``outputs`` included)."""
        nodes = self._needed(outputs)
        produced = {name for node in nodes for name in node.output if name}
        read = {name for node in nodes for name in node.input if name} | set(outputs)
        read |= {name for node in nodes for name in subgraph_references(node)}
        return read - produced

    def to_graph(
        self, name: str, inputs: Sequence[str], outputs: Sequence[str], like: Sequence[str] | None = None
    ) -> onnx.GraphProto:
        """The subgraph ``inputs -> outputs``: the nodes ``outputs`` need, pruned; ``Identity`` where an
        output is not computed by a node (an input, an outer value) or repeats another.

        Output ``k`` is declared with the type of ``like[k]`` (a gradient has its value's type; some
        kernels, such as onnxruntime's Scan before opset 16, need every output's shape), else its own.
        """
        b = self.builder
        nodes = [_copy(node) for node in self._needed(outputs)]
        produced = {out for node in nodes for out in node.output if out}
        names: list[str] = []
        for value in outputs:
            if value in produced and value not in names and value not in inputs:
                names.append(value)
            else:
                copy = b.names.fresh(f"{value}_out")
                nodes.append(helper.make_node("Identity", [value], [copy], name=b.names.fresh("Identity")))
                names.append(copy)
        initializers = {t.name: t for t in b.model.graph.initializer}
        read = {n for node in nodes for n in node.input if n} | {n for node in nodes for n in subgraph_references(node)}
        read -= {out for node in nodes for out in node.output if out}
        own = (set(self.inputs) | self._added) - set(inputs)
        unlisted = sorted(read & own)
        if unlisted:
            raise RuntimeError(
                f"the gradient subgraph of {self._where} reads {unlisted}, which are not among its inputs"
            )
        return helper.make_graph(
            nodes,
            name,
            [_value_info(value, b.type_of(value)) for value in inputs],
            [_value_info(new, b.type_of(old)) for new, old in zip(names, like or outputs, strict=True)],
            [initializers[n] for n in sorted(read) if n in initializers],
        )

    def _needed(self, outputs: Sequence[str]) -> list[onnx.NodeProto]:
        return needed_nodes(self.builder.model.graph.node, outputs)


def _is_known(type_proto: onnx.TypeProto | None) -> bool:
    """A type that says what the value is: a tensor of known element type, a sequence, ..."""
    if type_proto is None or type_proto.WhichOneof("value") is None:
        return False
    return not type_proto.HasField("tensor_type") or bool(type_proto.tensor_type.elem_type)


def _value_info(name: str, type_proto: onnx.TypeProto | None) -> onnx.ValueInfoProto:
    value = onnx.ValueInfoProto(name=name)
    if type_proto is not None:
        value.type.CopyFrom(type_proto)
    return value


def _copy(node: onnx.NodeProto) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    return copy
