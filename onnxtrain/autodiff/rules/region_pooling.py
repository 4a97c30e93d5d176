"""Pooling over regions of interest: RoiAlign and MaxRoiPool.

Notation: ``x`` is the image batch ``[N, C, H, W]``, ``rois`` the regions
``[R, 4]`` (``x1, y1, x2, y2``; MaxRoiPool's ``[R, 5]`` starts with the batch
index), ``g`` the output gradient ``[R, C, P, Q]`` (``P x Q`` bins per region).

Both are separable: along each axis a region's bins read the pixels through a
matrix (RoiAlign: the mean of each bin's samples' bilinear weights; MaxRoiPool:
which pixels a bin covers), built as one-hot rows ``[R, P, L]``. Each region's
gradient is then ``Ay[r]^T g[r] Ax[r]`` (or ``g`` sent to the argmax), and the
regions of one image are summed with a one-hot ``[N, R]`` MatMul.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from onnxtrain.autodiff import dims
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.dims import DimVector, Scalar
from onnxtrain.autodiff.registry import Grads, Result
from onnxtrain.autodiff.rules._builtin import registry
from onnxtrain.autodiff.rules.backward_helpers import clamp, reduce_over, scatter_add_into
from onnxtrain.graph import ops


def _batch_sum(ctx: RuleContext, parts: str, batch: str, x: str) -> str:
    """``dx[b] = sum(parts[r] for r where batch[r] == b)``: a one-hot ``[N, R]`` MatMul; ``parts`` is ``[R, ...]``."""
    n = dims.dim_of(ctx, x, 0)
    batch = ctx.cast(batch, TensorProto.INT64)
    onehot = ctx.compare("Equal", dims.arange(ctx, n, batch, (-1, 1)), ctx.op("Unsqueeze", batch, ctx.int64s([0])))
    flat = ctx.op("Reshape", parts, ctx.int64s([0, -1]))
    return ctx.op("Reshape", ctx.op("MatMul", ctx.cast_like(onehot, x), flat), ctx.shape_of(x))


def _per_roi(ctx: RuleContext, v: str) -> str:
    """A per-RoI vector ``[R]`` as ``[R, 1, 1]``."""
    return ctx.op("Unsqueeze", v, ctx.int64s([1, 2]))


def _roi_column(ctx: RuleContext, rois: str, k: int, like: str) -> str:
    """Column ``k`` of ``rois`` ``[R, *]`` as ``[R]`` in the element type of ``like``."""
    return ctx.cast_like(ctx.op("Squeeze", ctx.op("Gather", rois, ctx.int64s([k]), axis=1), ctx.int64s([1])), like)


def _roi_align_axis(
    ctx: RuleContext, start: str, length: str, pooled: int, size: Scalar, ratio: int, x: str
) -> tuple[str, str, str, DimVector]:
    """The bilinear taps of RoiAlign along one axis, as one-hot rows.

    Returns ``(taps, present, count, grid)``: ``taps[r, p, s, corner, l]`` is the weight
    of pixel ``l`` at the low/high corner of sample ``s`` of bin ``p`` (0 for samples
    outside ``[-1, size]``, as onnxruntime); ``present[r, 1, s]`` says whether sample ``s``
    exists for RoI ``r`` (the adaptive sample count varies per RoI); ``count[r]`` is
    that count; ``grid`` the number of sample slots.
    """
    bin_size = ctx.div(length, float(pooled))
    if ratio > 0:
        count = ctx.expand_to(ctx.const(float(ratio), x), start)
        grid: DimVector = [ratio]
        n_slots: Scalar = ratio
    else:
        count = ctx.op("Ceil", bin_size)  # ceil(length / pooled); at most 0 for an empty RoI
        most = ctx.op("Max", ctx.op("ReduceMax", count, keepdims=1), ctx.const([1.0], x))  # at least one slot
        grid = ctx.cast(most, TensorProto.INT64)
        n_slots = ctx.op("Squeeze", grid, ctx.int64s([0]))
    slots = dims.arange(ctx, n_slots, x, (1, 1, -1))
    bins = dims.arange(ctx, pooled, x, (1, -1, 1))
    step = _per_roi(ctx, bin_size)
    # y = start + p * bin + (s + 0.5) * bin / count, in onnxruntime's order (no samples when count = 0)
    y = ctx.add(
        ctx.add(_per_roi(ctx, start), ctx.mul(bins, step)),
        ctx.div(ctx.mul(ctx.add(slots, 0.5), step), _per_roi(ctx, ctx.op("Max", count, ctx.const(1.0, x)))),
    )  # [R, P, G]
    size_f = dims.as_float(ctx, size, x)
    last = dims.as_tensor(ctx, dims.combine_scalars(ctx, "Sub", size_f, 1.0), x)
    inside = ctx.cast_like(
        ctx.op(
            "Not", ctx.op("Or", ctx.compare("Less", y, -1.0), ctx.compare("Greater", y, dims.as_tensor(ctx, size_f, x)))
        ),
        x,
    )
    y = ctx.op("Max", y, ctx.const(0.0, x))
    low = ctx.op("Floor", y)
    at_end = ctx.compare("GreaterOrEqual", low, last)
    low = ctx.where(at_end, last, low)
    frac = ctx.where(at_end, 0.0, ctx.sub(y, low))
    high = ctx.where(at_end, last, ctx.add(low, 1.0))
    weights = ctx.op(
        "Concat",
        *(ctx.op("Unsqueeze", ctx.mul(w, inside), ctx.int64s([3])) for w in (ctx.sub(1.0, frac), frac)),
        axis=3,
    )  # [R, P, G, 2]
    corners = ctx.op("Concat", *(ctx.op("Unsqueeze", v, ctx.int64s([3])) for v in (low, high)), axis=3)
    pixels = dims.arange(ctx, size, x, (1, 1, 1, 1, -1))
    hits = ctx.compare("Equal", ctx.op("Unsqueeze", corners, ctx.int64s([4])), pixels)
    taps = ctx.where(hits, ctx.op("Unsqueeze", weights, ctx.int64s([4])), 0.0)  # [R, P, G, 2, L]
    present = ctx.compare("Less", slots, _per_roi(ctx, count))  # [R, 1, G]
    return taps, present, count, grid


def _roi_align(ctx: RuleContext, grads: Grads, half_pixel: bool) -> Result:
    """dx of RoiAlign: per RoI ``dxr = Ay^T g Ax`` (avg) or the argmax sample's corner weights (max)."""
    (g,) = grads
    x, rois, batch = ctx.inputs
    mode = ctx.attr("mode", "avg")
    if mode not in ("avg", "max"):
        raise ValueError(f"RoiAlign node {ctx.node.name!r} has mode={mode!r}; onnx allows avg and max")
    ph, pw = int(ctx.attr("output_height", 1)), int(ctx.attr("output_width", 1))
    ratio = int(ctx.attr("sampling_ratio", 0))
    scale = float(ctx.attr("spatial_scale", 1.0))
    offset = 0.5 if half_pixel else 0.0
    corner = [ctx.sub(ctx.mul(_roi_column(ctx, rois, k, x), scale), offset) for k in range(4)]  # x1, y1, x2, y2
    lengths = [ctx.sub(corner[2 + k], corner[k]) for k in range(2)]  # width, height
    if not half_pixel:
        lengths = [ctx.op("Max", v, ctx.const(1.0, x)) for v in lengths]
    height, width = dims.dim_of(ctx, x, 2), dims.dim_of(ctx, x, 3)
    ay, present_y, count_y, grid_y = _roi_align_axis(ctx, corner[1], lengths[1], ph, height, ratio, x)
    ax, present_x, count_x, grid_x = _roi_align_axis(ctx, corner[0], lengths[0], pw, width, ratio, x)
    if mode == "avg":
        # y[r, c] = Sy[r] @ x[batch[r], c] @ Sx[r]^T, S[r, p, l] = sum over the samples / count
        def average(taps: str, present: str, count: str) -> str:
            mask = ctx.op("Unsqueeze", ctx.cast_like(present, x), ctx.int64s([3, 4]))
            total = ctx.op("ReduceSum", ctx.mul(taps, mask), ctx.int64s([2, 3]), keepdims=0)  # [R, P, L]
            return ctx.op(
                "Unsqueeze", ctx.div(total, _per_roi(ctx, ctx.op("Max", count, ctx.const(1.0, x)))), ctx.int64s([1])
            )

        sy, sx = average(ay, present_y, count_y), average(ax, present_x, count_x)  # [R, 1, P, L]
        per_roi = ctx.op("MatMul", ctx.op("MatMul", ctx.op("Transpose", sy, perm=[0, 1, 3, 2]), g), sx)
        return [_batch_sum(ctx, per_roi, batch, x), None, None]
    # max: onnxruntime takes the largest weighted corner value w * x over the samples' four
    # corners, the first one on ties, in the order (sample y, sample x, corner y, corner x)
    # one row per (bin, sample, corner): [R, 1, P * G * 2, L]
    rows = ctx.op(
        "Unsqueeze",
        ctx.op("Reshape", ay, dims.as_vector(ctx, dims.concat_dims(ctx, [0, -1], dims.dims_of(ctx, x, 2, 3)))),
        ctx.int64s([1]),
    )
    cols = ctx.op(
        "Unsqueeze",
        ctx.op("Reshape", ax, dims.as_vector(ctx, dims.concat_dims(ctx, [0, -1], dims.dims_of(ctx, x, 3, 4)))),
        ctx.int64s([1]),
    )
    rois_x = ctx.op("Gather", x, ctx.cast(batch, TensorProto.INT64), axis=0)  # [R, C, H, W]
    weighted = ctx.op("MatMul", ctx.op("MatMul", rows, rois_x), ctx.op("Transpose", cols, perm=[0, 1, 3, 2]))
    split = dims.as_vector(ctx, dims.concat_dims(ctx, [0, 0, ph], grid_y, [2, pw], grid_x, [2]))
    candidates = ctx.op("Transpose", ctx.op("Reshape", weighted, split), perm=[0, 1, 2, 5, 3, 6, 4, 7])
    flat = ctx.int64s([0, 0, ph, pw, -1])
    exists = ctx.op(
        "And",
        ctx.op("Unsqueeze", present_y, ctx.int64s([1, 2, 5, 6, 7])),  # [R, 1, 1, 1, Gy, 1, 1, 1]
        ctx.op("Unsqueeze", present_x, ctx.int64s([1, 2, 3, 6, 7])),  # [R, 1, 1, 1, 1, Gx, 1, 1]
    )
    exists = ctx.op(
        "Reshape", ctx.op("Expand", exists, ctx.int64s([1, 1, 1, 1, 1, 1, 2, 2])), ctx.int64s([0, 1, 1, 1, -1])
    )
    scores = ctx.where(exists, ctx.op("Reshape", candidates, flat), ctx.const(-np.inf, x))
    best = ctx.op("ArgMax", scores, axis=-1, keepdims=1)
    slots = dims.combine(ctx, "Mul", dims.combine(ctx, "Mul", grid_y, grid_x), [4])
    positions = dims.arange(
        ctx, slots[0] if isinstance(slots, list) else ctx.op("Squeeze", slots, ctx.int64s([0])), best
    )
    chosen = ctx.op("And", ctx.compare("Equal", best, positions), exists)
    spread = ctx.where(chosen, ctx.op("Unsqueeze", g, ctx.int64s([4])), 0.0)  # type: ignore[arg-type]
    unsplit = dims.as_vector(ctx, dims.concat_dims(ctx, [0, 0, ph, pw], grid_y, grid_x, [2, 2]))
    back = ctx.op("Transpose", ctx.op("Reshape", spread, unsplit), perm=[0, 1, 2, 4, 6, 3, 5, 7])
    back = ctx.op(
        "Reshape",
        back,
        dims.as_vector(ctx, dims.concat_dims(ctx, [0, 0], dims.combine(ctx, "Mul", [ph * 2], grid_y), [-1])),
    )
    per_roi = ctx.op("MatMul", ctx.op("MatMul", ctx.op("Transpose", rows, perm=[0, 1, 3, 2]), back), cols)
    return [_batch_sum(ctx, per_roi, batch, x), None, None]


