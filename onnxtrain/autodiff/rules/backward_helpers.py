"""The backward math that rules of more than one operator family share, written once.

- **Statistics**: :func:`standardize` and :func:`standardize_grad`,
  ``d/dx [(x - mean) * inv] = inv * (gh - mean(gh) - xhat * mean(gh * xhat))``
  (BatchNormalization, LayerNormalization, InstanceNormalization,
  GroupNormalization and ONNX Runtime's fused layer normalizations);
  :func:`rms_scale` and :func:`rms_scale_grad`, ``d/dx [x * r] = r * (gh - xh * mean(gh * xh))``
  (RMSNormalization, SimplifiedLayerNormalization); :func:`reduce_over`, a
  reduction with its axes in the form the model's opset takes.
- **Attention heads**: :func:`split_heads` and :func:`merge_heads`, ``[B, S, H * D]`` to ``[B, H, S, D]`` and back.
- **Keys' cubic kernel**: :func:`cubic_weights` and :func:`cubic_slopes` (Resize, GridSample).
- **Scatter-add**: :func:`scatter_add_rows`, :func:`scatter_add_flat`, :func:`scatter_add_into` and
  :func:`scatter_rows`, the
  transpose of a gather (Gather, GatherND, GatherElements, Pad, embeddings),
  with a ``ScatterElements(reduction="add")`` from opset 16 and sums per index before (never
  ``ScatterND``'s, which onnxruntime's CPU threads add wrongly into a row two of them share).
- **Sliding windows**: :class:`WindowGeometry`, :func:`window`, :func:`framed`
  and :func:`transposed_conv_to`, the spatial bookkeeping of convolutions and
  pooling (strides ``s``, dilations ``d``, pads, kernel ``K``, window extent
  ``(K - 1) * d + 1``), in :mod:`onnxtrain.autodiff.dims` arithmetic.
- **Rule results**: :func:`data_only` and :func:`forward_attributes`; :func:`clamp` with bounds known or not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx

from onnxtrain.autodiff import dims
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.dims import DimVector
from onnxtrain.autodiff.registry import Result
from onnxtrain.graph import ops
from onnxtrain.graph.attributes import attributes

# ------------------------------------------------------------ rule results


def data_only(ctx: RuleContext, dx: str | None) -> Result:
    """``dx`` for the data input (input 0), ``None`` for the others (shapes, axes, indices, ...)."""
    return [dx] + [None] * (len(ctx.inputs) - 1)


def forward_attributes(ctx: RuleContext, drop: Sequence[str] = ()) -> dict[str, Any]:
    """The forward node's attributes but ``drop``, as keyword arguments for ``ctx.op``."""
    return {name: value for name, value in attributes(ctx.node).items() if name not in drop}


def clamp(ctx: RuleContext, v: str, low: dims.Scalar, high: dims.Scalar) -> str:
    """``min(max(v, low), high)``, the bounds numbers or scalar tensors (sampling coordinates, RoI bins)."""
    return ctx.op("Min", ctx.op("Max", v, dims.as_tensor(ctx, low, v)), dims.as_tensor(ctx, high, v))


# ------------------------------------------------------------ statistics


def reduce_over(ctx: RuleContext, op: str, v: str, axes: Sequence[int], keepdims: int = 1) -> str:
    """ReduceSum / ReduceMean / ReduceMax of ``v`` over ``axes``: an input or an attribute, by the model's opset."""
    if ops.axes_as_input(op, ctx.onnx_opset):
        return ctx.op(op, v, ctx.int64s(axes), keepdims=keepdims)
    return ctx.op(op, v, axes=list(axes), keepdims=keepdims)


def standardize(ctx: RuleContext, x: str, axes: Sequence[int], eps: float) -> tuple[str, str]:
    """``xhat = (x - mean) * inv`` and ``inv = 1 / sqrt(var + eps)`` over ``axes`` (kept as size 1)."""
    xc = ctx.sub(x, reduce_over(ctx, "ReduceMean", x, axes))
    inv = ctx.op("Reciprocal", ctx.op("Sqrt", ctx.add(reduce_over(ctx, "ReduceMean", ctx.square(xc), axes), eps)))
    return ctx.mul(xc, inv), inv


