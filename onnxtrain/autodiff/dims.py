"""Dimension arithmetic for gradient rules: sizes known while building, or only at run time.

A dimension, or a vector of dimensions, is a Python ``int`` (``list[int]``)
when the model's shapes give it, and the name of an int64 tensor computed from
``Shape`` when they do not. The helpers here take and return either: they fold
the known cases into Python numbers and constants while building, and emit
nodes only for the others, so that a rule is written once for both::

    out = dims_of(ctx, y, 2)                                   # [O...] or Slice(Shape(y))
    full = combine(ctx, "Mul", combine(ctx, "Sub", out, [1] * n), strides)

Tensors as large as a dimension (ones to sum a batch with, ``0 .. n - 1`` to
compare labels with, an identity) are constants up to
:data:`SMALL_CONSTANT_LIMIT` elements each (no node to run). A larger one is
computed from constants of O(1) size, so that neither the training model nor
the memory that building it takes grows with a static batch, class count or
image size: :func:`ones` is ``ConstantOfShape(shape, value=1)``, :func:`arange`
``Range(0, n, 1)``, :func:`eye` ``EyeLike`` of zeros. Their inputs are
constants, so onnxruntime computes each once when it loads the model.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx

from onnxtrain.autodiff.context import RuleContext

#: A 1-D int64 vector of dimensions: known while building (a list) or only at run time (a value name).
DimVector = list[int] | str
#: A scalar: a Python number (known while building) or the name of a 0-d tensor.
Scalar = str | float | int

#: The largest int64: an end that slices to the last element of any axis.
INT64_MAX = 2**63 - 1
#: The most elements a dimension-sized tensor of a gradient graph has as a constant (32 KiB in float64).
SMALL_CONSTANT_LIMIT = 4096

_FOLD_VECTOR: dict[str, Callable[[int, int], int]] = {
    "Add": operator.add,
    "Sub": operator.sub,
    "Mul": operator.mul,
    "Div": operator.floordiv,  # only ever applied to non-negative numbers
    "Max": max,
}
_FOLD_SCALAR: dict[str, Callable[[Any, Any], Any]] = {
    "Add": operator.add,
    "Sub": operator.sub,
    "Mul": operator.mul,
    "Div": operator.truediv,
}


# ------------------------------------------------------------ dimensions of a value


def dims_of(ctx: RuleContext, name: str, start: int, stop: int | None = None, rank: int | None = None) -> DimVector:
    """Dimensions ``start:stop`` of ``name``: a list when known, else sliced from ``Shape``.

    ``rank``: the rank ``name`` must have; inferred sizes of another rank are not trusted
    (for some ``output_shape`` values, onnx infers ConvTranspose's output with too few axes).
    """
    shape = ctx.shape(name)
    if rank is not None and shape is not None and len(shape) != rank:
        shape = None
    if shape is not None and all(isinstance(d, int) for d in shape[start:stop]):
        return [int(d) for d in shape[start:stop]]  # type: ignore[arg-type]
    end = INT64_MAX if stop is None else stop
    return ctx.op("Slice", ctx.op("Shape", name), ctx.int64s([start]), ctx.int64s([end]))


def dim_of(ctx: RuleContext, x: str, axis: int) -> Scalar:
    """Dimension ``axis`` (non-negative) of ``x``: an int when known, else an int64 scalar tensor."""
    shape = ctx.shape(x)
    if shape is not None and axis < len(shape) and isinstance(shape[axis], int):
        return int(shape[axis])
    return ctx.op("Squeeze", dims_of(ctx, x, axis, axis + 1), ctx.int64s([0]))


def dim_tensor(ctx: RuleContext, x: str, axis: int) -> str:
    """Dimension ``axis`` of ``x`` as an int64 scalar tensor (a constant when known)."""
    shape = ctx.shape(x)
    if shape is not None and isinstance(shape[axis], int):
        return int64_scalar(ctx, shape[axis])
    return ctx.op("Gather", ctx.op("Shape", x), int64_scalar(ctx, axis))


def element_count(ctx: RuleContext, x: str) -> str:
    """The number of elements of ``x`` as an int64 scalar (a constant when the shape is static)."""
    static = ctx.static_shape(x)
    if static is not None:
        return int64_scalar(ctx, int(np.prod(static, dtype=np.int64)))
    return ctx.op("Size", x)


def dims_product(ctx: RuleContext, x: str, start: int, stop: int) -> str:
    """The product of dimensions ``start:stop`` of ``x`` (1 for none) as an int64 scalar (a constant when known)."""
    part = dims_of(ctx, x, start, stop)
    if isinstance(part, list):
        return int64_scalar(ctx, int(np.prod(part, dtype=np.int64)))
    return ctx.op("ReduceProd", part, keepdims=0)


def spatial_axes(rank: int) -> list[int]:
    """The axes after batch and channels of an ``[N, C, *S]`` tensor of rank ``rank``."""
    return list(range(2, rank))


# ------------------------------------------------------------ vectors of dimensions


def all_known(*values: DimVector) -> bool:
    """Whether every vector is known while building."""
    return all(isinstance(v, list) for v in values)


def as_vector(ctx: RuleContext, v: DimVector) -> str:
    """``v`` as a 1-D int64 tensor (a constant when known)."""
    return ctx.int64s(v) if isinstance(v, list) else v


def combine(ctx: RuleContext, op: str, a: DimVector, b: DimVector) -> DimVector:
    """``op`` (Add, Sub, Mul, Div, Max) of two dimension vectors, element-wise; folded when both are known."""
    if isinstance(a, list) and isinstance(b, list):
        return [_FOLD_VECTOR[op](x, y) for x, y in zip(a, b, strict=True)]
    return ctx.op(op, as_vector(ctx, a), as_vector(ctx, b))


def concat_dims(ctx: RuleContext, *parts: DimVector) -> DimVector:
    """The concatenation of dimension vectors."""
    if all(isinstance(p, list) for p in parts):
        return [v for p in parts for v in p]  # type: ignore[union-attr]
    return ctx.op("Concat", *(as_vector(ctx, p) for p in parts), axis=0)


# ------------------------------------------------------------ scalars


def int64_scalar(ctx: RuleContext, value: int | str) -> str:
    """An int64 scalar: a constant of a number, or the value named ``value`` (of shape ``[]`` or ``[1]``, of
    any integer type) reshaped and cast."""
    if isinstance(value, str):
        return ctx.cast(ctx.op("Reshape", value, ctx.int64s([])), onnx.TensorProto.INT64)
    return ctx.const(np.asarray(value, dtype=np.int64), ctx.int64s([0]))


def combine_scalars(ctx: RuleContext, op: str, a: Scalar, b: Scalar) -> Scalar:
    """``a op b`` (Add, Sub, Mul, Div) for numbers or tensors, folded when both are numbers."""
    if not isinstance(a, str) and not isinstance(b, str):
        return _FOLD_SCALAR[op](a, b)
    return {"Add": ctx.add, "Sub": ctx.sub, "Mul": ctx.mul, "Div": ctx.div}[op](a, b)


def as_float(ctx: RuleContext, v: Scalar, like: str) -> Scalar:
    """``v`` in the element type of ``like`` (a Python float when known)."""
    return float(v) if not isinstance(v, str) else ctx.cast_like(v, like)


def as_tensor(ctx: RuleContext, v: Scalar, like: str) -> str:
    """``v`` as a tensor with the element type of ``like``."""
    return ctx.const(v, like) if not isinstance(v, str) else ctx.cast_like(v, like)


# ------------------------------------------------------------ dimension-sized tensors


def is_small(*dims: int) -> bool:
    """Whether a tensor of shape ``dims`` is at most :data:`SMALL_CONSTANT_LIMIT` elements (a constant)."""
    return math.prod(int(d) for d in dims) <= SMALL_CONSTANT_LIMIT


def ones(ctx: RuleContext, shape: Sequence[int], like: str) -> str:
    """Ones of ``shape`` in ``like``'s element type: a constant, or ``ConstantOfShape(shape, value=1)``."""
    dims = [int(d) for d in shape]
    if is_small(*dims):
        return ctx.const(np.ones(dims), like)
    return ctx.op("ConstantOfShape", ctx.int64s(dims), value=fill_value(ctx, like, 1))


def arange(ctx: RuleContext, n: Scalar, like: str, shape: Sequence[int] = (-1,)) -> str:
    """``0, 1, ..., n - 1`` in ``like``'s element type, reshaped to ``shape``.

    A known ``n`` gives a constant, or ``Range`` then ``Reshape`` when large; an int64 scalar ``n``
    gives ``Range(0, n, 1)`` in ``like``'s type.
    """
    if isinstance(n, str):
        values = ctx.op("Range", ctx.const(0, like), ctx.cast_like(n, like), ctx.const(1, like))
        return values if list(shape) == [-1] else ctx.op("Reshape", values, ctx.int64s(shape))
    if is_small(int(n)):
        dtype = onnx.helper.tensor_dtype_to_np_dtype(ctx.elem_type(like))
        return ctx.const(np.arange(int(n), dtype=dtype).reshape(shape), like)
    values = ctx.op("Range", ctx.const(0, like), ctx.const(int(n), like), ctx.const(1, like))
    return values if list(shape) == [-1] else ctx.op("Reshape", values, ctx.int64s(shape))


def int64_range(ctx: RuleContext, n: str) -> str:
    """``[0, 1, ..., n - 1]`` (int64) for an int64 scalar ``n``."""
    return ctx.op("Range", int64_scalar(ctx, 0), n, int64_scalar(ctx, 1))


def flat_positions(ctx: RuleContext, x: str) -> str:
    """The flat position of each element of ``x``, shaped like ``x`` (int64)."""
    return ctx.op("Reshape", int64_range(ctx, element_count(ctx, x)), ctx.shape_of(x))


def eye(ctx: RuleContext, n: int, like: str) -> str:
    """The ``n`` x ``n`` identity in ``like``'s element type: a constant, or ``EyeLike`` of zeros."""
    if is_small(n, n):
        return ctx.const(np.eye(int(n)), like)
    zeros = ctx.op("ConstantOfShape", ctx.int64s([int(n), int(n)]), value=fill_value(ctx, like, 0))
    return ctx.op("EyeLike", zeros)


def fill_value(ctx: RuleContext, like: str, value: int) -> onnx.TensorProto:
    """A ``ConstantOfShape`` ``value`` attribute: ``value`` in ``like``'s element type."""
    return onnx.helper.make_tensor("value", ctx.elem_type(like), [1], [value])