@registry.rule("RoiAlign", opsets=(10, 15), inputs=(0,))
def roi_align_10(ctx: RuleContext, grads: Grads) -> Result:
    """avg: dx[b] = sum_{r in b} Ay[r]^T g[r] Ax[r] (sampling weights, separable); max: g to the argmax corner * w"""
    # Opsets 10-15 map RoIs with output_half_pixel: no half-pixel offset, lengths at least 1.
    return _roi_align(ctx, grads, half_pixel=False)


@registry.rule("RoiAlign", opsets=(16, None), inputs=(0,))
def roi_align(ctx: RuleContext, grads: Grads) -> Result:
    """avg: dx[b] = sum_{r in b} Ay[r]^T g[r] Ax[r] (sampling weights, separable); max: g to the argmax corner * w"""
    # Ay[r, p, h] = mean over bin p's samples of their bilinear weights on row h (Ax on
    # columns). coordinate_transformation_mode: half_pixel (the default) or output_half_pixel.
    mode = ctx.attr("coordinate_transformation_mode", "half_pixel")
    if mode not in ("half_pixel", "output_half_pixel"):
        raise ValueError(f"RoiAlign node {ctx.node.name!r} has coordinate_transformation_mode={mode!r}")
    return _roi_align(ctx, grads, half_pixel=mode == "half_pixel")


