"""Fold the shape computations of a graph whose input shapes are fixed into constants.

A training graph built for any batch size computes sizes at run time: the
mean's divisor is ``Cast(Size(x))``, its gradient ``Expand``s to ``Shape(x)``.
Where the shapes are fixed (the epoch model's batches,
:mod:`onnxtrain.artifacts.epoch`), each of those nodes runs once per step for
a value known in advance; onnxruntime folds ``Shape`` but not ``Size`` or what
follows. :func:`fold_static_shapes` infers the shapes (``onnx.shape_inference``),
turns ``Shape`` and ``Size`` of a fully known shape into initializers, then
evaluates every node of :data:`FOLDABLE` whose inputs are all initializers and
whose output is small, with NumPy: the same IEEE arithmetic (one operation,
correctly rounded) onnxruntime computes at run time. (Not with
``onnx.reference``, whose import alone takes 11 MiB.)

:func:`fold_constants` folds the same operators for shape inference, on any
graph: onnx's shape inference reads the values of ``Constant`` nodes and
initializers, but not of what is computed from them (data propagation only
follows integer shape vectors), so a ``Resize`` whose scales are
``Concat(Constant, Constant)`` (torch's TorchScript exporter in training
mode) would have an unknown output shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

_ARITHMETIC = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}
_UNARY = {"Neg": np.negative, "Sqrt": np.sqrt, "Reciprocal": np.reciprocal, "Identity": np.array}
#: Operators folded where all their inputs are constants: cheap, exact, deterministic.
FOLDABLE = frozenset({*_ARITHMETIC, *_UNARY, "Cast", "Concat", "Expand", "Gather", "Reshape", "Squeeze", "Unsqueeze"})
#: The most elements a folded value may have (it becomes an initializer of every session of the model).
MAX_ELEMENTS = 1 << 16


#: ``shapes_of(model, names)``: the dimensions of the values ``names`` of ``model`` (``None`` where unknown).
ShapeInference = Callable[[onnx.ModelProto, Sequence[str]], Mapping[str, Sequence[int] | None]]


def onnx_shapes(model: onnx.ModelProto, names: Sequence[str]) -> dict[str, list[int] | None]:
    """:data:`ShapeInference` by ``onnx.shape_inference`` (its first use loads ONNX's operator schemas: 7.5 MiB;
    the runtime infers with onnxruntime instead, ``onnxtrain.sessions.inferred_shapes``)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # onnx's inference errors for operators it does not know: nothing known
        return dict.fromkeys(names)
    values = {v.name: v for v in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output)}
    return {name: _static_dims(values[name].type.tensor_type) if name in values else None for name in names}


def fold_static_shapes(
    model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], shapes_of: ShapeInference = onnx_shapes
) -> onnx.ModelProto:
    """A copy of ``model`` with inputs ``shapes`` fixed and the computations that then become constant folded.

    ``shapes_of`` infers the shapes that ``Shape`` and ``Size`` read. Nodes
    inside subgraphs, and nodes of other domains, are left as they are.
    """
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    for value in graph.input:
        if value.name in shapes:
            _set_shape(value, shapes[value.name])
    measured = [n.input[0] for n in graph.node if n.op_type in ("Shape", "Size") and n.domain in ("", "ai.onnx")]
    known = dict(shapes_of(copy, list(dict.fromkeys(measured)))) if measured else {}
    known.update((name, []) for name in _full_reductions(graph))
    constants: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    opset = next((entry.version for entry in copy.opset_import if entry.domain in ("", "ai.onnx")), None)
    outputs = {value.name for value in graph.output}
    kept = []
    for node in graph.node:
        value = None if outputs.intersection(node.output) else _folded(node, known, constants, opset)
        if value is None:
            kept.append(node)
            continue
        constants[node.output[0]] = value
        graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
    del graph.node[:]
    graph.node.extend(kept)
    drop_unread_initializers(graph)
    return copy


