"""The static-shape pass: a graph whose input shapes are fixed, its shape computations folded into constants.

A training graph built for any batch size computes sizes at run time: the
mean's divisor is ``Cast(Size(x))``, its gradient ``Expand``s to ``Shape(x)``.
Where the shapes are fixed (the epoch model's batches,
:mod:`onnxtrain.artifacts.epoch`; the fused step's session for fixed shapes),
each of those nodes runs once per step for a value known in advance;
onnxruntime folds ``Shape`` but not ``Size`` or what follows. This pass infers
the shapes, turns ``Shape`` and ``Size`` of a fully known shape into
initializers, then evaluates every node of
:data:`~onnxtrain.graph.fold.FOLDABLE` whose inputs are all initializers and
whose output is small (:func:`~onnxtrain.graph.fold.folded_value`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from onnxtrain.graph.fold import ShapeInference, folded_value, onnx_shapes
from onnxtrain.graph.passes.unused import drop_unread_initializers
from onnxtrain.graph.versions import is_standard, opset_version


def fold_static_shapes(
    model: onnx.ModelProto, *, shapes: Mapping[str, Sequence[int]], shapes_of: ShapeInference = onnx_shapes
) -> onnx.ModelProto:
    """``model`` with inputs ``shapes`` fixed and the computations that then become constant folded, in place.

    ``shapes_of`` infers the shapes that ``Shape`` and ``Size`` read. Nodes
    inside subgraphs, and nodes of other domains, are left as they are.
    """
    graph = model.graph
    for value in graph.input:
        if value.name in shapes:
            _set_shape(value, shapes[value.name])
    measured = [n.input[0] for n in graph.node if n.op_type in ("Shape", "Size") and is_standard(n)]
    known = dict(shapes_of(model, list(dict.fromkeys(measured)))) if measured else {}
    known.update((name, []) for name in _full_reductions(graph))
    constants: dict[str, np.ndarray] = {  # those held inline: a tensor in a file (or held apart) is no shape
        t.name: numpy_helper.to_array(t) for t in graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL
    }
    opset = opset_version(model)
    outputs = {value.name for value in graph.output}
    kept = []
    for node in graph.node:
        value = None if outputs.intersection(node.output) else folded_value(node, known, constants, opset)
        if value is None:
            kept.append(node)
            continue
        constants[node.output[0]] = value
        graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
    del graph.node[:]
    graph.node.extend(kept)
    return drop_unread_initializers(model)


def _full_reductions(graph: onnx.GraphProto) -> list[str]:
    """The outputs of reductions over every axis without ``keepdims``: scalars, whatever their input's shape
    (the mean's gradient divides by ``Size`` of the mean)."""
    scalars = []
    for node in graph.node:
        if not node.op_type.startswith("Reduce") or not is_standard(node):
            continue
        attrs = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
        every_axis = "axes" not in {a.name for a in node.attribute} and len(node.input) < 2
        if attrs.get("keepdims") == 0 and every_axis and not attrs.get("noop_with_empty_axes", 0):
            scalars.append(node.output[0])
    return scalars


def _set_shape(value: onnx.ValueInfoProto, shape: Sequence[int]) -> None:
    dims = value.type.tensor_type.shape.dim
    del dims[:]
    for size in shape:
        dims.add().dim_value = int(size)


__all__ = ["fold_static_shapes"]
