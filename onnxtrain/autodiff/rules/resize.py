"""Resize: the transpose of its interpolation, one matrix per resized axis.

Notation: ``x`` is the input, ``y`` the output and ``g`` its gradient.

Resize in nearest and linear mode is separable: along each resized axis
``a``, ``y = W_a x`` for an (out x in) interpolation matrix ``W_a``. The rule
rebuilds each ``W_a`` from the coordinate transformation, in float32 and in
the order of operations onnxruntime uses (so that nearest-neighbour choices
agree), and returns ``dx = W_a^T g`` along every such axis in one ``Einsum``. In cubic mode each row of
``W_a`` holds Keys' four weights (``cubic_coeff_a``) at the taps around the source coordinate, clamped to
the edges or, with ``exclude_outside``, dropped and the rest renormalized. Antialiasing and
``keep_aspect_ratio_policy`` other than ``stretch`` are refused with an error.
"""

from __future__ import annotations

import onnx

from onnxtrain.autodiff import dims
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.registry import Grads, Result
from onnxtrain.autodiff.rules._builtin import registry
from onnxtrain.autodiff.rules.backward_helpers import cubic_weights, data_only


def _one_hot(ctx: RuleContext, indices: str, n: str, like: str) -> str:
    """``indices.shape + [n]``: 1 where the last index equals ``indices`` (in ``[0, n)``), else 0."""
    hit = ctx.op("Equal", ctx.op("Unsqueeze", indices, ctx.int64s([-1])), dims.int64_range(ctx, n))
    return ctx.cast_like(hit, like)


def _letters(n: int) -> list[str]:
    """The first ``n`` letters: Einsum subscripts, one per axis."""
    return list("abcdefghijklmnopqrstuvwxyz"[:n])


def _resize_axes(ctx: RuleContext, rank: int) -> list[tuple[int, int]]:
    """``(axis, k)`` for each axis Resize may change, ``k`` its position in scales/sizes/roi."""
    given = ctx.attr("axes")
    axes = [int(a) % rank for a in given] if given is not None else list(range(rank))
    x, y = ctx.inputs[0], ctx.outputs[0]
    x_dims, y_dims = ctx.shape(x), ctx.shape(y)
    sizes = ctx.constant_value(ctx.inputs[3]) if ctx.has_input(3) else None
    scales = ctx.constant_value(ctx.inputs[2]) if ctx.has_input(2) and not ctx.has_input(3) else None
    result = []
    for k, axis in enumerate(axes):
        if scales is not None and scales.size and float(scales.reshape(-1)[k]) == 1.0:
            continue
        if sizes is not None and x_dims is not None and int(sizes.reshape(-1)[k]) == x_dims[axis]:
            continue
        if x_dims is not None and y_dims is not None and x_dims[axis] == y_dims[axis] == 1:
            continue
        result.append((axis, k))
    return result


def _source_coordinate(ctx: RuleContext, out: str, n_in: str, n_out: str, scale: str, k: int, rank: int) -> str:
    """Where output coordinates ``out`` (float32) come from in the input, as onnxruntime computes it."""
    mode = ctx.attr("coordinate_transformation_mode", "half_pixel")
    half = ctx.add(out, 0.5)
    if mode == "asymmetric":
        return ctx.div(out, scale)
    if mode == "tf_half_pixel_for_nn":
        return ctx.div(half, scale)
    if mode == "pytorch_half_pixel":
        return ctx.where(ctx.compare("Greater", n_out, 1.0), ctx.sub(ctx.div(half, scale), 0.5), 0.0)
    if mode == "align_corners":
        stretched = ctx.div(ctx.mul(out, ctx.sub(n_in, 1.0)), ctx.sub(n_out, 1.0))
        return ctx.where(ctx.compare("Equal", n_out, 1.0), 0.0, stretched)
    if mode == "tf_crop_and_resize":
        roi = ctx.cast_like(ctx.inputs[1], out)
        n_axes = len(ctx.attr("axes")) if ctx.attr("axes") is not None else rank
        start = ctx.op("Gather", roi, dims.int64_scalar(ctx, k))
        end = ctx.op("Gather", roi, dims.int64_scalar(ctx, n_axes + k))
        last = ctx.sub(n_in, 1.0)
        inside = ctx.add(
            ctx.mul(start, last), ctx.div(ctx.mul(ctx.mul(out, ctx.sub(end, start)), last), ctx.sub(n_out, 1.0))
        )
        middle = ctx.mul(ctx.mul(ctx.add(start, end), 0.5), last)
        return ctx.where(ctx.compare("Greater", n_out, 1.0), inside, middle)
    if mode == "half_pixel_symmetric":  # float32 offset, the rest in float64 (as onnxruntime does)
        adjustment = ctx.div(n_out, ctx.mul(scale, n_in))
        offset = ctx.mul(ctx.div(n_in, 2.0), ctx.sub(1.0, adjustment))
        f64 = onnx.TensorProto.DOUBLE
        shifted = ctx.div(ctx.add(ctx.cast(out, f64), 0.5), ctx.cast(scale, f64))
        return ctx.cast(ctx.sub(ctx.add(ctx.cast(offset, f64), shifted), 0.5), onnx.TensorProto.FLOAT)
    if mode != "half_pixel":
        raise ValueError(f"Resize node {ctx.node.name!r}: unknown coordinate_transformation_mode {mode!r}")
    return ctx.sub(ctx.div(half, scale), 0.5)