def standardize_grad(ctx: RuleContext, gh: str, xhat: str, inv: str, axes: Sequence[int]) -> str:
    """d/dx of ``xhat`` given ``gh = dL/dxhat``: ``inv * (gh - mean(gh) - xhat * mean(gh * xhat))``."""
    centered = ctx.sub(gh, reduce_over(ctx, "ReduceMean", gh, axes))
    projected = ctx.mul(xhat, reduce_over(ctx, "ReduceMean", ctx.mul(gh, xhat), axes))
    return ctx.mul(inv, ctx.sub(centered, projected))


def rms_scale(ctx: RuleContext, x: str, axes: Sequence[int], eps: float) -> tuple[str, str]:
    """``xh = x * r`` and ``r = 1 / sqrt(mean(x^2) + eps)`` over ``axes`` (kept as size 1): RMS normalization."""
    r = ctx.op("Reciprocal", ctx.op("Sqrt", ctx.add(reduce_over(ctx, "ReduceMean", ctx.square(x), axes), eps)))
    return ctx.mul(x, r), r


def rms_scale_grad(ctx: RuleContext, gh: str, xh: str, r: str, axes: Sequence[int]) -> str:
    """d/dx of ``xh`` given ``gh = dL/dxh``: ``r * (gh - xh * mean(gh * xh))``."""
    return ctx.mul(r, ctx.sub(gh, ctx.mul(xh, reduce_over(ctx, "ReduceMean", ctx.mul(gh, xh), axes))))


# ------------------------------------------------------------ attention heads


def split_heads(ctx: RuleContext, t: str, heads: int) -> str:
    """``[B, S, H * D]`` as ``[B, H, S, D]``."""
    return ctx.op("Transpose", ctx.op("Reshape", t, ctx.int64s([0, 0, heads, -1])), perm=[0, 2, 1, 3])


def merge_heads(ctx: RuleContext, t: str, like: str) -> str:
    """``[B, H, S, D]`` back to the shape of ``like``, ``[B, S, H * D]``."""
    return ctx.op("Reshape", ctx.op("Transpose", t, perm=[0, 2, 1, 3]), ctx.shape_of(like))


# ------------------------------------------------------------ Keys' cubic convolution kernel


def cubic_weights(ctx: RuleContext, t: str, a: float) -> list[str]:
    """Keys' cubic convolution weights of the taps at offsets -1, 0, 1, 2 from ``floor(s)``, ``t = s - floor(s)``.

    ``k(t + 1), k(t), k(1 - t), k(2 - t)`` with ``k(d) = (a + 2)|d|^3 - (a + 3)|d|^2 + 1`` for ``|d| <= 1`` and
    ``a|d|^3 - 5a|d|^2 + 8a|d| - 4a`` for ``1 < |d| < 2``.
    """

    def near(d: str) -> str:
        return ctx.add(ctx.mul(ctx.square(d), ctx.sub(ctx.mul(d, a + 2.0), a + 3.0)), 1.0)

    def far(d: str) -> str:
        return ctx.sub(ctx.mul(ctx.add(ctx.mul(ctx.sub(ctx.mul(d, a), 5.0 * a), d), 8.0 * a), d), 4.0 * a)

    return [far(ctx.add(t, 1.0)), near(t), near(ctx.sub(1.0, t)), far(ctx.sub(2.0, t))]


