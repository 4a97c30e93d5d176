"""Sampling at computed coordinates: GridSample and AffineGrid.

Notation: ``x`` is the image ``[N, C, *S]``, ``grid`` the normalized sampling
coordinates ``[N, *O, n]`` (the last axis holds ``(x, y, z)``: component ``k``
indexes spatial axis ``n - 1 - k``), ``g`` the output gradient. Along each
axis, ``c`` is the pixel coordinate of a normalized ``u`` (``align_corners``
decides the mapping), after ``padding_mode``'s border clamp or reflection.

A sample is a weighted sum of taps, ``w_corner = prod_axes w_axis``: two per
axis for linear (``1 - frac`` and ``frac``), four for cubic (Keys' weights,
:func:`~onnxtrain.autodiff.rules.backward_helpers.cubic_weights`), one for
nearest. ``dx`` adds ``g * w`` into zeros at the taps (ScatterElements with
``reduction="add"``), ``dgrid`` sums ``g * x * dw/dc * dc/dgrid`` over the
channels and taps; nearest sampling is piecewise constant in ``grid`` (no
gradient there).

AffineGrid is linear in ``theta``: ``grid[n, p] = theta[n] @ [base[p], 1]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from onnx import TensorProto

from onnxtrain.autodiff import dims
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.dims import Scalar
from onnxtrain.autodiff.registry import Grads, Result
from onnxtrain.autodiff.rules._builtin import registry
from onnxtrain.autodiff.rules.backward_helpers import clamp, cubic_slopes, cubic_weights, data_only, forward_attributes

# ------------------------------------------------------------------------ AffineGrid


@registry.rule("AffineGrid", opsets=(20, None), inputs=(0,))
def affine_grid(ctx: RuleContext, grads: Grads) -> Result:
    """dtheta = [g^T @ base, sum(g)], base = the normalized grid = AffineGrid(identity, size)"""
    # grid[n, p] = theta[n] @ [base[p], 1]: linear in theta. The base coordinates come
    # from the operator itself with the identity transform, so align_corners agrees.
    (g,) = grads
    theta, size = ctx.inputs[:2]
    rows = dims.dim_of(ctx, theta, 1)  # theta is [N, 2, 3] (2-D) or [N, 3, 4] (3-D)
    k = rows if isinstance(rows, int) else ctx.known_rank(ctx.outputs[0]) - 2
    batch = ctx.op("Slice", ctx.cast(size, TensorProto.INT64), ctx.int64s([0]), ctx.int64s([1]))
    identity = ctx.op(
        "Expand",
        ctx.const(np.eye(k, k + 1)[None], theta),
        dims.as_vector(ctx, dims.concat_dims(ctx, batch, [k, k + 1])),
    )
    base = ctx.op("AffineGrid", identity, size, **forward_attributes(ctx))
    g_flat = ctx.op("Reshape", g, ctx.int64s([0, -1, k]))  # type: ignore[arg-type]
    linear = ctx.op(
        "MatMul", ctx.op("Transpose", g_flat, perm=[0, 2, 1]), ctx.op("Reshape", base, ctx.int64s([0, -1, k]))
    )
    shift = ctx.op("ReduceSum", g_flat, ctx.int64s([1]), keepdims=0)
    return data_only(ctx, ctx.op("Concat", linear, ctx.op("Unsqueeze", shift, ctx.int64s([2])), axis=2))


# ------------------------------------------------------------------------ GridSample


def _reflect(ctx: RuleContext, c: str, low: Scalar, high: Scalar) -> tuple[str, str]:
    """``c`` reflected into ``[low, high]`` (where outside it), and ``d reflected / dc`` (+1 or -1)."""
    span = dims.combine_scalars(ctx, "Sub", high, low)
    shifted = ctx.sub(c, dims.as_tensor(ctx, low, c))
    period = dims.as_tensor(ctx, dims.combine_scalars(ctx, "Mul", span, 2.0), c)
    phase = ctx.sub(shifted, ctx.mul(period, ctx.op("Floor", ctx.div(shifted, period))))  # in [0, 2 span)
    back = ctx.compare("Greater", phase, dims.as_tensor(ctx, span, c))
    folded = ctx.add(dims.as_tensor(ctx, low, c), ctx.where(back, ctx.sub(period, phase), phase))
    outside = ctx.op(
        "Or",
        ctx.compare("Less", c, dims.as_tensor(ctx, low, c)),
        ctx.compare("Greater", c, dims.as_tensor(ctx, high, c)),
    )
    return ctx.where(outside, folded, c), ctx.where(outside, ctx.where(back, ctx.const(-1.0, c), 1.0), 1.0)


def _denormalized(ctx: RuleContext, u: str, size: Scalar, align: bool) -> tuple[str, Scalar, Scalar, Scalar, Scalar]:
    """``(c, dc/du, low, high, L - 1)``: the pixel coordinate ``c`` of the normalized ``u`` on an axis of size
    ``L``, and the range ``[low, high]`` that reflection padding reflects into."""
    size_f = dims.as_float(ctx, size, u)
    last = dims.combine_scalars(ctx, "Sub", size_f, 1.0)
    if align:  # c = (u + 1) / 2 * (L - 1)
        scale = dims.combine_scalars(ctx, "Mul", last, 0.5)
        return ctx.mul(ctx.add(u, 1.0), dims.as_tensor(ctx, scale, u)), scale, 0.0, last, last
    # c = ((u + 1) * L - 1) / 2
    scale = dims.combine_scalars(ctx, "Mul", size_f, 0.5)
    c = ctx.sub(ctx.mul(ctx.add(u, 1.0), dims.as_tensor(ctx, scale, u)), 0.5)
    return c, scale, -0.5, dims.combine_scalars(ctx, "Sub", size_f, 0.5), last


def _grid_axis(
    ctx: RuleContext, u: str, size: Scalar, align: bool, padding: str, nearest: bool
) -> tuple[str, list[tuple[str, str, str]]]:
    """One axis of GridSample: ``(dc/du, taps)``, a tap ``(index, weight, d weight / dc)`` (int64, float, float).

    ``u`` is the normalized coordinate, ``c`` the pixel coordinate after padding_mode's
    border clamp or reflection (which both end in a clamp to ``[0, L-1]``: the corner values
    outside are those of the border). Linear: taps floor(c) and floor(c) + 1; nearest: round(c).
    """
    c, scale, low, high, last = _denormalized(ctx, u, size, align)
    slope = dims.as_tensor(ctx, scale, u)
    if nearest:
        c = ctx.op("Round", c)  # half to even, as nearbyint
    if padding == "reflection":
        c, sign = _reflect(ctx, c, low, high)
        slope = ctx.mul(slope, sign)
    if padding in ("border", "reflection"):
        inside = ctx.op("And", ctx.compare("Greater", c, 0.0), ctx.compare("Less", c, dims.as_tensor(ctx, last, c)))
        slope = ctx.mul(slope, ctx.cast_like(inside, u))
        c = clamp(ctx, c, 0.0, last)
    if nearest:
        corners: list[tuple[str, str | float, str | float]] = [(c, 1.0, 0.0)]
    else:
        floor = ctx.op("Floor", c)
        frac = ctx.sub(c, floor)
        corners = [(floor, ctx.sub(1.0, frac), -1.0), (ctx.add(floor, 1.0), frac, 1.0)]
    taps = []
    for position, weight, dweight in corners:
        if padding == "zeros":  # corners outside the image read zeros
            valid = _within(ctx, position, last, u)
            weight, dweight = ctx.mul(valid, weight), ctx.mul(valid, dweight)
        index = ctx.cast(clamp(ctx, position, 0.0, last), TensorProto.INT64)
        taps.append((index, _full(ctx, weight, u), _full(ctx, dweight, u)))
    return slope, taps


def _within(ctx: RuleContext, position: str, last: Scalar, like: str) -> str:
    """``1`` where ``0 <= position <= last`` (a tap inside the image), else ``0``, in ``like``'s type."""
    inside = ctx.op(
        "And",
        ctx.compare("GreaterOrEqual", position, 0.0),
        ctx.compare("LessOrEqual", position, dims.as_tensor(ctx, last, position)),
    )
    return ctx.cast_like(inside, like)