def fold_constants(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` in which each node of :data:`FOLDABLE` whose inputs are all constants is a ``Constant``.

    Constants are ``Constant`` nodes, initializers and the nodes folded before:
    only tensors stored in the model (not in external data) of at most
    :data:`MAX_ELEMENTS` elements are read, so the weights of a large model
    are never loaded. A folded node becomes ``Constant(value=...)`` with the
    same output name, in its place, when its value has at most
    :data:`MAX_ELEMENTS` elements; everything else is left as it is
    (subgraphs and nodes of other domains included). For shape inference:
    the graph computes what it computed, in the same order and IR version.
    """
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    opset = next((entry.version for entry in copy.opset_import if entry.domain in ("", "ai.onnx")), None)
    constants = _SmallConstants(graph.initializer)
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            constants.add_constant_node(node)
            continue
        value = _folded(node, {}, constants, opset) if node.op_type in FOLDABLE else None
        if value is None:
            continue
        try:
            tensor = numpy_helper.from_array(value, node.output[0])
        except (ValueError, TypeError, KeyError):  # an element type numpy_helper cannot write back
            continue
        constants.add_value(node.output[0], value)
        node.CopyFrom(helper.make_node("Constant", [], [node.output[0]], name=node.name, value=tensor))
    return copy


class _SmallConstants(Mapping[str, np.ndarray]):
    """The values of a graph's small constants (:func:`_small`), each converted to NumPy when first read."""

    def __init__(self, initializers: Iterable[onnx.TensorProto]) -> None:
        self._tensors = {tensor.name: tensor for tensor in initializers}
        self._values: dict[str, np.ndarray] = {}

    def add_constant_node(self, node: onnx.NodeProto) -> None:
        """Take in a ``Constant`` node's value (a sparse or string value is not a constant here)."""
        if len(node.output) != 1 or len(node.attribute) != 1:
            return
        attribute = node.attribute[0]
        if attribute.name == "value":
            self._tensors[node.output[0]] = attribute.t
        elif attribute.name in ("value_float", "value_floats", "value_int", "value_ints"):
            dtype = np.float32 if attribute.name.startswith("value_float") else np.int64
            self._values[node.output[0]] = np.array(helper.get_attribute_value(attribute), dtype)

    def add_value(self, name: str, value: np.ndarray) -> None:
        self._values[name] = value

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self:
            raise KeyError(name)
        if name not in self._values:
            self._values[name] = numpy_helper.to_array(self._tensors[name])
        return self._values[name]

    def __contains__(self, name: object) -> bool:
        if name in self._values:
            return True
        tensor = self._tensors.get(name) if isinstance(name, str) else None
        return tensor is not None and _small(tensor)

    def __iter__(self) -> Iterator[str]:
        return iter([name for name in {**self._tensors, **self._values} if name in self])

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _small(tensor: onnx.TensorProto) -> bool:
    """Whether ``tensor`` holds its values in the model and has at most :data:`MAX_ELEMENTS` elements."""
    return tensor.data_location != onnx.TensorProto.EXTERNAL and math.prod(tensor.dims) <= MAX_ELEMENTS


def _folded(
    node: onnx.NodeProto,
    known: Mapping[str, Sequence[int] | None],
    constants: Mapping[str, np.ndarray],
    opset: int | None,
) -> np.ndarray | None:
    """The constant value of ``node``'s one output, or ``None`` where it is not known before running."""
    if node.domain not in ("", "ai.onnx") or len(node.output) != 1 or opset is None:
        return None
    if node.op_type in ("Shape", "Size"):
        dims = known.get(node.input[0])
        if dims is None or any(d is None or d < 0 for d in dims):
            return None
        if node.op_type == "Size":
            return np.array(math.prod(dims), np.int64)
        attrs = {a.name: a.i for a in node.attribute}
        start, end = attrs.get("start", 0), attrs.get("end", len(dims))
        return np.array(list(dims), np.int64)[slice(start, end)]
    if node.op_type not in FOLDABLE or any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute
    ):
        return None
    inputs = [name for name in node.input if name]
    if not all(name in constants for name in inputs):
        return None
    try:
        value = evaluate_constant(node, [constants[name] for name in inputs], opset)
    except (ValueError, LookupError, TypeError):  # a node onnxruntime would refuse (NumPy's errors, an attribute
        return None  # missing): left to run time
    return None if value is None or value.size > MAX_ELEMENTS else value


def evaluate_constant(node: onnx.NodeProto, inputs: list[np.ndarray], opset: int) -> np.ndarray | None:
    """``node``'s output for constant ``inputs``, as ONNX defines it; ``None`` for a case left to run time."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    op = node.op_type
    if op in _ARITHMETIC:
        a, b = inputs
        if a.dtype != b.dtype or (op == "Div" and a.dtype.kind != "f"):
            return None  # integer division truncates in ONNX and floors in NumPy: left to run time
        return np.asarray(_ARITHMETIC[op](a, b), dtype=a.dtype)
    if op in _UNARY:
        if op != "Identity" and inputs[0].dtype.kind != "f":
            return None
        return np.asarray(_UNARY[op](inputs[0]), dtype=inputs[0].dtype)
    if op == "Cast":
        target = helper.tensor_dtype_to_np_dtype(attrs["to"])
        if inputs[0].dtype.kind == "f" and target.kind in "iub":
            return None  # float to integer: left to onnxruntime's rounding
        return inputs[0].astype(target)
    if op == "Concat":
        if len({value.dtype for value in inputs}) != 1:
            return None  # NumPy would promote what ONNX refuses
        return np.concatenate(inputs, axis=attrs["axis"])
    if op == "Expand":
        shape = np.broadcast_shapes(inputs[0].shape, tuple(int(d) for d in inputs[1]))
        if math.prod(shape) > MAX_ELEMENTS:
            return None  # never materialized: it would stay computed anyway
        return np.array(np.broadcast_to(inputs[0], shape))
    if op == "Gather":
        return np.take(inputs[0], inputs[1], axis=attrs.get("axis", 0))
    if op == "Reshape":
        shape = [int(d) for d in inputs[1]]
        if not attrs.get("allowzero", 0):
            shape = [inputs[0].shape[i] if d == 0 else d for i, d in enumerate(shape)]
        return inputs[0].reshape(shape)
    axes = attrs.get("axes") if opset < 13 else (inputs[1].tolist() if len(inputs) > 1 else None)
    if op == "Unsqueeze":
        return np.expand_dims(inputs[0], tuple(axes)) if axes is not None else None
    if op == "Squeeze":
        return np.squeeze(inputs[0], axis=None if axes is None else tuple(axes))
    return None


def _full_reductions(graph: onnx.GraphProto) -> list[str]:
    """The outputs of reductions over every axis without ``keepdims``: scalars, whatever their input's shape
    (the mean's gradient divides by ``Size`` of the mean)."""
    scalars = []
    for node in graph.node:
        if not node.op_type.startswith("Reduce") or node.domain not in ("", "ai.onnx"):
            continue
        attrs = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
        every_axis = "axes" not in {a.name for a in node.attribute} and len(node.input) < 2
        if attrs.get("keepdims") == 0 and every_axis and not attrs.get("noop_with_empty_axes", 0):
            scalars.append(node.output[0])
    return scalars


def _static_dims(tensor: onnx.TypeProto.Tensor | None) -> list[int] | None:
    if tensor is None or not tensor.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
    return None if any(d < 0 for d in dims) else dims


def _set_shape(value: onnx.ValueInfoProto, shape: Sequence[int]) -> None:
    dims = value.type.tensor_type.shape.dim
    del dims[:]
    for size in shape:
        dims.add().dim_value = int(size)


def drop_unread_initializers(graph: onnx.GraphProto) -> None:
    """Remove initializers no node, subgraph or output reads (the inputs of folded nodes)."""
    from onnxtrain.autodiff.training import names_read  # autodiff imports the graph layer

    read = {name for node in graph.node for name in names_read(node)} | {value.name for value in graph.output}
    kept = [tensor for tensor in graph.initializer if tensor.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)


__all__ = [
    "FOLDABLE",
    "MAX_ELEMENTS",
    "ShapeInference",
    "drop_unread_initializers",
    "evaluate_constant",
    "fold_constants",
    "fold_static_shapes",
    "onnx_shapes",
]