def cubic_slopes(ctx: RuleContext, t: str, a: float) -> list[str]:
    """``d/dt`` of :func:`cubic_weights`: ``k'(t + 1), k'(t), -k'(1 - t), -k'(2 - t)``."""

    def near(d: str) -> str:  # 3(a + 2) d^2 - 2(a + 3) d
        return ctx.mul(d, ctx.sub(ctx.mul(d, 3.0 * (a + 2.0)), 2.0 * (a + 3.0)))

    def far(d: str) -> str:  # 3a d^2 - 10a d + 8a
        return ctx.add(ctx.mul(d, ctx.sub(ctx.mul(d, 3.0 * a), 10.0 * a)), 8.0 * a)

    return [far(ctx.add(t, 1.0)), near(t), ctx.neg(near(ctx.sub(1.0, t))), ctx.neg(far(ctx.sub(2.0, t)))]


# ------------------------------------------------------------ scatter-add


def _sums_by_key(ctx: RuleContext, keys: str, values: str) -> tuple[str, str]:
    """``(distinct, sums)``: the distinct values of the 1-D int64 ``keys`` (``Unique``, sorted), and for each the
    sum of the rows of ``values`` (``[len(keys), ...]``) whose key it is.

    The rows sorted by key (``TopK``), their running sums (``CumSum``, inclusive and exclusive, in float64 so
    that the differences keep their precision), and for each run of equal keys the inclusive sum at its last
    row minus the exclusive sum at its first (``CumSum(counts)``): memory linear in ``values``, time
    ``T log T`` for ``T`` keys.
    """
    distinct, _, _, counts = ctx.op_n("Unique", 4, keys, sorted=1)
    count = ctx.op("Reshape", ctx.op("Size", keys), ctx.int64s([1]))
    _, order = ctx.op_n("TopK", 2, keys, count, axis=0, largest=0, sorted=1)
    ordered = ctx.cast(ctx.op("Gather", values, order, axis=0), onnx.TensorProto.DOUBLE)
    zero = dims.int64_scalar(ctx, 0)
    through = ctx.op(
        "Gather",
        ctx.op("CumSum", ordered, zero),
        ctx.op("Sub", ctx.op("CumSum", counts, zero), dims.int64_scalar(ctx, 1)),
    )
    before = ctx.op("Gather", ctx.op("CumSum", ordered, zero, exclusive=1), ctx.op("CumSum", counts, zero, exclusive=1))
    return distinct, ctx.cast_like(ctx.op("Sub", through, before), values)


def scatter_add_flat(ctx: RuleContext, positions: str, updates: str, like: str) -> str:
    """``dx`` shaped like ``like`` with ``dx.flat[k] = sum(updates.flat[j] for positions.flat[j] == k)``."""
    flat_pos = ctx.op("Reshape", positions, ctx.int64s([-1]))
    flat_upd = ctx.op("Reshape", updates, ctx.int64s([-1]))
    if ops.scatter_can_add(ctx.onnx_opset):
        flat = ctx.op(
            "ScatterElements", ctx.flat_zeros_like(like, after=updates), flat_pos, flat_upd, axis=0, reduction="add"
        )
    else:  # no adding scatter: add up per position first, then scatter the sums, each to a position of its own
        distinct, sums = _sums_by_key(ctx, flat_pos, flat_upd)
        flat = ctx.op("ScatterElements", ctx.flat_zeros_like(like, after=updates), distinct, sums, axis=0)
    return ctx.op("Reshape", flat, ctx.shape_of(like))


def scatter_add_into(ctx: RuleContext, zeros: str, indices: str, updates: str, shape: str, axis: int) -> str:
    """``updates`` added into ``zeros`` at ``indices`` along ``axis``, both reshaped to ``shape`` first:
    ``ScatterElements(reduction="add")``, from opset 16 on (:func:`~onnxtrain.graph.ops.scatter_can_add`)."""
    indices, updates = ctx.op("Reshape", indices, shape), ctx.op("Reshape", updates, shape)
    return ctx.op("ScatterElements", zeros, indices, updates, axis=axis, reduction="add")


