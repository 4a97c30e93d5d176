"""The duplicate pass (common-subexpression merging): a node that repeats an earlier one is dropped, its readers
rewired to the earlier one's outputs.

Two nodes repeat each other when they have the same operator, inputs and
attributes. Random operators (and ``Dropout``) are never merged: two
evaluations may differ.
"""

from __future__ import annotations

from typing import Any

import onnx

from onnxtrain.graph.operators import RANDOM_OPERATORS
from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import rename_references

#: Operators whose repeated evaluation may differ: never merged.
NEVER_MERGED = frozenset({*RANDOM_OPERATORS, "Dropout"})


def merge_duplicates(model: onnx.ModelProto, *, fixed: int = 0) -> onnx.ModelProto:
    """``model`` without the nodes that repeat an earlier one, in place; their readers and the graph outputs
    read the earlier node's outputs instead.

    ``fixed``: the graph's first nodes (the forward graph a gradient is
    drafted after), which later nodes may be merged into but which are
    neither merged nor rewired.
    """
    graph = model.graph
    aliases: dict[str, str] = {}
    seen: dict[tuple[Any, ...], onnx.NodeProto] = {}
    for node in graph.node[:fixed]:
        key = _pure_key(node)
        if key is not None and all(node.output):
            seen.setdefault(key, node)
    kept: list[onnx.NodeProto] = []
    for node in graph.node[fixed:]:
        rename_references(node, aliases)
        key = _pure_key(node)
        first = None if key is None else seen.get(key)
        if first is None:
            if key is not None:
                seen[key] = node
            kept.append(node)
        else:
            aliases.update((dup, orig) for dup, orig in zip(node.output, first.output, strict=True) if dup)
    del graph.node[fixed:]
    graph.node.extend(kept)
    for value in graph.output:
        value.name = aliases.get(value.name, value.name)
    return model


def _pure_key(node: onnx.NodeProto) -> tuple[Any, ...] | None:
    """What two repeats of a node share; ``None`` for a node never merged."""
    if not is_standard(node) or node.op_type in NEVER_MERGED:
        return None
    attributes = tuple(sorted((a.name, a.SerializeToString()) for a in node.attribute))
    return (node.op_type, tuple(node.input), len(node.output), attributes)


__all__ = ["NEVER_MERGED", "merge_duplicates"]
