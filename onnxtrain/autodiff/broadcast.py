"""Un-broadcasting: sum an output-shaped gradient back to the shape of an input.

When ``z = x + y`` broadcasts ``x`` of shape ``[3]`` against ``y`` of shape
``[B, 3]``, ``dL/dx`` is ``dL/dz`` summed over the broadcast axes. This is done
here once, for every broadcasting rule:

- **statically** when the shapes say which axes were broadcast: when only
  leading axes were added, a product with a vector of ones
  (:func:`sum_leading_by_product`) or ``ReduceSum(g, axes, keepdims=0)``, else
  ``ReduceSum(g, axes, keepdims=1)`` then ``Reshape`` (or ``Squeeze`` of the
  leading axes when the input's shape is symbolic);
- **dynamically** otherwise (e.g. a symbolic dimension that may be 1): pad
  ``Shape(x)`` with leading 1s to the rank of ``g``, reduce over the axes where
  that padded shape is 1 and ``Shape(g)`` is not (``Equal``/``Not``/``And``/
  ``NonZero``, ``ReduceSum`` of ``g`` with a new leading axis of size 1,
  always summed so that the axes are never empty, then ``Squeeze``d), then
  ``Reshape`` to ``Shape(x)``.

Contract: the gradient's shape is the broadcast of ``x``'s shape with others
(what a broadcasting rule naturally returns), never smaller than ``x``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import onnx

from onnxtrain.autodiff import dims
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.graph.builder import Dim


def same_shape(a: Sequence[Dim] | None, b: Sequence[Dim] | None) -> bool:
    """Whether two shapes are provably equal (same sizes or same symbolic names)."""
    if a is None or b is None or len(a) != len(b):
        return False
    return all(x is not None and x == y for x, y in zip(a, b, strict=True))


def broadcast_axes(grad: Sequence[Dim] | None, like: Sequence[Dim] | None) -> list[int] | None:
    """The axes of ``grad`` to sum over to get ``like``'s shape, or ``None`` if unknowable statically."""
    if grad is None or like is None or len(grad) < len(like):
        return None
    lead = len(grad) - len(like)
    axes = list(range(lead))
    for j, (x_dim, g_dim) in enumerate(zip(like, grad[lead:], strict=True)):
        if x_dim is not None and x_dim == g_dim:
            continue
        if x_dim == 1:
            axes.append(lead + j)  # harmless when g_dim turns out to be 1 as well
        elif isinstance(x_dim, int):
            if g_dim == 1:
                return None  # a gradient smaller than its input breaks the contract
        elif g_dim != 1:
            return None  # x_dim is symbolic or unknown: it may or may not be 1
    return axes


def merge_shapes(a: Sequence[Dim] | None, b: Sequence[Dim] | None) -> list[Dim] | None:
    """Two descriptions of one shape combined: per dimension, a size beats a name beats unknown."""
    if a is None or b is None or len(a) != len(b):
        return list(a) if a is not None else (list(b) if b is not None else None)

    def score(d: Dim) -> int:
        return 2 if isinstance(d, int) else 1 if d is not None else 0

    return [x if score(x) >= score(y) else y for x, y in zip(a, b, strict=True)]


def unbroadcast(
    ctx: RuleContext,
    grad: str,
    like: str,
    shaped_like: str | None = None,
    grad_dims: Sequence[Dim] | None = None,
) -> str:
    """``grad`` summed back to the shape of ``like`` (no nodes when the shapes match).

    ``shaped_like``: a value known to have ``grad``'s shape (the forward output,
    for a broadcasting rule), whose inferred shape may be better known;
    ``grad_dims``: dimensions the rule knows ``grad`` to have (a batched
    product's: the output's batch axes and the operand's matrix axes).
    """
    g_dims, x_dims = ctx.shape(grad), ctx.shape(like)
    if shaped_like is not None:
        g_dims = merge_shapes(ctx.shape(shaped_like), g_dims)
    if grad_dims is not None:
        g_dims = merge_shapes(list(grad_dims), g_dims)
    if same_shape(g_dims, x_dims):
        return grad
    axes = broadcast_axes(g_dims, x_dims)
    if axes is None:
        return dynamic_unbroadcast(ctx, grad, like, None if g_dims is None else len(g_dims))
    assert g_dims is not None and x_dims is not None
    lead = len(g_dims) - len(x_dims)
    if axes == list(range(lead)):  # only new leading axes: one product or one ReduceSum drops them
        by_product = sum_leading_by_product(ctx, grad, like, lead, g_dims)
        return by_product if by_product is not None else ctx.op("ReduceSum", grad, ctx.int64s(axes), keepdims=0)
    result = ctx.op("ReduceSum", grad, ctx.int64s(axes), keepdims=1)
    if lead:
        static = ctx.static_shape(like)
        if static is not None:
            result = ctx.op("Reshape", result, ctx.int64s(static))
        else:
            result = ctx.op("Squeeze", result, ctx.int64s(range(lead)))
    return result


