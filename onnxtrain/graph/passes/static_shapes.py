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

:func:`fold_static_dims` folds, with no shape fixed, what the graph's static
dimensions alone decide: an export computes a head's size as
``Shape(q)[3] / 2`` even where ``q`` is ``[batch, 12, seq, 64]``. The
gradient builder then sees constants (a ``Slice`` up to ``32`` has a ``Pad``
for its gradient, not a scatter over every element of ``q``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from onnxtrain.graph.attributes import attribute, attributes
from onnxtrain.graph.fold import ShapeInference, folded_value, onnx_shapes
from onnxtrain.graph.passes.constants import SmallConstants
from onnxtrain.graph.passes.unused import drop_unread_initializers
from onnxtrain.graph.versions import is_standard, opset_version
from onnxtrain.graph.walk import names_read


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


def fold_static_dims(
    model: onnx.ModelProto, *, keep: Collection[str] = (), variables: Collection[str] = ()
) -> onnx.ModelProto:
    """``model`` with the shape computations its static dimensions decide folded into constants, in place.

    ``Shape`` of a value whose dimensions are all fixed, ``Gather`` of fixed
    dimensions from a ``Shape`` (at constant indices), and every node of
    :data:`~onnxtrain.graph.fold.FOLDABLE` over such constants: the same
    values at any size of the symbolic dimensions. The dimensions are those
    onnx's inference gives over the model's ``value_info``. The graph's
    outputs, the values of ``keep`` and the values nothing reads stay
    computed; the initializers ``variables`` (the parameters) are no
    constants; the model's own initializers all stay.
    """
    graph = model.graph
    dims = _partial_dims(model, [n.input[0] for n in graph.node if n.op_type in ("Shape", "Size") and is_standard(n)])
    full = {name: d for name, d in dims.items() if all(size is not None for size in d)}
    constants = SmallConstants([t for t in graph.initializer if t.name not in variables])
    shapes: dict[str, list[int | None]] = {}  # Shape outputs with some dimensions unknown
    opset = opset_version(model)
    read_before = {name for node in graph.node for name in names_read(node)}
    fixed = {value.name for value in graph.output} | set(keep)
    folded: set[str] = set()
    kept = []
    for node in graph.node:
        value = None
        if node.output and node.output[0] in read_before and not fixed.intersection(node.output) and is_standard(node):
            if node.op_type == "Constant":  # read by what may fold; kept (unread, the models' pruning drops it)
                constants.add_constant_node(node)
            elif node.op_type == "Shape" and node.input[0] in dims and node.input[0] not in full:
                span = slice(attribute(node, "start", 0), attribute(node, "end"))
                shapes[node.output[0]] = dims[node.input[0]][span]
            elif node.op_type == "Gather" and node.input[0] in shapes:
                value = _gathered_dims(node, shapes[node.input[0]], constants)
            else:
                value = folded_value(node, full, constants, opset)
        if value is None:
            kept.append(node)
            continue
        constants.add_value(node.output[0], value)
        graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
        folded.add(node.output[0])
    del graph.node[:]
    graph.node.extend(_without_orphans(kept, read_before, fixed))
    read = {name for node in graph.node for name in names_read(node)}
    initializers = [t for t in graph.initializer if t.name not in folded or t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    return model


def _without_orphans(
    nodes: Sequence[onnx.NodeProto], read_before: Collection[str], fixed: Collection[str]
) -> list[onnx.NodeProto]:
    """``nodes`` less those whose outputs something read before the fold and nothing reads now (a ``Shape`` or
    ``Constant`` only folded nodes read), and so on up; values of ``fixed`` stay."""
    kept = list(nodes)
    while True:
        read = {name for node in kept for name in names_read(node)}
        orphans = {
            id(node)
            for node in kept
            if all(o and o in read_before and o not in read and o not in fixed for o in node.output)
        }
        if not orphans:
            return kept
        kept = [node for node in kept if id(node) not in orphans]


def _partial_dims(model: onnx.ModelProto, names: Sequence[str]) -> dict[str, list[int | None]]:
    """The dimensions of ``names`` that onnx's inference knows over the model's ``value_info`` (``None`` for a
    symbolic or unknown one); names of unknown rank are left out."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # onnx's inference errors for operators it does not know: what the model declares
        inferred = model
    graph = inferred.graph
    wanted = set(names)
    found = {}
    for value in (*graph.input, *graph.value_info, *graph.output):
        tensor = value.type.tensor_type
        if value.name in wanted and tensor.HasField("shape"):
            found[value.name] = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
    return found


def _gathered_dims(
    node: onnx.NodeProto, dims: Sequence[int | None], constants: Mapping[str, np.ndarray]
) -> np.ndarray | None:
    """The value of ``Gather`` ``node`` of a shape with ``dims``, where its indices are constants that pick
    only fixed dimensions; else ``None``."""
    axis = attribute(node, "axis", 0)
    indices = constants.get(node.input[1])
    if axis != 0 or indices is None or indices.dtype.kind not in "iu":
        return None
    flat = [int(i) for i in indices.reshape(-1)]
    if any(not -len(dims) <= i < len(dims) for i in flat):
        return None
    picked = [dims[i] for i in flat]
    if any(size is None for size in picked):
        return None
    return np.array(picked, np.int64).reshape(indices.shape)


def _full_reductions(graph: onnx.GraphProto) -> list[str]:
    """The outputs of reductions over every axis without ``keepdims``: scalars, whatever their input's shape
    (the mean's gradient divides by ``Size`` of the mean)."""
    scalars = []
    for node in graph.node:
        if not node.op_type.startswith("Reduce") or not is_standard(node):
            continue
        attrs = attributes(node)
        every_axis = "axes" not in attrs and len(node.input) < 2
        if attrs.get("keepdims") == 0 and every_axis and not attrs.get("noop_with_empty_axes", 0):
            scalars.append(node.output[0])
    return scalars


def _set_shape(value: onnx.ValueInfoProto, shape: Sequence[int]) -> None:
    dims = value.type.tensor_type.shape.dim
    del dims[:]
    for size in shape:
        dims.add().dim_value = int(size)


__all__ = ["fold_static_dims", "fold_static_shapes"]