def _interpolation_matrix(ctx: RuleContext, axis: int, k: int, rank: int, same: str | None) -> str:
    """``W`` (out x in, x's element type) with ``y = W x`` along ``axis``, computed in float32.

    ``same``: a bool scalar, whether x and y have the same shape (onnxruntime then copies x).
    """
    x, y = ctx.inputs[0], ctx.outputs[0]
    n_in_int, n_out_int = dims.dim_tensor(ctx, x, axis), dims.dim_tensor(ctx, y, axis)
    f32 = onnx.TensorProto.FLOAT
    n_in, n_out = ctx.cast(n_in_int, f32), ctx.cast(n_out_int, f32)
    given = None if ctx.has_input(3) else ctx.cast(ctx.op("Gather", ctx.inputs[2], dims.int64_scalar(ctx, k)), f32)
    scale = given if given is not None else ctx.div(n_out, n_in)  # with sizes, the scale is out / in
    out = ctx.cast(dims.int64_range(ctx, n_out_int), f32)
    source = _source_coordinate(ctx, out, n_in, n_out, scale, k, rank)
    # onnxruntime copies an axis whose scale is 1, and the whole tensor when the shape does not change,
    # whatever the coordinate mode (the ONNX reference would shift or crop in some modes)
    copied = ctx.compare("Equal", scale, 1.0)
    if same is not None:
        copied = ctx.op("Or", copied, same)
    source = ctx.where(copied, out, source)
    last = ctx.sub(n_in, 1.0)
    if ctx.attr("mode", "nearest") == "nearest":
        rounding = ctx.attr("nearest_mode", "round_prefer_floor")
        if rounding == "round_prefer_floor":
            nearest = ctx.op("Ceil", ctx.sub(source, 0.5))
        elif rounding == "round_prefer_ceil":
            nearest = ctx.op("Floor", ctx.add(source, 0.5))
        elif rounding in ("floor", "ceil"):
            nearest = ctx.op(rounding.capitalize(), source)
        else:
            raise ValueError(f"Resize node {ctx.node.name!r}: unknown nearest_mode {rounding!r}")
        clamped = ctx.op("Min", ctx.op("Max", nearest, ctx.const(0.0, nearest)), last)
        weights = _one_hot(ctx, ctx.cast(clamped, onnx.TensorProto.INT64), n_in_int, out)
    elif ctx.attr("mode") == "linear":
        clamped = ctx.op("Min", ctx.op("Max", source, ctx.const(0.0, source)), last)
        low = ctx.op("Floor", clamped)
        high = ctx.op("Min", ctx.add(low, 1.0), last)
        frac = ctx.op("Unsqueeze", ctx.sub(clamped, low), ctx.int64s([1]))
        int64 = onnx.TensorProto.INT64
        hot_low = _one_hot(ctx, ctx.cast(low, int64), n_in_int, out)
        hot_high = _one_hot(ctx, ctx.cast(high, int64), n_in_int, out)
        weights = ctx.add(ctx.mul(hot_low, ctx.sub(1.0, frac)), ctx.mul(hot_high, frac))
    else:
        weights = _cubic_weights(ctx, source, n_in_int, last)
    if ctx.attr("coordinate_transformation_mode") == "tf_crop_and_resize":  # outside the roi: extrapolated
        inside = ctx.op("And", ctx.compare("GreaterOrEqual", source, 0.0), ctx.compare("LessOrEqual", source, last))
        weights = ctx.mul(weights, ctx.op("Unsqueeze", ctx.cast_like(inside, weights), ctx.int64s([1])))
    return ctx.cast_like(weights, x)