def _grid_axis_cubic(
    ctx: RuleContext, u: str, size: Scalar, align: bool, padding: str
) -> tuple[str, list[tuple[str, str, str]]]:
    """One axis of bicubic GridSample, as :func:`_grid_axis`: taps ``floor(c) - 1 + i`` (i = 0..3).

    Keys' weights with ``a = -0.75`` of ``t = c - floor(c)`` (``c`` the pixel coordinate, not clamped),
    ``dc/du`` the scale of the denormalization; padding applies to each tap: zeros drops taps outside the
    image, border clamps them, reflection reflects them into the border range then clamps (as onnxruntime).
    """
    c, scale, low, high, last = _denormalized(ctx, u, size, align)
    floor = ctx.op("Floor", c)
    t = ctx.sub(c, floor)
    taps = []
    for i, (weight, dweight) in enumerate(zip(cubic_weights(ctx, t, -0.75), cubic_slopes(ctx, t, -0.75), strict=True)):
        position = ctx.add(floor, float(i - 1))
        if padding == "zeros":  # taps outside the image read zeros
            valid = _within(ctx, position, last, u)
            weight, dweight = ctx.mul(valid, weight), ctx.mul(valid, dweight)
        elif padding == "reflection":
            position, _ = _reflect(ctx, position, low, high)
        index = ctx.cast(clamp(ctx, position, 0.0, last), TensorProto.INT64)
        taps.append((index, weight, dweight))
    return dims.as_tensor(ctx, scale, u), taps


