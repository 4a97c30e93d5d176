"""Where a forward pass narrows to one activation: the checkpoints of ``activation_checkpoints="auto"``.

A stack of layers carries one tensor from each layer to the next (a
transformer's residual stream, an MLP's hidden activation). Cut the forward
after any node, and count the batch values that cross the cut (made before,
read after), leaving out *global* ones that cross most cuts (an attention
mask, rotary tables): where one value crosses alone, the forward narrows to
it, and keeping it is enough to recompute everything after it up to the next
such value. Layers repeat, so their boundaries share a type and shape; the
narrowings of the most common type and shape are the candidates (less those
that copy another one: a ``Cast`` to the same type, a ``Reshape``). Of them,
Chen et al.'s greedy rule keeps one wherever the activations the backward
reads since the last one kept reach the square root of their total times a
boundary's size: a transformer keeps about one boundary per layer
(``[batch, sequence, hidden]`` each), a plain chain of n layers one in about
sqrt(n), and the backward holds one segment's activations at a time.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Mapping, Sequence

import onnx

from onnxtrain.graph import dtypes
from onnxtrain.graph.passes.shapes_early import SHAPE_READERS
from onnxtrain.graph.walk import names_read

#: Operators that give their first input's data again (a ``Cast`` may change the type): a narrowing made by one
#: from another narrowing is recomputed from it rather than kept too.
COPIES = frozenset({"Cast", "Flatten", "Identity", "Reshape", "Squeeze", "Unsqueeze"})

#: What an unknown dimension (a batch, a sequence) counts for when values are weighed against each other.
NOMINAL_DIM = 64

#: A value crossing more than this share of the forward's cuts is global: it is kept, and left out of the counts.
GLOBAL_SHARE = 0.5


def choose_checkpoints(
    model: onnx.ModelProto,
    *,
    backward_from: int,
    batch_inputs: Collection[str],
    types: Mapping[str, tuple[int, Sequence[int | str | None]] | None],
) -> list[str]:
    """The forward values of ``model`` to keep as activation checkpoints (see the module docstring).

    ``backward_from``: the index of the first backward node; ``batch_inputs``:
    the graph inputs that carry the batch (not the parameters); ``types``:
    ``(element type, dimensions)`` of each forward value (``None`` where
    unknown; a dimension is a number, a symbol, or ``None``). Returns the
    kept narrowings of the most common type and shape (the larger shape on
    a tie) and the global batch values, in forward order; ``ValueError``
    when the forward never narrows to one value.
    """
    forward = list(model.graph.node[:backward_from])
    batch = set(batch_inputs)
    made_at: dict[str, int] = {}
    last_read: dict[str, int] = {}
    for index, node in enumerate(forward):
        if node.op_type in SHAPE_READERS:  # reads a shape, not the data: a batch value is not carried through it
            continue
        read = names_read(node)
        last_read.update((name, index) for name in read if name in made_at)
        if not batch.isdisjoint(read):
            outputs = [name for name in node.output if name]
            batch.update(outputs)
            made_at.update(dict.fromkeys(outputs, index))
    spans = {value: (made_at[value], end) for value, end in last_read.items() if end > made_at[value]}
    cuts = max(len(forward) - 1, 1)
    global_values = {value for value, (start, end) in spans.items() if (end - start) / cuts > GLOBAL_SHARE}
    crossing = _crossing_counts(spans, global_values, len(forward))
    alone: dict[str, None] = {}
    for value, (start, end) in spans.items():
        if value not in global_values and min(crossing[start:end]) == 1 and _floating(types.get(value)):
            alone[value] = None  # the only value crossing the cut after its maker
    for value in list(alone):  # a copy of another narrowing (a Cast to the same type, a Reshape) is made again
        node = forward[made_at[value]]
        if node.op_type in COPIES and node.input and node.input[0] in alone:
            del alone[value]
    if not alone:
        raise ValueError(
            "activation_checkpoints='auto' found no point where the forward narrows to one activation (a layer "
            "boundary); name the values to keep instead: activation_checkpoints=[...]"
        )
    shape_of = {value: _signature(types.get(value)) for value in alone}
    counts = Counter(shape_of.values())
    chosen = max(counts, key=lambda signature: (counts[signature], _nominal_elements(signature)))
    boundaries = [value for value in alone if shape_of[value] == chosen]
    read_by_backward = {name for node in model.graph.node[backward_from:] for name in names_read(node)}
    stored = {value: _nominal_elements(_signature(types.get(value))) for value in made_at if value in read_by_backward}
    spaced = _spaced(forward, boundaries, stored, _nominal_elements(chosen))
    return sorted([*spaced, *global_values], key=made_at.__getitem__)


def _spaced(
    forward: Sequence[onnx.NodeProto], boundaries: Sequence[str], stored: Mapping[str, int], boundary_size: int
) -> list[str]:
    """The boundaries to keep, by Chen et al.'s greedy rule ("Training Deep Nets with Sublinear Memory Cost",
    2016): walking the forward, a boundary is kept once the values the backward reads since the last one kept
    add up to ``sqrt(total * boundary_size)`` (``stored``: their sizes). Kept boundaries then cost about as
    much as the segment recomputed at a time, and both grow as the square root of the total."""
    budget = math.sqrt(sum(stored.values()) * boundary_size)
    wanted, kept, running = set(boundaries), [], 0
    for node in forward:
        for value in node.output:
            running += stored.get(value, 0)
            if value in wanted and running >= budget:
                kept.append(value)
                running = 0
    return kept


def _crossing_counts(spans: Mapping[str, tuple[int, int]], global_values: Collection[str], nodes: int) -> list[int]:
    """For each cut ``k`` (after node ``k``), how many non-global values made at or before ``k`` are read after it."""
    change = [0] * (nodes + 1)
    for value, (start, end) in spans.items():
        if value not in global_values:
            change[start] += 1
            change[end] -= 1
    counts, running = [], 0
    for delta in change[:nodes]:
        running += delta
        counts.append(running)
    return counts


def _floating(value_type: tuple[int, Sequence[int | str | None]] | None) -> bool:
    return value_type is not None and dtypes.is_float(value_type[0])


def _signature(value_type: tuple[int, Sequence[int | str | None]] | None) -> tuple[object, ...]:
    """The element type and the known dimensions of a value (``None`` for a symbol: shape inference names the
    same batch dimension differently in each layer), by which layer boundaries are grouped."""
    if value_type is None:
        return ()
    return (value_type[0], *(dim if isinstance(dim, int) else None for dim in value_type[1]))


def _nominal_elements(signature: tuple[object, ...]) -> int:
    """A size to weigh values by: the product of the dimensions, :data:`NOMINAL_DIM` for each unknown one (an
    unknown type counts as one element)."""
    product = 1
    for dim in signature[1:]:
        product *= dim if isinstance(dim, int) else NOMINAL_DIM
    return product


__all__ = ["COPIES", "GLOBAL_SHARE", "NOMINAL_DIM", "choose_checkpoints"]