def scatter_add_rows(ctx: RuleContext, rows: str, updates: str, n_rows: str, like: str) -> str:
    """``D[r, ...] = sum(updates[s, ...] for rows[s] == r)``, of shape ``[n_rows] + updates.shape[q:]``.

    ``rows`` (values in ``[0, n_rows)``, rank ``q``) indexes the leading ``q`` axes of ``updates``;
    ``like`` has as many elements as ``D``.

    From opset 16 a ``ScatterElements(reduction="add")`` along the rows of
    ``updates`` flattened to ``[M, S]``, each row's index repeated over its
    ``S`` elements: onnxruntime's CPU ``ScatterND(reduction="add")`` splits
    the updates between threads and loses additions where two threads add
    into one row (an embedding's row read twice in a batch: a gradient off
    by 3.7 in 2 of 5 runs on 2 threads, onnxruntime 1.23 and 1.32), where its
    ``ScatterElements`` adds them all. The indices take twice the updates'
    bytes (int64), for the moment of the scatter.
    """
    q = ctx.known_rank(rows)
    static = ctx.static_shape(updates)

    def rest() -> str:
        """``updates.shape[q:]``, 1-D."""
        if static is not None:
            return ctx.int64s(list(static[q:]))
        return ctx.op("Slice", ctx.op("Shape", updates), ctx.int64s([q]), ctx.int64s([1 << 62]))

    n_static = ctx.constant_value(n_rows)
    if static is not None and n_static is not None:
        shape = ctx.int64s([int(n_static), *static[q:]])
    else:
        shape = ctx.op("Concat", ctx.op("Reshape", n_rows, ctx.int64s([1])), rest(), axis=0)
    zeros = ctx.zeros_shaped(shape, updates, like, after=updates)
    if ops.scatter_can_add(ctx.onnx_opset):
        return _scatter_add_flat_rows(ctx, zeros, rows, updates, q, shape)
    # no adding scatter: add up the updates of each distinct row first, then scatter the sums, one per row
    flat_rows = ctx.op("Reshape", rows, ctx.int64s([-1]))
    flat_updates = ctx.op("Reshape", updates, ctx.op("Concat", ctx.int64s([-1]), rest(), axis=0))
    distinct, sums = _sums_by_key(ctx, flat_rows, flat_updates)
    return ctx.op("ScatterND", zeros, ctx.op("Unsqueeze", distinct, ctx.int64s([-1])), sums)


def scatter_rows(ctx: RuleContext, table: str, rows: str, flat: str, reduction: str = "add") -> str:
    """``ScatterElements`` of ``flat`` ``[M, S]`` into ``table`` ``[n, S]`` along axis 0, row ``m`` of ``flat``
    going to row ``rows[m]`` (``rows`` of ``M`` elements, repeated over the ``S`` elements of its row), with
    ``reduction`` (``"none"``: none). onnxruntime's CPU ``ScatterND`` splits the updates between threads and
    loses the reductions of two of them into one row; its ``ScatterElements`` does not."""
    indices = ctx.op("Expand", ctx.op("Reshape", rows, ctx.int64s([-1, 1])), ctx.op("Shape", flat))
    extra = {} if reduction == "none" else {"reduction": reduction}
    return ctx.op("ScatterElements", table, indices, flat, axis=0, **extra)


def _scatter_add_flat_rows(ctx: RuleContext, zeros: str, rows: str, updates: str, q: int, shape: str) -> str:
    """:func:`scatter_add_rows` by :func:`scatter_rows` of ``updates`` as ``[M, S]`` (``Flatten`` at ``q``) into
    ``zeros`` as ``[n_rows, S]``; reshaped to ``shape`` unless ``updates`` has one axis after the rows (an
    embedding's ``[N, T, D]``), whose result is ``[n_rows, S]`` already and stays a scatter onto zeros (the
    engine adds a second gather's gradient onto it in place)."""
    rank = ctx.rank(updates)  # None where unknown: the general form
    flat = updates if rank == q + 1 and q == 1 else ctx.op("Flatten", updates, axis=q)
    if rank == q + 1:
        return scatter_rows(ctx, zeros, rows, flat)
    # allowzero: a size of 0 in the shape is 0 (an empty axis), not "copy the input's"
    return ctx.op("Reshape", scatter_rows(ctx, ctx.op("Flatten", zeros, axis=1), rows, flat), shape, allowzero=1)


