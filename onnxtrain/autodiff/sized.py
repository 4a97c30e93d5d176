"""Tensors as large as a dimension, for gradient rules: constants when small, made at run time when large.

Some gradients need a tensor whose size is a dimension's: ones to sum a batch
with (``ones[M] @ g[M, K]``), ``0 .. n - 1`` to compare labels or positions
with, an identity. Up to :data:`SMALL_CONSTANT_LIMIT` elements each is a
constant (no node to run). A larger one is computed from constants of O(1)
size, so that neither the training model nor the memory that building it takes
grows with a static batch, class count or image size:

- :func:`ones`: ``ConstantOfShape(shape, value=1)``;
- :func:`arange`: ``Range(0, n, 1)``, then ``Reshape``;
- :func:`eye`: ``EyeLike(ConstantOfShape([n, n], value=0))``.

Their inputs are constants, so onnxruntime computes each once when it loads
the model: they cost no time per step, and the memory is the runtime's, at run
time (never more than the gradient the tensor multiplies).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx

from onnxtrain.autodiff.context import RuleContext

#: The most elements a dimension-sized tensor of a gradient graph has as a constant (32 KiB in float64).
SMALL_CONSTANT_LIMIT = 4096


def is_small(*dims: int) -> bool:
    """Whether a tensor of shape ``dims`` is at most :data:`SMALL_CONSTANT_LIMIT` elements (a constant)."""
    return math.prod(int(d) for d in dims) <= SMALL_CONSTANT_LIMIT


def ones(ctx: RuleContext, shape: Sequence[int], like: str) -> str:
    """Ones of ``shape`` in ``like``'s element type: a constant, or ``ConstantOfShape(shape, value=1)``."""
    dims = [int(d) for d in shape]
    if is_small(*dims):
        return ctx.const(np.ones(dims), like)
    return ctx.op("ConstantOfShape", ctx.int64s(dims), value=_scalar(ctx, like, 1))


def arange(ctx: RuleContext, n: int, like: str, shape: Sequence[int] = (-1,)) -> str:
    """``0, 1, ..., n - 1`` in ``like``'s element type, reshaped to ``shape``: a constant, or ``Range``, reshaped."""
    if is_small(n):
        dtype = onnx.helper.tensor_dtype_to_np_dtype(ctx.elem_type(like))
        return ctx.const(np.arange(int(n), dtype=dtype).reshape(shape), like)
    values = ctx.op("Range", ctx.const(0, like), ctx.const(int(n), like), ctx.const(1, like))
    return values if list(shape) == [-1] else ctx.op("Reshape", values, ctx.int64s(shape))


def eye(ctx: RuleContext, n: int, like: str) -> str:
    """The ``n`` x ``n`` identity in ``like``'s element type: a constant, or ``EyeLike`` of zeros."""
    if is_small(n, n):
        return ctx.const(np.eye(int(n)), like)
    zeros = ctx.op("ConstantOfShape", ctx.int64s([int(n), int(n)]), value=_scalar(ctx, like, 0))
    return ctx.op("EyeLike", zeros)


def _scalar(ctx: RuleContext, like: str, value: int) -> onnx.TensorProto:
    """A ``ConstantOfShape`` ``value`` attribute: ``value`` in ``like``'s element type."""
    return onnx.helper.make_tensor("value", ctx.elem_type(like), [1], [value])
