"""Convolutions: Conv, ConvTranspose and Col2Im, differentiated with convolutions.

Notation: ``x`` is the input ``[N, C, *S]`` (``S`` the spatial sizes), ``w`` the
weight ``[M, C / group, *K]``, ``y`` the output with spatial sizes ``O``, ``g``
its gradient; ``s``, ``d``, ``p`` are strides, dilations and pads (see
:class:`~onnxtrain.autodiff.rules.backward_helpers.WindowGeometry`).

Conv's gradient for ``x`` is a ConvTranspose with the same weights, for ``w`` a
Conv of the batch-transposed input with the batch-transposed output gradient
as kernel (strides and dilations swapped); ConvTranspose's gradients are the
mirror image. onnxruntime runs that Conv as one thin matrix product per input
channel (its output is the kernel's few positions); where the input is small
enough to unfold (:data:`UNFOLD_LIMIT`) and every size is known, Conv's
weight gradient is one product instead: ``dw = g [M, N L] @ U [N L, C K]``,
``U`` the input unfolded into its ``K`` window positions by a Conv grouped
by channel with a one-hot kernel (the input itself for a 1x1 kernel of
stride 1), 1.2-2.4x faster on the 3x3 layers of ResNet-18
(docs/benchmarks.md, "Masks as products"). Where the output has at least
twice as many positions ``L`` as channels ``M``, the product is taken per
sample, ``g_n [M, L] @ U_n^T``, and summed over the batch: no transposed
copy of ``U`` (onnxruntime reads it transposed in its ``MatMul``). A
depthwise Conv of stride 1 (one input channel per group) that keeps its
input's size gets ``dx`` as a Conv of ``g`` with the kernel mirrored
(:func:`_mirrored_input_grad`), which onnxruntime runs 1.3-4.8x faster than
the ConvTranspose on the CPU, and a 1x1 Conv of stride 1 as ``Conv(g, w^T)``
(:func:`_pointwise_input_grad`). Sizes known only at run time (symbolic
spatial dimensions, ``auto_pad=SAME_*``) are computed with Shape/Slice
arithmetic on 1-D int64 tensors; when every size is known while building,
that arithmetic folds into attributes and constants.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from onnxtrain.autodiff import dims
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.dims import DimVector
from onnxtrain.autodiff.registry import Grads, Result
from onnxtrain.autodiff.rules._builtin import registry
from onnxtrain.autodiff.rules.backward_helpers import WindowGeometry, data_only, framed, transposed_conv_to


def _weight_grad(
    ctx: RuleContext,
    a: str,
    pads: list[int],
    b: str,
    geo: WindowGeometry,
    group: int,
    kernel: DimVector,
    fits: bool,
) -> str:
    """``dw[cb, ca, k] = sum_{n, o} a[n, group(cb) * Ca + ca, k * d + o * s] * b[n, cb, o]``, as ``[B, A/G, K]``.

    One Conv of ``a`` as ``[A/G, G * N, L]`` (the batch as channels) with ``b`` as
    ``[B, N, O]`` for weights, strides ``d``, dilations ``s`` and groups ``G``; its
    output is cut to ``kernel`` unless ``fits``.
    """
    rest = list(range(2, geo.rank))
    if group == 1:
        a_t = ctx.op("Transpose", a, perm=[1, 0, *rest])
    else:
        tail = dims.dims_of(ctx, a, 2, rank=geo.rank)
        grouped = ctx.op("Reshape", a, dims.as_vector(ctx, dims.concat_dims(ctx, [0, group, -1], tail)))
        a_t = ctx.op("Transpose", grouped, perm=[2, 1, 0, *range(3, geo.rank + 1)])
        a_t = ctx.op("Reshape", a_t, dims.as_vector(ctx, dims.concat_dims(ctx, [0, -1], tail)))
    b_t = ctx.op("Transpose", b, perm=[1, 0, *rest])
    attrs: dict[str, Any] = {"strides": geo.dilations, "dilations": geo.strides, "pads": pads}
    if group != 1:
        attrs["group"] = group
    dw = ctx.op("Conv", a_t, b_t, **attrs)
    if not fits:
        dw = ctx.op("Slice", dw, ctx.int64s([0] * geo.n), dims.as_vector(ctx, kernel), ctx.int64s(geo.axes))
    return ctx.op("Transpose", dw, perm=[1, 0, *rest])


#: The most elements one sample's unfolded input (``C K L``: channels, kernel positions, output positions) may
#: have for Conv's weight gradient to be one matrix product (:func:`_unfolded_weight_grad`); 16 MiB of float32.
UNFOLD_LIMIT = 1 << 22
#: The most kernel positions (``prod(kernel)``) unfolded: the one-hot Conv costs ``K`` products per value, and
#: with a 5x5 or a 7x7 kernel it was no faster than onnxruntime's Conv.
UNFOLD_POSITIONS = 9


def _unfolded_weight_grad(
    ctx: RuleContext,
    x: str,
    w: str,
    g: str,
    geo: WindowGeometry,
    lead: DimVector,
    tail: DimVector,
    spatial: DimVector,
    out: DimVector,
) -> str | None:
    """Conv's ``dw [M, C, *K]`` as one matrix product of ``g`` ``[M, N L]`` and the unfolded input ``U``
    ``[N L, C K]`` (see the module docstring), or ``None`` where a size is unknown while building, the kernel
    has more than :data:`UNFOLD_POSITIONS` positions, or one sample's ``U`` more than :data:`UNFOLD_LIMIT`
    elements. ``U`` is a Conv of ``x`` as ``[N C, 1, *S]`` with the one-hot kernel ``[K, 1, *kernel]`` (the
    forward's strides, dilations and pads): ``[N C, K, *O]``. ``spatial``, ``out``: ``x``'s and the output's
    spatial sizes, as the rule has them."""
    x_shape, w_shape = ctx.shape(x), ctx.shape(w)
    c = x_shape[1] if x_shape is not None and len(x_shape) == geo.rank else None
    m = w_shape[0] if w_shape else None
    if not (isinstance(c, int) and isinstance(m, int) and dims.all_known(spatial, out, geo.kernel, lead, tail)):
        return None
    assert isinstance(spatial, list) and isinstance(out, list)
    kernel = [int(k) for k in geo.kernel]  # type: ignore[union-attr]
    k, positions = math.prod(kernel), math.prod(out)
    if k > UNFOLD_POSITIONS or c * k * positions > UNFOLD_LIMIT:
        return None
    pads = [*lead, *tail]  # type: ignore[misc]
    if k == 1 and all(s == 1 for s in geo.strides) and not any(pads):
        unfolded = ctx.op("Reshape", x, ctx.int64s([-1, c, positions]))  # a 1x1 kernel reads x as it is
    else:
        # output channel c K + j of a Conv grouped by channel: position j of channel c's windows
        per_channel = np.tile(np.eye(k).reshape([1, k, 1, *kernel]), [c, 1, 1, *[1] * len(kernel)])
        one_hot = ctx.const(per_channel.reshape([c * k, 1, *kernel]), x)
        attrs = {"strides": geo.strides, "dilations": geo.dilations, "pads": pads, "group": c}
        windows = ctx.op("Conv", x, one_hot, **attrs)
        unfolded = ctx.op("Reshape", windows, ctx.int64s([-1, c * k, positions]))  # [N, C K, L]
    rows = ctx.op("Reshape", g, ctx.int64s([-1, m, positions]))  # [N, M, L]
    if positions >= 2 * m:  # one product per sample, summed: no copy of U transposed
        per_sample = ctx.op("MatMul", rows, ctx.op("Transpose", unfolded, perm=[0, 2, 1]))  # [N, M, C K]
        product = ctx.op("ReduceSum", per_sample, ctx.int64s([0]), keepdims=0)
    else:
        columns = ctx.op("Reshape", ctx.op("Transpose", unfolded, perm=[1, 0, 2]), ctx.int64s([c * k, -1]))
        rows = ctx.op("Reshape", ctx.op("Transpose", rows, perm=[1, 0, 2]), ctx.int64s([m, -1]))  # [M, N L]
        product = ctx.op("Gemm", rows, columns, transB=1)  # [M, C K]
    return ctx.op("Reshape", product, ctx.int64s([m, c, *kernel]))


#: The least int64: a ``Slice``'s end that, with step -1, reaches past the first element.
_BEFORE_FIRST = -(2**63)


def _mirrored_input_grad(
    ctx: RuleContext, g: str, w: str, geo: WindowGeometry, group: int, lead: DimVector, tail: DimVector
) -> str | None:
    """A depthwise Conv's ``dx`` as ``Conv(g, w')``, or ``None`` where the Conv is not depthwise (``w`` of one
    input channel per group), has a stride other than 1, pads that do not add up to the kernel's reach
    ``r = d (K - 1)`` on each axis (a Conv that keeps the input's size), or pads or a kernel known only at run
    time.

    With stride 1, ``y[c, o] = sum_k x[c, o - p + d k] w[c, k]`` gives
    ``dx[c, i] = sum_k g[c, i + p - d k] w[c, k]``: a Conv of ``g`` by the
    kernel mirrored on its spatial axes, pads ``r - p`` on each side, the
    same dilations and groups, whose output has ``x``'s size. With a channel
    multiplier ``u`` (``M = C u``), ``w'`` is ``w`` read as ``[C, u, *K]``.

    Only for a Conv that keeps its input's size (pads ``p`` and ``r - p``),
    whose mirror has the same pads swapped: in a training step onnxruntime
    ran the mirror of an unpadded depthwise Conv (pads ``r`` on each side) 6x
    slower than the ConvTranspose (8.2 against 1.3 ms for ``[16, 96, 24, 24]``,
    2 cores). A ``Pad`` of zeros before the Conv is folded into its pads first
    (:mod:`~onnxtrain.graph.passes.pad_fusion`), so TensorFlow-style padding
    takes this path.
    """
    w_shape = ctx.shape(w)
    if group == 1 or not w_shape or len(w_shape) != geo.rank or w_shape[1] != 1:
        return None
    if any(s != 1 for s in geo.strides) or not dims.all_known(lead, tail, geo.kernel):
        return None
    reach = [d * (int(k) - 1) for d, k in zip(geo.dilations, geo.kernel, strict=True)]  # type: ignore[union-attr, arg-type]
    if [int(b) + int(e) for b, e in zip(lead, tail, strict=True)] != reach:  # type: ignore[arg-type]
        return None
    pads = [int(p) for p in [*tail, *lead]]  # type: ignore[misc]  # r - lead = tail, r - tail = lead
    kernel = w
    if w_shape[0] != group:  # a channel multiplier (or a count known only at run time): [C, u, *K]
        kernel = ctx.op("Reshape", w, ctx.int64s([group, -1, *[int(k) for k in geo.kernel]]))  # type: ignore[union-attr]
    n = geo.n
    mirrored = ctx.op(
        "Slice", kernel, ctx.int64s([-1] * n), ctx.int64s([_BEFORE_FIRST] * n), ctx.int64s(geo.axes),
        ctx.int64s([-1] * n),
    )  # fmt: skip
    return ctx.op("Conv", g, mirrored, dilations=geo.dilations, pads=pads, group=group)


def _pointwise_input_grad(
    ctx: RuleContext, g: str, w: str, geo: WindowGeometry, group: int, lead: DimVector, tail: DimVector
) -> str | None:
    """A 1x1 Conv's ``dx = Conv(g, w^T)`` (``w`` ``[M, C, 1, ..]`` read as ``[C, M, 1, ..]``), or ``None`` unless
    the kernel is all ones, strides 1, pads 0 and groups 1: ``dx[c, i] = sum_m g[m, i] w[m, c]``. onnxruntime
    runs it 1.2-2.4x faster than the ConvTranspose on the CPU (MobileNetV2's 1x1 layers, 2 cores); for 3x3
    kernels the mirrored Conv was no faster, and they keep the ConvTranspose."""
    if group != 1 or any(s != 1 for s in geo.strides) or not dims.all_known(lead, tail, geo.kernel):
        return None
    if any(int(k) != 1 for k in geo.kernel) or any(int(p) for p in [*lead, *tail]):  # type: ignore[union-attr, misc]
        return None
    return ctx.op("Conv", g, ctx.op("Transpose", w, perm=[1, 0, *geo.axes]))


def _kernel(ctx: RuleContext, w: str) -> DimVector:
    shape = ctx.attr("kernel_shape")
    return [int(v) for v in shape] if shape is not None else dims.dims_of(ctx, w, 2)


def _convolution(ctx: RuleContext) -> tuple[str, str, str, WindowGeometry, int]:
    """``(x, w, y, geometry, group)`` of a Conv or ConvTranspose node."""
    x, w = ctx.inputs[:2]
    geo = WindowGeometry(ctx, x, _kernel(ctx, w), weight=w)
    return x, w, ctx.outputs[0], geo, int(ctx.attr("group", 1))


def _bias_grad(ctx: RuleContext, g: str, rank: int) -> str | None:
    if not (ctx.has_input(2) and ctx.needs(2)):
        return None
    return ctx.op("ReduceSum", g, ctx.int64s([0, *dims.spatial_axes(rank)]), keepdims=0)


@registry.rule("Conv", inputs=(0, 1, 2))
def conv(ctx: RuleContext, grads: Grads) -> Result:
    """dx = ConvTranspose(g, w) or Conv(g, mirrored w or w^T), dw = g @ unfold(x) or Conv(x^T, g^T), db = sum(g)"""
    (g,) = grads
    x, w, y, geo, group = _convolution(ctx)
    lead, tail = geo.forward_pads(ctx, x, y)
    size, out = dims.dims_of(ctx, x, 2), dims.dims_of(ctx, y, 2, rank=geo.rank)
    dx = None
    if ctx.needs(0):
        dx = _pointwise_input_grad(ctx, g, w, geo, group, lead, tail)
        dx = dx if dx is not None else _mirrored_input_grad(ctx, g, w, geo, group, lead, tail)
        dx = dx if dx is not None else transposed_conv_to(ctx, g, w, geo, group, lead, size, out, tail)
    dw = None
    if ctx.needs(1) and group == 1:
        dw = _unfolded_weight_grad(ctx, x, w, g, geo, lead, tail, size, out)
    if ctx.needs(1) and dw is None:
        padded = dims.combine(ctx, "Add", dims.combine(ctx, "Add", size, lead), tail)
        framed_x, pads = framed(ctx, x, geo, lead, padded)
        fits = False
        if dims.all_known(padded, out, geo.kernel):
            sizes = zip(padded, out, geo.strides, geo.dilations, strict=True)  # type: ignore[arg-type]
            fits = [(p - (o - 1) * s - 1) // d + 1 for p, o, s, d in sizes] == geo.kernel
        dw = _weight_grad(ctx, framed_x, pads, g, geo, group, geo.kernel, fits)
    return [dx, dw, _bias_grad(ctx, g, geo.rank)][: len(ctx.inputs)]


@registry.rule("ConvTranspose", inputs=(0, 1, 2))
def conv_transpose(ctx: RuleContext, grads: Grads) -> Result:
    """dx = Conv(g, w), dw = Conv(g^T, x^T) (strides and dilations swapped), db = sum(g); g framed in the full output"""
    (g,) = grads
    x, w, y, geo, group = _convolution(ctx)
    n = geo.n
    extra = [int(v) for v in ctx.attr("output_padding", [0] * n)]
    size, out = dims.dims_of(ctx, x, 2), dims.dims_of(ctx, y, 2, rank=geo.rank)
    full = geo.full_size(ctx, size)
    if ctx.attr("output_shape") is not None or geo.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        total = dims.combine(ctx, "Sub", dims.combine(ctx, "Add", full, extra), out)
        lead, _ = geo.split(ctx, total, head_larger=geo.auto_pad != "SAME_UPPER")
    elif geo.auto_pad == "VALID":
        lead = [0] * n
    else:
        lead = [int(v) for v in ctx.attr("pads", [0] * 2 * n)][:n]
    # y is the full output (length `full`, then output_padding zeros) without its first `lead` positions
    framed_g, pads = framed(ctx, g, geo, lead, full)
    conv_attrs: dict[str, Any] = {"strides": geo.strides, "dilations": geo.dilations, "pads": pads}
    if group != 1:
        conv_attrs["group"] = group
    dx = ctx.op("Conv", framed_g, w, **conv_attrs) if ctx.needs(0) else None
    dw = _weight_grad(ctx, framed_g, pads, x, geo, group, geo.kernel, fits=True) if ctx.needs(1) else None
    return [dx, dw, _bias_grad(ctx, g, geo.rank)][: len(ctx.inputs)]


@registry.rule("Col2Im", opsets=(18, None), inputs=(0,))
def col2im(ctx: RuleContext, grads: Grads) -> Result:
    """dx = Im2Col(g): Conv of g (channels as batch) with a one-hot kernel [K, 1, *block]"""
    # Col2Im adds each column's K = prod(block) entries into the image; its adjoint reads
    # them back: output channel k of the Conv picks the k-th position of every block.
    (g,) = grads
    x, block = ctx.inputs[0], ctx.inputs[2]
    n = ctx.known_rank(ctx.outputs[0]) - 2
    shape = ctx.constant_value(block)
    k = None if shape is None else int(np.prod(shape))
    if k is not None and dims.is_small(k, k):  # else EyeLike at run time, as for a computed block shape
        kernel = ctx.const(np.eye(k).reshape([k, 1, *[int(v) for v in shape]]), x)
    else:
        k_vec = ctx.op("ReduceProd", block, ctx.int64s([0]), keepdims=1)
        square = ctx.op("ConstantOfShape", ctx.op("Concat", k_vec, k_vec, axis=0), value=dims.fill_value(ctx, x, 1))
        kernel = ctx.op("Reshape", ctx.op("EyeLike", square), ctx.op("Concat", k_vec, ctx.int64s([1]), block, axis=0))
    attrs = {name: [int(v) for v in ctx.attr(name)] for name in ("dilations", "pads", "strides") if ctx.attr(name)}
    channels_as_batch = ctx.op("Reshape", g, ctx.int64s([-1, 1] + [0] * n))  # type: ignore[arg-type]
    columns = ctx.op("Conv", channels_as_batch, kernel, **attrs)  # [N * C, K, *blocks]
    return data_only(ctx, ctx.op("Reshape", columns, ctx.shape_of(x)))