# ------------------------------------------------------------ sliding windows


class WindowGeometry:
    """Strides, dilations, kernel and pads of a convolution or pooling node (pads as dimension vectors)."""

    def __init__(self, ctx: RuleContext, x: str, kernel: DimVector, weight: str | None = None) -> None:
        rank = ctx.rank(x)
        if rank is None and isinstance(kernel, list):  # the kernel has one dimension per spatial axis
            rank = len(kernel) + 2
        if rank is None and weight is not None:  # a convolution's weight has its input's rank
            rank = ctx.rank(weight)
        self.rank = rank if rank is not None else ctx.known_rank(x)
        n = self.n = self.rank - 2
        self.strides = [int(v) for v in ctx.attr("strides", [1] * n)]
        self.dilations = [int(v) for v in ctx.attr("dilations", [1] * n)]
        self.kernel = kernel
        self.auto_pad = ctx.attr("auto_pad", "NOTSET")
        self.axes = dims.spatial_axes(self.rank)

    def extent(self, ctx: RuleContext) -> DimVector:
        """``(K - 1) * d + 1``: the span of one window."""
        ones = [1] * self.n
        return dims.combine(
            ctx, "Add", dims.combine(ctx, "Mul", dims.combine(ctx, "Sub", self.kernel, ones), self.dilations), ones
        )

    def split(self, ctx: RuleContext, total: DimVector, head_larger: bool) -> tuple[DimVector, DimVector]:
        """``total`` padding as (begin, end): the odd one at the beginning when ``head_larger``."""
        half = dims.combine(ctx, "Div", total, [2] * self.n)
        rest = dims.combine(ctx, "Sub", total, half)
        return (rest, half) if head_larger else (half, rest)

    def forward_pads(self, ctx: RuleContext, x: str, y: str) -> tuple[DimVector, DimVector]:
        """The pads a Conv or pooling node applied to ``x`` (``auto_pad`` resolved)."""
        n = self.n
        if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = dims.dims_of(ctx, y, 2, rank=self.rank)
            covered = dims.combine(ctx, "Mul", dims.combine(ctx, "Sub", out, [1] * n), self.strides)
            needed = dims.combine(
                ctx, "Sub", dims.combine(ctx, "Add", covered, self.extent(ctx)), dims.dims_of(ctx, x, 2)
            )
            return self.split(ctx, dims.combine(ctx, "Max", needed, [0] * n), self.auto_pad == "SAME_LOWER")
        if self.auto_pad == "VALID":
            return [0] * n, [0] * n
        pads = [int(v) for v in ctx.attr("pads", [0] * 2 * n)]
        return pads[:n], pads[n:]

    def full_size(self, ctx: RuleContext, size: DimVector) -> DimVector:
        """``(size - 1) * s + ext``: the spatial sizes a ConvTranspose of ``size`` writes before its pads."""
        stepped = dims.combine(ctx, "Mul", dims.combine(ctx, "Sub", size, [1] * self.n), self.strides)
        return dims.combine(ctx, "Add", stepped, self.extent(ctx))