def _cubic_weights(ctx: RuleContext, source: str, n_in: str, last: str) -> str:
    """The (out x in) cubic interpolation weights at the source coordinates ``source`` (float32).

    :func:`cubic_weights` (``a = cubic_coeff_a``) at the taps ``floor(s) - 1 + i``; taps outside the input
    read its edge, or with ``exclude_outside`` weigh 0, the others renormalized to sum to 1 (as onnxruntime).
    """
    base = ctx.op("Floor", source)
    t = ctx.op("Unsqueeze", ctx.sub(source, base), ctx.int64s([1]))  # [out, 1]
    coefficients = cubic_weights(ctx, t, float(ctx.attr("cubic_coeff_a", -0.75)))
    weights: str | None = None
    total: str | None = None
    for i, coefficient in enumerate(coefficients):
        tap = ctx.op("Unsqueeze", ctx.add(base, float(i - 1)), ctx.int64s([1]))
        if ctx.attr("exclude_outside", 0):
            inside = ctx.op("And", ctx.compare("GreaterOrEqual", tap, 0.0), ctx.compare("LessOrEqual", tap, last))
            coefficient = ctx.mul(coefficient, ctx.cast_like(inside, coefficient))
            total = coefficient if total is None else ctx.add(total, coefficient)
        clamped = ctx.op("Min", ctx.op("Max", tap, ctx.const(0.0, tap)), last)
        hot = _one_hot(ctx, ctx.op("Squeeze", ctx.cast(clamped, onnx.TensorProto.INT64), ctx.int64s([1])), n_in, t)
        term = ctx.mul(hot, coefficient)
        weights = term if weights is None else ctx.add(weights, term)
    assert weights is not None
    return weights if total is None else ctx.div(weights, total)


@registry.rule("Resize", inputs=(0,))
def resize(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g contracted with W_a^T on each resized axis a, where y = x contracted with W_a (nearest/linear/cubic)"""
    (g,) = grads
    mode = ctx.attr("mode", "nearest")
    if (
        mode not in ("nearest", "linear", "cubic")
        or ctx.attr("antialias", 0)
        or (ctx.attr("keep_aspect_ratio_policy", "stretch") != "stretch")
    ):
        raise ValueError(
            f"Resize node {ctx.node.name!r}: onnxtrain differentiates mode 'nearest', 'linear' and 'cubic' without "
            f"antialias and with keep_aspect_ratio_policy='stretch', not mode={mode!r}, "
            f"antialias={ctx.attr('antialias', 0)}, keep_aspect_ratio_policy="
            f"{ctx.attr('keep_aspect_ratio_policy', 'stretch')!r}; use one of those, or keep its input out of wrt"
        )
    x, y = ctx.inputs[0], ctx.outputs[0]
    rank = ctx.known_rank(x)
    axes = _resize_axes(ctx, rank)
    x_static, y_static = ctx.static_shape(x), ctx.static_shape(y)
    if not axes or (x_static is not None and x_static == y_static):
        return data_only(ctx, g)
    same = None
    if x_static is None or y_static is None:
        equal = ctx.cast(ctx.op("Equal", ctx.op("Shape", x), ctx.op("Shape", y)), onnx.TensorProto.INT64)
        same = ctx.cast(ctx.op("ReduceMin", equal, keepdims=0), onnx.TensorProto.BOOL)
    letters = _letters(rank)
    upper = [c.upper() for c in letters]
    out = list(letters)
    terms = ["".join(letters)]
    matrices = []
    # onnxruntime <= 1.23 crashes in an Einsum with an axis of size 0: where a resized axis of y may be empty,
    # g and W get one more row of zeros there (the sum is the same).
    y_dims = ctx.shape(y)
    padded = [axis for axis, _ in axes if y_dims is None or not (isinstance(y_dims[axis], int) and y_dims[axis] > 0)]
    if padded:
        g = ctx.op("Pad", g, ctx.int64s([0] * rank + [int(axis in padded) for axis in range(rank)]))
    for axis, k in axes:
        matrix = _interpolation_matrix(ctx, axis, k, rank, same)
        matrices.append(ctx.op("Pad", matrix, ctx.int64s([0, 0, 1, 0])) if axis in padded else matrix)
        terms.append(letters[axis] + upper[axis])
        out[axis] = upper[axis]
    dx = ctx.op("Einsum", g, *matrices, equation=",".join(terms) + "->" + "".join(out))
    return data_only(ctx, dx)