def _max_roi_axis(ctx: RuleContext, low: str, high: str, pooled: int, size: Scalar, x: str) -> tuple[str, str]:
    """MaxRoiPool's bins along one axis: ``(inside[r, p, l], nonempty[r, p])``, as onnxruntime computes them."""

    def rounded(v: str) -> str:  # half away from zero, as std::round
        return ctx.mul(ctx.op("Sign", v), ctx.op("Floor", ctx.add(ctx.op("Abs", v), 0.5)))

    start = rounded(low)
    length = ctx.op("Max", ctx.add(ctx.sub(rounded(high), start), 1.0), ctx.const(1.0, x))
    step = ctx.op("Unsqueeze", ctx.div(length, float(pooled)), ctx.int64s([1]))  # [R, 1]
    bins = dims.arange(ctx, pooled, x, (1, -1))
    offset = ctx.op("Unsqueeze", start, ctx.int64s([1]))
    size_f = dims.as_tensor(ctx, dims.as_float(ctx, size, x), x)
    first = clamp(ctx, ctx.add(ctx.op("Floor", ctx.mul(bins, step)), offset), 0.0, size_f)  # [R, P]
    end = clamp(ctx, ctx.add(ctx.op("Ceil", ctx.mul(ctx.add(bins, 1.0), step)), offset), 0.0, size_f)
    pixels = dims.arange(ctx, size, x, (1, 1, -1))
    inside = ctx.op(
        "And",
        ctx.compare("GreaterOrEqual", pixels, ctx.op("Unsqueeze", first, ctx.int64s([2]))),
        ctx.compare("Less", pixels, ctx.op("Unsqueeze", end, ctx.int64s([2]))),
    )  # [R, P, L]
    return inside, ctx.compare("Greater", end, first)