def window(ctx: RuleContext, t: str, geo: WindowGeometry, begin: DimVector, length: DimVector) -> str:
    """``out[.., j] = t[.., j + begin]`` for ``0 <= j < length`` on the spatial axes, zero outside ``t``."""
    n = geo.n
    have = dims.dims_of(ctx, t, 2, rank=geo.rank)
    zeros = [0] * n
    lead = dims.combine(ctx, "Max", dims.combine(ctx, "Sub", zeros, begin), zeros)  # zeros to add at the start
    start = dims.combine(ctx, "Max", begin, zeros)
    beyond = dims.combine(ctx, "Sub", dims.combine(ctx, "Add", start, length), dims.combine(ctx, "Add", have, lead))
    tail = dims.combine(ctx, "Max", beyond, zeros)
    if not (dims.all_known(lead, tail) and not any(lead) and not any(tail)):  # type: ignore[arg-type]
        t = ctx.op("Pad", t, dims.as_vector(ctx, dims.concat_dims(ctx, [0, 0], lead, [0, 0], tail)))
        have = dims.combine(ctx, "Add", dims.combine(ctx, "Add", have, lead), tail)
    end = dims.combine(ctx, "Add", start, length)
    if dims.all_known(start, end, have) and not any(start) and end == have:  # type: ignore[arg-type]
        return t
    return ctx.op("Slice", t, dims.as_vector(ctx, start), dims.as_vector(ctx, end), ctx.int64s(geo.axes))


def framed(ctx: RuleContext, t: str, geo: WindowGeometry, lead: DimVector, length: DimVector) -> tuple[str, list[int]]:
    """``t`` after ``lead`` zeros, cut or zero-filled to ``length``: as ``(tensor, Conv pads)``.

    With known sizes the zeros are the Conv's pads (and ``t`` is cut with Slice
    where too long); otherwise the frame is made with Pad/Slice and the pads are 0.
    """
    n = geo.n
    have = dims.dims_of(ctx, t, 2, rank=geo.rank)
    if dims.all_known(lead, length, have):
        tail = [L - h - p for L, h, p in zip(length, have, lead, strict=True)]  # type: ignore[arg-type]
        if any(v < 0 for v in tail):
            ends = [h + min(v, 0) for h, v in zip(have, tail, strict=True)]  # type: ignore[arg-type]
            t = ctx.op("Slice", t, ctx.int64s([0] * n), ctx.int64s(ends), ctx.int64s(geo.axes))
        return t, list(lead) + [max(v, 0) for v in tail]  # type: ignore[arg-type]
    return window(ctx, t, geo, dims.combine(ctx, "Sub", [0] * n, lead), length), [0] * 2 * n


def transposed_conv_to(
    ctx: RuleContext,
    t: str,
    w: str,
    geo: WindowGeometry,
    group: int,
    lead: DimVector,
    size: DimVector,
    out: DimVector,
    tail: DimVector | None = None,
) -> str:
    """``ConvTranspose(t, w)`` (strides, dilations and group of ``geo``) without its first ``lead``
    positions, cut or zero-filled to ``size``; ``out`` are the spatial sizes of ``t``.

    ``tail``: the forward's pads at the end. With strides of 1 the forward's
    output is ``size + lead + tail - d (K - 1)``, so the ConvTranspose with
    pads ``lead`` and ``tail`` writes exactly ``size``, whether or not the
    sizes are known while building (else a ``Slice`` or ``Pad`` computed at run
    time copies the result).
    """
    attrs: dict[str, Any] = {"strides": geo.strides, "dilations": geo.dilations}
    if group != 1:
        attrs["group"] = group
    unit = all(s == 1 for s in geo.strides)
    if unit and tail is not None and dims.all_known(lead, tail) and min([*lead, *tail], default=0) >= 0:  # type: ignore[misc]
        return ctx.op("ConvTranspose", t, w, **attrs, pads=[*lead, *tail])  # type: ignore[misc]
    full = geo.full_size(ctx, out)
    if dims.all_known(full, lead, size):
        tail = [f - b - s for f, b, s in zip(full, lead, size, strict=True)]  # type: ignore[arg-type]
        attrs["pads"] = list(lead) + [max(v, 0) for v in tail]  # type: ignore[arg-type]
        if any(v < 0 for v in tail):
            attrs["output_padding"] = [max(-v, 0) for v in tail]
        return ctx.op("ConvTranspose", t, w, **attrs)
    return window(ctx, ctx.op("ConvTranspose", t, w, **attrs), geo, lead, size)
