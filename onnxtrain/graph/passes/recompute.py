"""The recompute pass: element-wise forward values the backward reads are computed again there, not kept.

A training graph keeps every forward value a gradient reads until that
gradient runs. An activation exported as a chain of element-wise nodes (GPT-2's
tanh GELU: ``Pow``, ``Mul``, ``Add``, ``Tanh``, ``Add``, ``Mul``) keeps each
link of the chain, where PyTorch's fused kernel keeps its input alone: five
tensors of the MLP's width per layer instead of one. Element-wise nodes cost
one pass over their output; recomputing them in the backward, from inputs the
backward keeps anyway, lets each forward value die with its last forward
reader. The recomputed values are bit for bit the forward's (the same kernels
on the same inputs), so the gradients do not change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import onnx

from onnxtrain.graph.naming import first_free, names_in
from onnxtrain.graph.walk import names_read, subgraphs

#: Deterministic element-wise operators of ai.onnx, each one pass over its output: recomputed rather than kept.
ELEMENTWISE = frozenset(
    {
        "Abs", "Add", "Cast", "Cos", "Div", "Erf", "Exp", "Identity", "LeakyRelu", "Log", "Max", "Min", "Mul", "Neg",
        "Pow", "Reciprocal", "Relu", "Sigmoid", "Sin", "Softplus", "Sqrt", "Sub", "Tanh", "Where",
    }
)  # fmt: skip


#: Known elements per sample (the product of a value's known dimensions) from which a value is recomputed: below,
#: keeping it costs little and its copy costs a node (a small MLP's graph grows by a tenth).
MIN_KNOWN_ELEMENTS = 1024

#: The ``metadata_props`` key of a model with recomputed values; its value is how many nodes were copied. Sessions
#: of such a model run without onnxruntime's common-subexpression elimination, which would merge each copy back
#: into its forward node and keep the value alive again (see :func:`transformers_to_disable`).
RECOMPUTED_KEY = "onnxtrain.recomputed_nodes"


def recompute_elementwise(
    model: onnx.ModelProto, *, backward_from: int, shapes: Mapping[str, Sequence[int | None]]
) -> onnx.ModelProto:
    """``model`` with element-wise forward values recomputed for the backward (see the module docstring), in place.

    ``backward_from``: the index of the graph's first backward node (the
    nodes before it are the forward pass); ``shapes``: the values' dimensions
    (``None`` where unknown). A forward value is *derivable* when an
    element-wise node of one output makes it from values that are there in
    the backward anyway (graph inputs, initializers, values the backward reads
    that are not derivable) or derivable. Each derivable value a backward node
    reads whose known dimensions hold at least :data:`MIN_KNOWN_ELEMENTS`
    elements is recomputed, with the derivable values it is made from; each
    copy goes right before the first backward node that needs it.
    """
    graph = model.graph
    forward, backward = list(graph.node[:backward_from]), list(graph.node[backward_from:])
    read_by_backward = {name for node in backward for name in names_read(node)}
    available = {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer}
    derivable: dict[str, onnx.NodeProto] = {}  # element-wise values computable in the backward from what is there
    for node in forward:
        if _elementwise(node) and all(name in available or name in derivable for name in node.input if name):
            derivable[node.output[0]] = node
        else:  # kept where the backward reads it
            available.update(name for name in node.output if name in read_by_backward)
    targets = [
        value
        for value in derivable
        if value in read_by_backward and _known_elements(shapes.get(value)) >= MIN_KNOWN_ELEMENTS
    ]
    # the targets, and the derivable values they are computed from that the backward does not keep itself
    needed, stack = set(), list(targets)
    while stack:
        value = stack.pop()
        if value in needed:
            continue
        needed.add(value)
        stack.extend(name for name in derivable[value].input if name in derivable and name not in needed)
    keep = {value for value in needed if value in read_by_backward and value not in targets}
    recomputed = {value: node for value, node in derivable.items() if value in needed and value not in keep}
    if not recomputed:
        return model
    taken = names_in(graph)
    copies = {value: first_free(f"{value}.recomputed", taken) for value in recomputed}
    first_use = _first_uses(backward, recomputed)
    order = {value: index for index, value in enumerate(recomputed)}
    placed: dict[int, list[onnx.NodeProto]] = {}
    for value in sorted(recomputed, key=lambda v: (first_use[v], order[v])):
        source = recomputed[value]
        copy = onnx.NodeProto()
        copy.CopyFrom(source)
        copy.name = first_free(f"{source.name or source.op_type}.recomputed", taken)
        copy.input[:] = [copies.get(name, name) for name in source.input]
        copy.output[:] = [copies[value]]
        placed.setdefault(first_use[value], []).append(copy)
    for node in backward:
        node.input[:] = [copies.get(name, name) for name in node.input]
    nodes = list(forward)
    for index, node in enumerate(backward):
        nodes.extend(placed.get(index, []))
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    _record(model, sum(len(copies) for copies in placed.values()))
    return model


def recomputes(model: onnx.ModelProto) -> bool:
    """Whether ``model`` holds values recomputed by :func:`recompute_elementwise`."""
    return any(prop.key == RECOMPUTED_KEY for prop in model.metadata_props)


def transformers_to_disable(model: onnx.ModelProto) -> list[str]:
    """onnxruntime's graph transformers a session of ``model`` should run without (its ``disabled_optimizers``):
    common-subexpression elimination when the model recomputes values, since it would merge each copy back
    into its forward node and keep the value alive through the backward again."""
    return ["CommonSubexpressionElimination"] if recomputes(model) else []


def _record(model: onnx.ModelProto, copies: int) -> None:
    """Record in ``model``'s metadata that ``copies`` nodes recompute forward values (added to any earlier count)."""
    earlier = 0
    for prop in list(model.metadata_props):
        if prop.key == RECOMPUTED_KEY:
            earlier = int(prop.value)
            model.metadata_props.remove(prop)
    model.metadata_props.add(key=RECOMPUTED_KEY, value=str(earlier + copies))


def _elementwise(node: onnx.NodeProto) -> bool:
    """An element-wise node of one output (and no subgraph)."""
    return (
        node.op_type in ELEMENTWISE and node.domain in ("", "ai.onnx") and len(node.output) == 1 and not subgraphs(node)
    )


def _known_elements(dims: Sequence[int | None] | None) -> int:
    """The product of the known dimensions (0 for an unknown shape)."""
    if dims is None:
        return 0
    return math.prod(d for d in dims if isinstance(d, int))


def _first_uses(backward: list[onnx.NodeProto], recomputed: dict[str, onnx.NodeProto]) -> dict[str, int]:
    """For each recomputed value, the index of the first backward node that reads it or a copy made from it."""
    first = {value: len(backward) for value in recomputed}
    for index, node in enumerate(backward):
        for name in names_read(node):
            if name in first and first[name] > index:
                first[name] = index
    for value in reversed(list(recomputed)):  # a copy's inputs are needed no later than the copy itself
        for name in recomputed[value].input:
            if name in first:
                first[name] = min(first[name], first[value])
    return first


__all__ = [
    "ELEMENTWISE",
    "MIN_KNOWN_ELEMENTS",
    "RECOMPUTED_KEY",
    "recompute_elementwise",
    "recomputes",
    "transformers_to_disable",
]