#: The element types whose leading-axes sums are products with a vector of ones (see below).
_PRODUCT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)


def sum_leading_by_product(ctx: RuleContext, grad: str, like: str, lead: int, g_dims: Sequence[Dim]) -> str | None:
    """``grad`` summed over its ``lead`` leading axes as ``ones[M] @ grad[M, K]``, or ``None`` when that
    form does not apply.

    The sum of a bias's gradient over the batch is the common case. Runtimes reduce over a leading axis
    slowly (onnxruntime's CPU ``ReduceSum`` takes 15 µs for a ``[64, 512]`` gradient) but run a
    vector-matrix product at matrix speed (3 µs; ``[8, 64, 256]`` to ``[256]``: 56 against 6 µs).
    Emits ``MatMul(ones, grad)`` for one leading axis and ``like`` of rank 0 or 1, else
    ``MatMul(ones, Reshape(grad, [-1, K]))``, reshaped to ``like``'s shape unless it has rank 1; ``ones``
    is a constant up to :data:`~onnxtrain.autodiff.dims.SMALL_CONSTANT_LIMIT` elements, else a
    ``ConstantOfShape`` (:func:`~onnxtrain.autodiff.dims.ones`), so that no constant grows with the
    batch. Applies to float and double gradients whose shapes are all known sizes; with a symbolic
    batch the ones would cost two more nodes per graph, so the caller keeps ``ReduceSum``.
    """
    x_static, leading = ctx.static_shape(like), g_dims[:lead]
    if ctx.elem_type(grad) not in _PRODUCT_TYPES or x_static is None or not all(isinstance(d, int) for d in leading):
        return None
    ones = dims.ones(ctx, [math.prod(leading)], grad)  # type: ignore[arg-type]
    if lead == 1 and len(x_static) <= 1:
        return ctx.op("MatMul", ones, grad)  # [M] @ [M, K] -> [K], or [M] @ [M] -> []
    summed = ctx.op("MatMul", ones, ctx.op("Reshape", grad, ctx.int64s([-1, math.prod(x_static)])))
    return summed if len(x_static) == 1 else ctx.op("Reshape", summed, ctx.int64s(x_static))


def product_grad_dims(ctx: RuleContext, output: str, operand: str) -> list[Dim] | None:
    """The dimensions of a batched matrix product's gradient for ``operand`` before its broadcast batch axes are
    summed: ``output``'s batch axes (the broadcast of both operands'), then ``operand``'s two matrix axes; ``None``
    where a rank is unknown or under 2."""
    y_dims, x_dims = ctx.shape(output), ctx.shape(operand)
    if y_dims is None or x_dims is None or len(y_dims) < 2 or len(x_dims) < 2:
        return None
    return [*y_dims[:-2], *x_dims[-2:]]


def dynamic_unbroadcast(ctx: RuleContext, grad: str, like: str, g_rank: int | None = None) -> str:
    """The shape-agnostic form of :func:`unbroadcast`, decided at run time."""
    x_shape = ctx.op("Shape", like)
    g_shape = ctx.op("Shape", grad)
    g_rank = ctx.rank(grad) if g_rank is None else g_rank
    x_rank = ctx.rank(like)
    one = onnx.helper.make_tensor("value", onnx.TensorProto.INT64, [1], [1])
    if g_rank is not None and x_rank is not None:
        padded = ctx.op("Concat", ctx.int64s([1] * (g_rank - x_rank)), x_shape, axis=0) if g_rank > x_rank else x_shape
    else:
        lead = ctx.op("Sub", ctx.op("Size", g_shape), ctx.op("Size", x_shape))
        ones = ctx.op("ConstantOfShape", ctx.op("Unsqueeze", lead, ctx.int64s([0])), value=one)
        padded = ctx.op("Concat", ones, x_shape, axis=0)
    one_scalar = ctx.int64s([1])
    mask = ctx.op(
        "And",
        ctx.op("Equal", padded, one_scalar),
        ctx.op("Not", ctx.op("Equal", g_shape, one_scalar)),
    )
    # Summed over a new leading axis of size 1 as well, so that the axes are never empty: onnxruntime <= 1.23
    # sums an empty tensor over all its axes whatever noop_with_empty_axes says.
    mask = ctx.op("Concat", ctx.const([True], mask), mask, axis=0)
    axes = ctx.op("Reshape", ctx.op("NonZero", mask), ctx.int64s([-1]))
    summed = ctx.op("ReduceSum", ctx.op("Unsqueeze", grad, ctx.int64s([0])), axes, keepdims=1)
    return ctx.op("Reshape", ctx.op("Squeeze", summed, ctx.int64s([0])), x_shape)
