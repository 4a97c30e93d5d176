"""Constant values of nodes whose inputs are constants, as ONNX defines them: what the folding passes fold.

:func:`folded_value` gives the value of a node of :data:`FOLDABLE` whose
inputs are all known constants (and of ``Shape`` and ``Size`` of a known
shape), evaluated with NumPy: the same IEEE arithmetic (one operation,
correctly rounded) onnxruntime computes at run time. (Not with
``onnx.reference``, whose import alone takes 11 MiB.) The passes that use it
are :mod:`onnxtrain.graph.passes.static_shapes` and
:mod:`onnxtrain.graph.passes.constants`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxtrain.graph.attributes import attribute, attributes
from onnxtrain.graph.versions import is_standard
from onnxtrain.graph.walk import subgraphs

_ARITHMETIC = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}
_UNARY = {"Neg": np.negative, "Sqrt": np.sqrt, "Reciprocal": np.reciprocal, "Identity": np.array}
#: Operators folded where all their inputs are constants: cheap, exact, deterministic.
FOLDABLE = frozenset(
    {*_ARITHMETIC, *_UNARY, "Cast", "Concat", "Expand", "Gather", "Reshape", "Squeeze", "Unsqueeze"}
    | {"ConstantOfShape", "Slice", "Transpose"}  # torch's F.pad exports its pads so, from the sizes it reads
)
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


def folded_value(
    node: onnx.NodeProto,
    known: Mapping[str, Sequence[int] | None],
    constants: Mapping[str, np.ndarray],
    opset: int | None,
) -> np.ndarray | None:
    """The constant value of ``node``'s one output, or ``None`` where it is not known before running."""
    if not is_standard(node) or len(node.output) != 1 or opset is None:
        return None
    if node.op_type in ("Shape", "Size"):
        dims = known.get(node.input[0])
        if dims is None or any(d is None or d < 0 for d in dims):
            return None
        if node.op_type == "Size":
            return np.array(math.prod(dims), np.int64)
        start, end = attribute(node, "start", 0), attribute(node, "end", len(dims))
        return np.array(list(dims), np.int64)[slice(start, end)]
    if node.op_type not in FOLDABLE or subgraphs(node):
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
    attrs = attributes(node)
    op = node.op_type
    if op in _ARITHMETIC:
        a, b = inputs
        if a.dtype != b.dtype:
            return None
        if op == "Div" and a.dtype.kind != "f":  # ONNX truncates, NumPy floors: the same where neither is negative
            return np.floor_divide(a, b).astype(a.dtype) if (a >= 0).all() and (b > 0).all() else None
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
    if op == "ConstantOfShape":
        fill = numpy_helper.to_array(attrs["value"]) if "value" in attrs else np.zeros(1, np.float32)
        shape = tuple(int(d) for d in inputs[0])
        return np.full(shape, fill.reshape(-1)[0], fill.dtype) if math.prod(shape) <= MAX_ELEMENTS else None
    if op == "Transpose":
        return np.transpose(inputs[0], attrs.get("perm"))
    if op == "Slice":
        return _sliced(inputs, opset)
    axes = attrs.get("axes") if opset < 13 else (inputs[1].tolist() if len(inputs) > 1 else None)
    if op == "Unsqueeze":
        return np.expand_dims(inputs[0], tuple(axes)) if axes is not None else None
    if op == "Squeeze":
        return np.squeeze(inputs[0], axis=None if axes is None else tuple(axes))
    return None


#: Ends of a ``Slice`` that onnxruntime reads as "to the end in the step's direction".
_UNBOUNDED_ENDS = frozenset({2**31 - 1, 2**63 - 1})


def _sliced(inputs: list[np.ndarray], opset: int) -> np.ndarray | None:
    """``Slice`` (opset 10 on: starts, ends, axes, steps as inputs) as ONNX defines it: each start and end made
    non-negative by adding the axis' size, then clamped to ``[0, size]`` (``[0, size - 1]`` and ``[-1, size - 1]``
    for a negative step), an end of the largest int32 or int64 meaning no end, as onnxruntime reads it (to
    ``-1`` with a negative step, where ONNX would clamp it to the last element); ``None`` for an empty input or
    result."""
    if opset < 10 or inputs[0].size == 0:
        return None
    data, starts, ends = inputs[0], inputs[1].tolist(), inputs[2].tolist()
    axes = inputs[3].tolist() if len(inputs) > 3 else list(range(len(starts)))
    steps = inputs[4].tolist() if len(inputs) > 4 else [1] * len(starts)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        size = data.shape[axis]
        if step == 0:
            return None
        start = start + size if start < 0 else start
        start = min(max(start, 0), size if step > 0 else size - 1)
        if end in _UNBOUNDED_ENDS:  # onnxruntime reads these as no end: past the last element in the step's way
            end = size if step > 0 else -1
        else:
            end = end + size if end < 0 else end
            end = min(max(end, 0), size) if step > 0 else min(max(end, -1), size - 1)
        data = np.take(data, np.arange(start, end, step, dtype=np.int64), axis=axis)
    return data if data.size else None  # an empty result's shape: onnxruntime's kernel and onnx's may differ


def _static_dims(tensor: onnx.TypeProto.Tensor | None) -> list[int] | None:
    if tensor is None or not tensor.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
    return None if any(d < 0 for d in dims) else dims


__all__ = ["FOLDABLE", "MAX_ELEMENTS", "ShapeInference", "evaluate_constant", "folded_value", "onnx_shapes"]
