"""Nodes that output their input unchanged become ``Identity`` nodes, which onnxruntime removes.

- A ``Dropout`` whose ratio is a constant 0 (torch exports ``nn.Dropout(0.0)``
  and models configured without dropout so), or that is not in training mode:
  onnxruntime still copies its input and makes a mask of its size, which a
  training graph keeps for the backward (:func:`replace_identity_dropouts`).
- In an eval model, the ``Mul`` by the random mask that ends a torch
  ``nn.Dropout1d/2d/3d`` exported by the dynamo exporter, which writes the
  mask's operators rather than a ``Dropout`` node: its input, as torch's
  ``eval()`` computes (:func:`replace_dropout_masks`).
- A ``Pad`` by constant zeros (transformers' MobileNetV2 pads each
  convolution's input as TensorFlow does, by amounts computed from the sizes,
  which fold to 0 before every 1x1 convolution): onnxruntime copies its input
  (:func:`replace_zero_pads`).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxtrain.graph.operators import RANDOM_OPERATORS
from onnxtrain.graph.torch_metadata import NAME_SCOPES_KEY, dropout_call
from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import constant_tensors, names_read

#: ONNX's default ratio, where the node has no ratio input.
DEFAULT_RATIO = 0.5


def replace_identity_dropouts(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each top-level ``Dropout`` that drops nothing (ratio a constant 0, or a training mode that
    is a constant false or absent) and whose mask nothing reads made an ``Identity``, in place."""
    graph = model.graph
    constants = constant_tensors(graph)
    read = {name for node in graph.node for name in names_read(node)} | {value.name for value in graph.output}
    for position, node in enumerate(graph.node):
        if node.op_type != "Dropout" or not is_standard(node):
            continue
        if len(node.output) > 1 and node.output[1] and node.output[1] in read:
            continue
        ratio = _scalar(node, 1, constants, DEFAULT_RATIO)
        training = _scalar(node, 2, constants, 0.0)
        if ratio is None or training is None or (ratio != 0.0 and training != 0.0):
            continue
        _make_identity(graph, position)
    return model


def replace_dropout_masks(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the ``Mul`` that ends each call of a torch inverted-dropout module made of random operators
    (:func:`~onnxtrain.graph.torch_metadata.dropout_call`) an ``Identity`` of its other input, in place: the call
    in eval mode. A call is changed only where one value leaves it, made by a ``Mul`` of exactly one value drawn
    from its random operators."""
    graph = model.graph
    calls: dict[tuple[str, ...], list[int]] = {}
    for position, node in enumerate(graph.node):
        scopes = dropout_call(node)
        if scopes is not None:
            calls.setdefault(scopes, []).append(position)
    if not calls:
        return model
    readers: dict[str, set[int]] = {}
    for position, node in enumerate(graph.node):
        for name in names_read(node):
            readers.setdefault(name, set()).add(position)
    outputs = {value.name for value in graph.output}
    for found in calls.values():
        inside = _with_unscoped(graph, set(found), readers)
        positions = sorted(inside)
        drawn: set[str] = set()  # the values computed from the random operators, within the call
        for position in positions:  # in graph order, which is topological
            node = graph.node[position]
            if node.op_type in RANDOM_OPERATORS or any(name in drawn for name in node.input):
                drawn.update(name for name in node.output if name)
        leaving = [
            (position, name)
            for position in positions
            for name in graph.node[position].output
            if name and (name in outputs or readers.get(name, set()) - inside)
        ]
        if not drawn or len(leaving) != 1:
            continue
        position = leaving[0][0]
        node = graph.node[position]
        masks = [k for k, name in enumerate(node.input) if name in drawn]
        if node.op_type != "Mul" or len(node.input) != 2 or len(masks) != 1:
            continue
        kept = node.input[1 - masks[0]]
        graph.node[position].CopyFrom(helper.make_node("Identity", [kept], [node.output[0]], name=node.name))
    return model


def _with_unscoped(graph: onnx.GraphProto, inside: set[int], readers: dict[str, set[int]]) -> set[int]:
    """``inside`` (node positions of one module call) with the nodes that carry no scopes of their own (an
    optimizer's, such as the ``Cast`` torch's exporter inserts after a mask with ``optimize=True``), read only by
    nodes inside and reading only what nodes inside make: part of the call."""
    while True:
        made = {name for position in inside for name in graph.node[position].output}
        added = {
            position
            for position, node in enumerate(graph.node)
            if position not in inside
            and not any(prop.key == NAME_SCOPES_KEY for prop in node.metadata_props)
            and node.input
            and all(name in made for name in node.input if name)
            and all(readers.get(name, set()) <= inside for name in node.output if name)
        }
        if not added:
            return inside
        inside |= added


def replace_zero_pads(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each top-level ``Pad`` whose pads are a constant of zeros made an ``Identity``, in place (any
    mode: no element is added)."""
    graph = model.graph
    constants = constant_tensors(graph)
    for position, node in enumerate(graph.node):
        if node.op_type != "Pad" or not is_standard(node) or len(node.input) < 2:
            continue
        pads = constants.get(node.input[1])
        if pads is None or numpy_helper.to_array(pads).any():
            continue
        _make_identity(graph, position)
    return model


def _make_identity(graph: onnx.GraphProto, position: int) -> None:
    """Node ``position`` of ``graph`` replaced by an ``Identity`` of its first input to its first output, its name
    kept."""
    node = graph.node[position]
    graph.node[position].CopyFrom(helper.make_node("Identity", [node.input[0]], [node.output[0]], name=node.name))


def _scalar(node: onnx.NodeProto, position: int, constants: dict[str, onnx.TensorProto], absent: float) -> float | None:
    """Input ``position`` of ``node`` as a number: ``absent`` where it is not given, ``None`` where it is not a
    constant of one element (a value known only at run time)."""
    if len(node.input) <= position or not node.input[position]:
        return absent
    tensor = constants.get(node.input[position])
    if tensor is None or int(np.prod(tensor.dims)) != 1:
        return None
    return float(numpy_helper.to_array(tensor).reshape(()))


__all__ = [
    "DEFAULT_RATIO",
    "replace_dropout_masks",
    "replace_identity_dropouts",
    "replace_zero_pads",
]
