"""A ``Pad`` of zeros before convolutions becomes the convolutions' own pads.

transformers' MobileNetV2 (and models ported from TensorFlow with ``SAME``
padding) pads each convolution's input with a ``Pad`` node, the ``Conv``
itself unpadded. onnxruntime fuses the two when it runs a forward model, but
not in a training graph, where the gradients read the padded input too: it
copies every padded activation (35 ``Pad`` nodes, 12.6 ms of MobileNetV2's
step at 16 x 3 x 96 x 96, 2 cores) and keeps the copy for the backward.
Moved into ``Conv``'s ``pads`` attribute, the padding costs nothing in the
forward, the backward reads the unpadded input, and the convolution's
gradient rule sees its real geometry (a depthwise layer that keeps its size
takes the mirrored-kernel input gradient).
"""

from __future__ import annotations

import onnx
from onnx import helper, numpy_helper

from onnxtrain.graph.attributes import attribute, attributes
from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import constant_tensors, readers_of


def fuse_pads_into_convs(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each top-level ``Pad`` that only feeds the data input of ``Conv`` nodes folded into their
    ``pads``, in place.

    The ``Pad`` must add constant zeros (mode ``constant``, no value or a constant 0, no ``axes`` input) by
    constant, non-negative amounts on the spatial axes only, and each ``Conv`` reading it must take explicit pads
    (``auto_pad`` ``NOTSET``); its output must not be a graph output. Each ``Conv`` then reads the ``Pad``'s input
    with its pads increased by the ``Pad``'s, and the ``Pad`` is removed."""
    graph = model.graph
    constants = constant_tensors(graph)
    readers = readers_of(graph.node)
    outputs = {value.name for value in graph.output}
    removed = set()
    for position, node in enumerate(graph.node):
        added = _spatial_zero_pads(node, constants)
        if added is None or node.output[0] in outputs:
            continue
        convs = readers.get(node.output[0], [])
        if not convs or not all(_takes_pads(conv, node.output[0], len(added) // 2) for conv in convs):
            continue
        for conv in convs:
            _add_pads(conv, node.input[0], added)
        removed.add(position)
    if removed:
        kept = [node for position, node in enumerate(graph.node) if position not in removed]
        del graph.node[:]
        graph.node.extend(kept)
    return model


def _spatial_zero_pads(node: onnx.NodeProto, constants: dict[str, onnx.TensorProto]) -> list[int] | None:
    """The pads ``node`` adds on the spatial axes (begins, then ends), where it is a ``Pad`` of constant zeros by
    constant, non-negative amounts on the axes after the first two only; else ``None``."""
    if node.op_type != "Pad" or not is_standard(node) or len(node.input) < 2 or len(node.input) > 3:
        return None
    mode = attribute(node, "mode", b"constant")
    if mode not in (b"constant", "constant"):
        return None
    pads_tensor = constants.get(node.input[1])
    if pads_tensor is None:
        return None
    if len(node.input) == 3 and node.input[2]:
        value = constants.get(node.input[2])
        if value is None or numpy_helper.to_array(value).any():
            return None
    pads = [int(v) for v in numpy_helper.to_array(pads_tensor).reshape(-1)]
    rank = len(pads) // 2
    if rank < 3 or any(v < 0 for v in pads) or any(pads[axis] or pads[rank + axis] for axis in (0, 1)):
        return None
    return pads[2:rank] + pads[rank + 2 :]


def _takes_pads(node: onnx.NodeProto, value: str, spatial: int) -> bool:
    """Whether ``node`` is a ``Conv`` over ``spatial`` axes reading ``value`` as its data input only, with explicit
    pads."""
    if node.op_type != "Conv" or not is_standard(node) or node.input[0] != value or value in node.input[1:]:
        return False
    attrs = attributes(node)
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return False
    return len(attrs.get("pads", [0] * 2 * spatial)) == 2 * spatial


def _add_pads(node: onnx.NodeProto, source: str, added: list[int]) -> None:
    """``node`` (a ``Conv``) reading ``source`` with ``added`` more pads."""
    spatial = len(added) // 2
    current = list(attribute(node, "pads", [0] * 2 * spatial))
    kept = [a for a in node.attribute if a.name != "pads"]
    del node.attribute[:]
    node.attribute.extend(kept)
    node.attribute.append(helper.make_attribute("pads", [int(a + b) for a, b in zip(current, added, strict=True)]))
    node.input[0] = source


__all__ = ["fuse_pads_into_convs"]
