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
from collections.abc import Callable, Collection, Mapping, Sequence

import onnx

from onnxtrain.graph.naming import first_free, names_in
from onnxtrain.graph.passes.hold_back import hold_copies
from onnxtrain.graph.versions import is_standard, opset_version
from onnxtrain.graph.walk import names_read, subgraphs

#: Deterministic element-wise operators of ai.onnx, each one pass over its output: recomputed rather than kept.
#: Not ``Softplus``: onnxruntime's CPU kernel is a scalar loop, 5.7 ms on 1.2M floats (2 cores) where ``Exp``
#: takes 0.06 and ``Tanh`` 0.13; a Mish (``x * tanh(softplus(x))``) keeps ``tanh``'s output instead.
ELEMENTWISE = frozenset(
    {
        "Abs", "Add", "Cast", "Cos", "Div", "Erf", "Exp", "Identity", "LeakyRelu", "Log", "Max", "Min", "Mul", "Neg",
        "Pow", "Reciprocal", "Relu", "Sigmoid", "Sin", "Sqrt", "Sub", "Tanh", "Where",
    }
)  # fmt: skip


#: Operators of ai.onnx never recomputed from checkpoints: random ones (a copy would draw other numbers), and
#: ``Constant`` (a copy would copy its data).
NOT_RECOMPUTED = frozenset(
    {
        "Bernoulli", "Constant", "Dropout", "Multinomial", "RandomNormal", "RandomNormalLike", "RandomUniform",
        "RandomUniformLike",
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
    model: onnx.ModelProto,
    *,
    backward_from: int,
    shapes: Mapping[str, Sequence[int | None]],
    elem_type: Callable[[str], int | None] | None = None,
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
    copy goes right before the first backward node that needs it. With
    ``elem_type`` (the values' element types, ``None`` where unknown) the
    copies are held back until the backward reaches them
    (:func:`~onnxtrain.graph.passes.hold_back.hold_copies`): onnxruntime
    numbers the nodes its fusions make after every other, so it would run a
    copy as soon as its inputs exist, in the forward, whenever the next
    forward node is a fused one, and keep its output to the backward (GPT-2
    small at 16 x 256: 24 GELU products of 48 MiB each alive at the step's
    peak, 7.91 instead of 6.79 GiB).
    """
    return _recompute(
        model,
        backward_from,
        recomputable=_elementwise,
        worth=lambda value: _known_elements(shapes.get(value)) >= MIN_KNOWN_ELEMENTS,
        elem_type=elem_type,
        rank=lambda value: _rank(shapes, value),
    )


def recompute_from_checkpoints(
    model: onnx.ModelProto,
    *,
    backward_from: int,
    shapes: Mapping[str, Sequence[int | None]],
    checkpoints: Collection[str],
    elem_type: Callable[[str], int | None] | None = None,
) -> onnx.ModelProto:
    """``model`` with the forward values the backward reads recomputed from ``checkpoints``, in place
    (activation checkpointing, as ``torch.utils.checkpoint``).

    The forward values named in ``checkpoints`` are kept for the backward;
    every other forward value a backward node reads is made again by copies
    of the forward nodes between the checkpoints (and the graph's inputs and
    initializers), each copy right before the first backward node that needs
    it: the segment after a checkpoint is recomputed when the backward
    reaches it, and its values die with its gradients. The nodes after the
    last checkpoint are not copied: their gradients run first, right after
    the forward, so keeping their values costs no more. Nodes that cannot
    give the same values twice are never copied and their outputs are kept:
    random operators (``Dropout``, ``Random*``, ``Bernoulli``,
    ``Multinomial``), ``Constant``, operators of other domains, and nodes
    with subgraphs. Values whose dimensions are all known and hold fewer
    than :data:`MIN_KNOWN_ELEMENTS` elements are kept (shape computations,
    say), and the copies read them. Values made from graph inputs alone (a
    weight transposed, or cast to a half type) are recomputed too: keeping
    them would keep a copy of those weights. The cost: one more
    forward pass of the recomputed nodes per step.

    The copies of a segment are held back until the backward reaches it
    (:func:`~onnxtrain.graph.passes.hold_back.hold_copies`), else onnxruntime
    may run them in the forward. ``elem_type`` gives the values' element
    types (``None`` where unknown: such a value is not held); without it,
    nothing is held.
    """
    kept = frozenset(checkpoints)
    forward = model.graph.node[:backward_from]
    last = max((k for k, node in enumerate(forward) if not kept.isdisjoint(node.output)), default=-1)
    tail = {name for node in forward[last + 1 :] for name in node.output}  # its backward runs first: kept

    def recomputable(node: onnx.NodeProto) -> bool:
        return _deterministic(node) and kept.isdisjoint(node.output) and tail.isdisjoint(node.output)

    return _recompute(
        model,
        backward_from,
        recomputable=recomputable,
        worth=lambda v: _per_batch(shapes.get(v)),
        kept=kept,
        keep_small=True,
        elem_type=elem_type,
        rank=lambda value: _rank(shapes, value),
    )


def _rank(shapes: Mapping[str, Sequence[int | None]], value: str) -> int | None:
    """The rank of ``value`` in ``shapes`` (``None`` where its shape is unknown)."""
    dims = shapes.get(value)
    return None if dims is None else len(dims)


def _recompute(
    model: onnx.ModelProto,
    backward_from: int,
    *,
    recomputable: Callable[[onnx.NodeProto], bool],
    worth: Callable[[str], bool],
    kept: Collection[str] = (),
    keep_small: bool = False,
    elem_type: Callable[[str], int | None] | None = None,
    rank: Callable[[str], int | None] = lambda name: None,
) -> onnx.ModelProto:
    """Copy into the backward the forward nodes that make the values the backward reads, in place.

    A forward value is *derivable* when a ``recomputable`` node makes it
    from values the backward has anyway (graph inputs, initializers,
    ``Constant`` nodes, the outputs of other nodes that the backward reads or
    that are in ``kept``)
    or derivable ones. Each derivable value the backward reads and that is
    ``worth`` it is recomputed, with the derivable values it is made from;
    a derivable value the backward reads that is not worth it is kept, and
    with ``keep_small``, so is one a recomputed value is made from (a
    shape computation, say: the copies read it).
    Each copy goes right before the first backward node that needs it; with
    ``elem_type`` (and ``rank``: the values' ranks, ``None`` where unknown),
    the copies are held back until the backward reaches them
    (:func:`~onnxtrain.graph.passes.hold_back.hold_copies`).
    """
    graph = model.graph
    forward, backward = list(graph.node[:backward_from]), list(graph.node[backward_from:])
    read_by_backward = {name for node in backward for name in names_read(node)}
    there = {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer}
    constant = {tensor.name for tensor in graph.initializer}
    made_by: dict[str, int] = {}  # derivable value -> the forward node making it
    for index, node in enumerate(forward):
        if recomputable(node) and all(name in there or name in made_by for name in node.input if name):
            made_by.update((name, index) for name in node.output if name)
        elif node.op_type == "Constant" and is_standard(node):  # a constant, read where it is
            there.update(node.output)
            constant.update(node.output)
        else:  # kept where the backward reads it
            there.update(name for name in node.output if name in read_by_backward or name in kept)
    targets = {value for value in made_by if value in read_by_backward and worth(value)}

    def kept_if_small(value: str) -> bool:
        return keep_small and not worth(value)

    # the targets, and the derivable values they are made from that the backward does not keep itself
    recomputed: set[str] = set()
    stack = list(targets)
    while stack:
        value = stack.pop()
        if value in recomputed or (value not in targets and (value in read_by_backward or kept_if_small(value))):
            continue
        recomputed.add(value)
        stack.extend(name for name in forward[made_by[value]].input if name in made_by)
    if not recomputed:
        return model
    sources = sorted({made_by[value] for value in recomputed})
    taken = names_in(graph)
    copies = {
        value: first_free(f"{value}.recomputed", taken) for index in sources for value in forward[index].output if value
    }
    first_use = _first_uses(backward, forward, sources, recomputed, made_by)
    placed: dict[int, list[onnx.NodeProto]] = {}
    for index in sorted(sources, key=lambda i: (first_use[i], i)):
        source = forward[index]
        copy = onnx.NodeProto()
        copy.CopyFrom(source)
        copy.name = first_free(f"{source.name or source.op_type}.recomputed", taken)
        copy.input[:] = [copies[name] if name in recomputed else name for name in source.input]
        copy.output[:] = [copies.get(name, name) for name in source.output]
        placed.setdefault(first_use[index], []).append(copy)
    for node in backward:
        node.input[:] = [copies[name] if name in recomputed else name for name in node.input]
    if elem_type is not None:
        original = {copied: value for value, copied in copies.items()}
        hold_copies(
            graph,
            backward,
            placed,
            available=constant,
            elem_type=lambda name: elem_type(original.get(name, name)),
            rank=lambda name: rank(original.get(name, name)),
            small=lambda name: not worth(original.get(name, name)),
            taken=taken,
            opset=opset_version(model) or 0,
            values_only=_elementwise,
        )
    nodes = list(forward)
    for index, node in enumerate(backward):
        nodes.extend(placed.get(index, []))
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    _record(model, len(sources))
    return model


def recomputes(model: onnx.ModelProto) -> bool:
    """Whether ``model`` holds values recomputed by :func:`recompute_elementwise` or
    :func:`recompute_from_checkpoints`."""
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
    return node.op_type in ELEMENTWISE and is_standard(node) and len(node.output) == 1 and not subgraphs(node)


def _deterministic(node: onnx.NodeProto) -> bool:
    """A node of ai.onnx that gives the same outputs for the same inputs, holds no subgraph, and is no
    ``Constant`` (whose copy would copy its data)."""
    return is_standard(node) and node.op_type not in NOT_RECOMPUTED and not subgraphs(node)


def _per_batch(dims: Sequence[int | None] | None) -> bool:
    """Whether a value of ``dims`` is worth recomputing for a checkpoint: a dimension is unknown (it grows with
    the batch, as a rule), or the known ones hold at least :data:`MIN_KNOWN_ELEMENTS` elements."""
    return dims is None or not all(isinstance(d, int) for d in dims) or _known_elements(dims) >= MIN_KNOWN_ELEMENTS


def _known_elements(dims: Sequence[int | None] | None) -> int:
    """The product of the known dimensions (0 for an unknown shape)."""
    if dims is None:
        return 0
    return math.prod(d for d in dims if isinstance(d, int))


def _first_uses(
    backward: list[onnx.NodeProto],
    forward: list[onnx.NodeProto],
    sources: list[int],
    recomputed: set[str],
    made_by: Mapping[str, int],
) -> dict[int, int]:
    """For each copied forward node (its index), the index of the first backward node that reads one of its
    recomputed values, or a copy made from them."""
    first = dict.fromkeys(sources, len(backward))
    for index, node in enumerate(backward):
        for name in names_read(node):
            if name in recomputed and first[made_by[name]] > index:
                first[made_by[name]] = index
    for source in reversed(sources):  # a copy's inputs are needed no later than the copy itself
        for name in forward[source].input:
            if name in recomputed:
                first[made_by[name]] = min(first[made_by[name]], first[source])
    return first


__all__ = [
    "ELEMENTWISE",
    "MIN_KNOWN_ELEMENTS",
    "NOT_RECOMPUTED",
    "RECOMPUTED_KEY",
    "recompute_elementwise",
    "recompute_from_checkpoints",
    "recomputes",
    "transformers_to_disable",
]