@registry.rule("MaxRoiPool", inputs=(0,))
def max_roi_pool(ctx: RuleContext, grads: Grads) -> Result:
    """dx[b, c, argmax of bin (p, q) of RoI r] += g[r, c, p, q] for the RoIs r of image b (empty bins: none)"""
    # The argmax (the first maximum in row-major order, as onnxruntime) in two stages:
    # per row and column bin over the columns, then per bin over the rows; memory
    # R * C * H * W * max(P, Q). Gradients land with ScatterElements(reduction=add)
    # from opset 16, before that with a one-hot contraction (R * C * P * Q * H * W).
    (g,) = grads
    x, rois = ctx.inputs
    ph, pw = (int(v) for v in ctx.attr("pooled_shape"))
    scale = float(ctx.attr("spatial_scale", 1.0))
    column = [ctx.mul(_roi_column(ctx, rois, k, x), scale) if k else _roi_column(ctx, rois, k, x) for k in range(5)]
    height, width = dims.dim_of(ctx, x, 2), dims.dim_of(ctx, x, 3)
    rows, rows_used = _max_roi_axis(ctx, column[2], column[4], ph, height, x)  # [R, P, H], [R, P]
    cols, cols_used = _max_roi_axis(ctx, column[1], column[3], pw, width, x)  # [R, Q, W], [R, Q]
    batch = ctx.cast(column[0], TensorProto.INT64)  # truncated, as onnxruntime
    images = ctx.op("Gather", x, batch, axis=0)  # [R, C, H, W]
    lowest = ctx.const(-np.inf, x)
    per_col = ctx.where(
        ctx.op("Unsqueeze", cols, ctx.int64s([1, 2])), ctx.op("Unsqueeze", images, ctx.int64s([3])), lowest
    )  # [R, C, H, Q, W]
    col_max = reduce_over(ctx, "ReduceMax", per_col, [4], keepdims=0)  # [R, C, H, Q]
    col_arg = ctx.op("ArgMax", per_col, axis=4, keepdims=0)
    per_bin = ctx.where(
        ctx.op("Unsqueeze", rows, ctx.int64s([1, 4])), ctx.op("Unsqueeze", col_max, ctx.int64s([2])), lowest
    )  # [R, C, P, H, Q]
    row_arg = ctx.op("ArgMax", per_bin, axis=3, keepdims=0)  # [R, C, P, Q]
    flat = ctx.add(
        ctx.mul(row_arg, dims.as_tensor(ctx, width, row_arg)), ctx.op("GatherElements", col_arg, row_arg, axis=2)
    )
    used = ctx.op(
        "And", ctx.op("Unsqueeze", rows_used, ctx.int64s([2])), ctx.op("Unsqueeze", cols_used, ctx.int64s([1]))
    )
    update = ctx.where(ctx.op("Unsqueeze", used, ctx.int64s([1])), g, 0.0)  # type: ignore[arg-type]
    by_row = ctx.int64s([0, 0, -1])
    if ops.scatter_can_add(ctx.opset):
        zeros = ctx.zeros_like(ctx.op("Reshape", images, by_row))
        per_roi = scatter_add_into(ctx, zeros, flat, update, by_row, axis=2)
    else:
        pixels = dims.arange(ctx, dims.combine_scalars(ctx, "Mul", height, width), flat, (1, 1, 1, 1, -1))
        hits = ctx.compare("Equal", ctx.op("Unsqueeze", flat, ctx.int64s([4])), pixels)
        spread = ctx.where(hits, ctx.op("Unsqueeze", update, ctx.int64s([4])), 0.0)
        per_roi = ctx.op("ReduceSum", spread, ctx.int64s([2, 3]), keepdims=0)
    per_roi = ctx.op("Reshape", per_roi, ctx.shape_of(images))
    return [_batch_sum(ctx, per_roi, batch, x), None]