def _full(ctx: RuleContext, v: str | float, like: str) -> str:
    """``v`` (a tensor shaped like ``like``, or a number) as a tensor shaped like ``like``."""
    return v if isinstance(v, str) else ctx.expand_to(ctx.const(v, like), like)


def _corner_stack(ctx: RuleContext, parts: Sequence[str], axis: int, n: int) -> str:
    """Per-axis tap values ``[N, Q]`` stacked as ``[N, 1, 1.., taps, ..1, Q]`` (taps at ``2 + axis``)."""
    stacked = ctx.op("Concat", *(ctx.op("Unsqueeze", p, ctx.int64s([1])) for p in parts), axis=1)
    others = [1 + k for k in range(n + 1) if k != axis + 1]  # the channel axis and the other corner axes
    return ctx.op("Unsqueeze", stacked, ctx.int64s(others))


def _product(ctx: RuleContext, factors: Sequence[str]) -> str:
    result = factors[0]
    for factor in factors[1:]:
        result = ctx.mul(result, factor)
    return result


def _grid_sample(ctx: RuleContext, grads: Grads, mode: str) -> Result:
    """Gradients of GridSample with ``mode`` "linear", "nearest" or "cubic" (opset 20 names)."""
    (g,) = grads
    x, grid = ctx.inputs[:2]
    if mode not in ("linear", "nearest", "cubic"):
        raise ValueError(
            f"GridSample node {ctx.node.name!r} has mode={ctx.attr('mode')!r}; onnx defines linear (bilinear), "
            "nearest and cubic (bicubic): fix the model's attribute"
        )
    padding = ctx.attr("padding_mode", "zeros")
    if padding not in ("zeros", "border", "reflection"):
        raise ValueError(
            f"GridSample node {ctx.node.name!r} has padding_mode={padding!r}; onnx allows zeros, border, reflection"
        )
    align = bool(ctx.attr("align_corners", 0))
    n = ctx.known_rank(x) - 2
    sizes = [dims.dim_of(ctx, x, 2 + a) for a in range(n)]
    # the grid's last axis holds (x, y, z): component k indexes spatial axis n - 1 - k
    components = ctx.op("Transpose", ctx.op("Reshape", grid, ctx.int64s([0, -1, n])), perm=[0, 2, 1])  # [N, n, Q]
    axes = []
    for a in range(n):
        u = ctx.op("Gather", components, ctx.int64s([n - 1 - a]), axis=1)  # [N, 1, Q]
        u = ctx.op("Squeeze", u, ctx.int64s([1]))
        if mode == "cubic":
            axes.append(_grid_axis_cubic(ctx, u, sizes[a], align, padding))
        else:
            axes.append(_grid_axis(ctx, u, sizes[a], align, padding, mode == "nearest"))
    # tap tensors [N, 1, T, ..., T, Q] (one tap axis per spatial axis; T = 2, 4 or 1), then [N, 1, K, Q]
    weights = [_corner_stack(ctx, [w for _, w, _ in taps], a, n) for a, (_, taps) in enumerate(axes)]
    flat_index: str | None = None
    stride: Scalar = 1
    for a in reversed(range(n)):
        index = _corner_stack(ctx, [i for i, _, _ in axes[a][1]], a, n)
        term = index if stride == 1 else ctx.mul(index, dims.as_tensor(ctx, stride, index))
        flat_index = term if flat_index is None else ctx.add(flat_index, term)
        stride = dims.combine_scalars(ctx, "Mul", stride, sizes[a])
    assert flat_index is not None
    k = len(axes[0][1]) ** n  # corners: 2^n (linear), 4^n (cubic) or 1 (nearest)
    corners = ctx.int64s([0, 1, k, -1])
    flat_index = ctx.op("Reshape", flat_index, corners)
    x_flat = ctx.op("Reshape", x, ctx.int64s([0, 0, -1]))  # [N, C, P]
    g_flat = ctx.op("Unsqueeze", ctx.op("Reshape", g, ctx.int64s([0, 0, -1])), ctx.int64s([2]))  # [N, C, 1, Q]
    channels = dims.dims_of(ctx, x, 1, 2)
    index_c = ctx.op(
        "Expand", flat_index, dims.as_vector(ctx, dims.concat_dims(ctx, [1], channels, [1, 1]))
    )  # [N, C, K, Q]
    index_c = ctx.op("Reshape", index_c, ctx.int64s([0, 0, -1]))
    dx = dgrid = None
    if ctx.needs(0):
        w = ctx.op("Reshape", _product(ctx, weights), corners)
        update = ctx.op("Reshape", ctx.mul(g_flat, ctx.cast_like(w, x)), ctx.int64s([0, 0, -1]))
        zeros = ctx.zeros_like(x_flat)
        dx = ctx.op("ScatterElements", zeros, index_c, update, axis=2, reduction="add")
        dx = ctx.op("Reshape", dx, ctx.shape_of(x))
    if ctx.needs(1) and mode != "nearest":
        values = ctx.op("Reshape", ctx.op("GatherElements", x_flat, index_c, axis=2), ctx.int64s([0, 0, k, -1]))
        seen = ctx.cast_like(ctx.op("ReduceSum", ctx.mul(g_flat, values), ctx.int64s([1]), keepdims=1), grid)
        per_axis = []
        for a, (slope, taps) in enumerate(axes):
            factors = [weights[b] for b in range(n) if b != a] + [_corner_stack(ctx, [d for _, _, d in taps], a, n)]
            dw = ctx.op("Reshape", _product(ctx, factors), corners)
            dc = ctx.op("ReduceSum", ctx.mul(seen, dw), ctx.int64s([1, 2]), keepdims=0)  # [N, Q]
            per_axis.append(ctx.op("Unsqueeze", ctx.mul(dc, slope), ctx.int64s([2])))
        dgrid = ctx.op("Reshape", ctx.op("Concat", *reversed(per_axis), axis=2), ctx.shape_of(grid))
    return [dx, dgrid]


@registry.rule("GridSample", opsets=(16, 19), inputs=(0, 1))
def grid_sample_16(ctx: RuleContext, grads: Grads) -> Result:
    """bilinear/bicubic: dx = scatter-add(g w), dgrid = sum_C g sum_taps x dw/dc dc/dgrid; nearest: dgrid = 0"""
    # Opsets 16-19 name the modes bilinear, nearest and bicubic; 4-D inputs only.
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(ctx.attr("mode", "bilinear"), ctx.attr("mode", "bilinear"))
    return _grid_sample(ctx, grads, mode)


@registry.rule("GridSample", opsets=(20, None), inputs=(0, 1))
def grid_sample(ctx: RuleContext, grads: Grads) -> Result:
    """linear/cubic: dx = scatter-add(g w), dgrid = sum_C g sum_taps x dw/dc dc/dgrid; nearest: dgrid = 0"""
    # linear: w_corner = prod_axes (1 - frac or frac); c = the pixel coordinate, clamped (border) or
    # reflected then clamped (reflection); zeros padding drops corners outside the image.
    # cubic: 4 taps per axis with Keys' weights (a = -0.75) of frac(c); padding applies to each tap.
    return _grid_sample(ctx, grads, ctx.attr("mode", "linear"))
