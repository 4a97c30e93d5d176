"""Pooling: MaxPool, AveragePool, LpPool, their global forms, and MaxUnpool.

Notation: ``x`` is the input ``[N, C, *S]``, ``y`` the output with spatial
sizes ``O``, ``g`` its gradient, ``K`` the kernel (see
:class:`~onnxtrain.autodiff.rules.backward_helpers.WindowGeometry` for strides,
dilations and pads).

The windows' gradients are spread back with convolutions: AveragePool's and
LpPool's are a ConvTranspose of one channel with a kernel of ones (channels
moved to the batch), cut to the padded input where it reaches past it
(:func:`_spread`). MaxPool reuses its argmax indices output (declared on the
forward node with ``ctx.ensure_output`` when the model omitted it) and adds
``g`` into zeros there with ScatterElements.
"""

from __future__ import annotations

import itertools
import math

from onnx import TensorProto

from onnxtrain.autodiff import dims
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.dims import DimVector
from onnxtrain.autodiff.registry import Grads, Result
from onnxtrain.autodiff.rules._builtin import registry
from onnxtrain.autodiff.rules.backward_helpers import (
    WindowGeometry,
    forward_attributes,
    framed,
    scatter_add_into,
    transposed_conv_to,
)
from onnxtrain.graph import ops


@registry.rule("MaxPool", inputs=(0,))
def max_pool(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g added into zeros at the forward pass's argmax (its Indices output), ScatterElements"""
    (g,) = grads[:1]
    x = ctx.inputs[0]
    if g is None:
        return [None]
    if ctx.attr("storage_order", 0) == 0:
        indices = ctx.ensure_output(1, "maxpool_indices")
    else:  # column-major indices: compute row-major ones
        attributes = forward_attributes(ctx, ("storage_order",))
        indices = ctx.builder.add_node("MaxPool", [x], 2, hint="maxpool_grad", **attributes)[1]
    zeros = ctx.flat_zeros_like(x, after=g)
    flat = ctx.int64s([-1])
    if ops.scatter_can_add(ctx.opset):
        dx = scatter_add_into(ctx, zeros, indices, g, flat, axis=0)
    else:
        # No reduction before opset 16: split the windows into classes of pairwise
        # disjoint ones (output positions congruent modulo ceil(ext / s)) and add up
        # one plain scatter per class.
        geo = WindowGeometry(ctx, x, [int(v) for v in ctx.attr("kernel_shape")])
        steps = [-(-e // s) for e, s in zip(geo.extent(ctx), geo.strides, strict=True)]  # type: ignore[arg-type]
        parts = []
        for start in itertools.product(*(range(m) for m in steps)):
            g_k, i_k = g, indices
            if any(m > 1 for m in steps):
                where = (
                    ctx.int64s(start),
                    ctx.int64s([dims.INT64_MAX] * geo.n),
                    ctx.int64s(geo.axes),
                    ctx.int64s(steps),
                )
                g_k, i_k = ctx.op("Slice", g, *where), ctx.op("Slice", indices, *where)
            parts.append(
                ctx.op("ScatterElements", zeros, ctx.op("Reshape", i_k, flat), ctx.op("Reshape", g_k, flat), axis=0)
            )
        dx = parts[0] if len(parts) == 1 else ctx.op("Sum", *parts)
    return [ctx.op("Reshape", dx, ctx.shape_of(x))]


@registry.rule("AveragePool", inputs=(0,))
def average_pool(ctx: RuleContext, grads: Grads) -> Result:
    """dx = ConvTranspose(g * v, ones), v = 1 / divisor = AveragePool(1) / SumPool(1) (1 / prod(K) when constant)"""
    (g,) = grads
    x, y = ctx.inputs[0], ctx.outputs[0]
    kernel = [int(v) for v in ctx.attr("kernel_shape")]
    geo = WindowGeometry(ctx, x, kernel)
    n = geo.n
    lead, tail = geo.forward_pads(ctx, x, y)
    size, out = dims.dims_of(ctx, x, 2), dims.dims_of(ctx, y, 2, rank=geo.rank)
    ceil = bool(ctx.attr("ceil_mode", 0))
    include_pad = bool(ctx.attr("count_include_pad", 0))
    if include_pad and not ceil:
        scaled = ctx.mul(g, 1.0 / math.prod(kernel))
    else:
        one = dims.fill_value(ctx, x, 1)
        ones = ctx.op("ConstantOfShape", dims.as_vector(ctx, dims.concat_dims(ctx, [1, 1], size)), value=one)
        # ceil_mode's last window may reach past the pads: more zeros at the end, cut below
        more = [s - 1 if ceil else 0 for s in geo.strides]
        padded = dims.combine(ctx, "Add", dims.combine(ctx, "Add", dims.combine(ctx, "Add", size, lead), tail), more)
        framed_ones, pads = framed(ctx, ones, geo, lead, padded)
        # the real (not padding) elements of each window
        ones_kernel = dims.ones(ctx, [1, 1, *kernel], x)
        count = ctx.op("Conv", framed_ones, ones_kernel, strides=geo.strides, dilations=geo.dilations, pads=pads)
        if ceil:
            count = ctx.op("Slice", count, ctx.int64s([0] * n), dims.as_vector(ctx, out), ctx.int64s(geo.axes))
        if include_pad:
            weight = ctx.div(ctx.op("AveragePool", ones, **forward_attributes(ctx)), count)
        else:
            weight = ctx.op("Reciprocal", count)
        scaled = ctx.mul(g, weight)
    return [_spread(ctx, scaled, x, geo, lead, tail, size, out)]


def _spread(
    ctx: RuleContext,
    t: str,
    x: str,
    geo: WindowGeometry,
    lead: DimVector,
    tail: DimVector,
    size: DimVector,
    out: DimVector,
) -> str:
    """``dx[i] = sum of t[o] over the windows o that read x[i]``: ``t`` as ``[N C, 1, *O]`` (channels as batch)
    through one ConvTranspose with a kernel of ones, cut to ``x``.

    A window reads the padded input ``[0, P)``, ``P = lead + size + tail``,
    at ``o s + d k``; the positions past ``P`` read nothing, so where every
    size is known the kernel is cut to the ``ceil(P / d)`` positions that
    can reach ``x``, the same sums. A pool over the whole input written as
    a kernel larger than it (transformers' EfficientNet pools its 3 x 3 map
    with a 640 x 640 kernel and ``ceil_mode``) otherwise spreads each value
    over the whole kernel: 2.3 s of a step on 2 cores, for 9 values.
    """
    kernel = geo.kernel
    if isinstance(kernel, list) and dims.all_known(lead, tail, size):
        padded = [int(b) + int(s) + int(e) for b, s, e in zip(lead, size, tail, strict=True)]  # type: ignore[arg-type]
        reach = [min(int(k), -(-p // d)) for k, p, d in zip(kernel, padded, geo.dilations, strict=True)]
        if reach != kernel:
            kernel, geo = reach, WindowGeometry(ctx, x, reach)
    flat = ctx.op("Reshape", t, ctx.int64s([-1, 1] + [0] * geo.n))
    spread = transposed_conv_to(ctx, flat, dims.ones(ctx, [1, 1, *kernel], x), geo, 1, lead, size, out, tail)
    return ctx.op("Reshape", spread, ctx.shape_of(x))


@registry.rule("GlobalAveragePool", inputs=(0,))
def global_average_pool(ctx: RuleContext, grads: Grads) -> Result:
    """dx = expand(g) / prod(S)"""
    x, y = ctx.inputs[0], ctx.outputs[0]
    size = dims.dims_of(ctx, x, 2)
    if isinstance(size, list):
        scale: str | float = 1.0 / math.prod(size)
    else:
        scale = ctx.div(ctx.cast_like(ctx.op("Size", y), x), ctx.cast_like(ctx.op("Size", x), x))
    return [ctx.expand_to(ctx.mul(grads[0], scale), x)]  # type: ignore[arg-type]


@registry.rule("GlobalMaxPool", inputs=(0,))
def global_max_pool(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g * m / sum(m, S), m = [x == y]  (ties share g evenly)"""
    x = ctx.inputs[0]
    mask = ctx.cast_like(ctx.compare("Equal", x, ctx.outputs[0]), x)
    count = ctx.op("ReduceSum", mask, ctx.int64s(dims.spatial_axes(ctx.known_rank(x))), keepdims=1)
    return [ctx.mul(mask, ctx.div(grads[0], count))]  # type: ignore[arg-type]


# -------------------------------------------------------------------- Lp pooling


def _lp_order(ctx: RuleContext) -> float:
    p = float(ctx.attr("p", 2))
    if p < 1:
        raise ValueError(f"{ctx.node.op_type} node {ctx.node.name!r} has p={p}; the gradient needs p >= 1")
    return p


def _lp_scaled(ctx: RuleContext, g: str, y: str, p: float) -> str:
    """``g / y^(p - 1)``"""
    if p == 1:
        return g
    return ctx.div(g, y if p == 2 else ctx.op("Pow", y, ctx.const(p - 1, y)))


def _lp_direction(ctx: RuleContext, x: str, p: float) -> str:
    """``d|x|^p / dx / p = sign(x) |x|^(p - 1)``"""
    if p == 1:
        return ctx.op("Sign", x)
    if p == 2:
        return x
    return ctx.mul(ctx.op("Sign", x), ctx.op("Pow", ctx.op("Abs", x), ctx.const(p - 1, x)))


@registry.rule("GlobalLpPool", inputs=(0,))
def global_lp_pool(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g * sign(x) |x|^(p-1) / y^(p-1), y = (sum_S |x|^p)^(1/p)"""
    x, y = ctx.inputs[0], ctx.outputs[0]
    p = _lp_order(ctx)
    return [ctx.mul(_lp_direction(ctx, x, p), _lp_scaled(ctx, grads[0], y, p))]  # type: ignore[arg-type]


@registry.rule("LpPool", inputs=(0,))
def lp_pool(ctx: RuleContext, grads: Grads) -> Result:
    """dx = sign(x) |x|^(p-1) * ConvTranspose(g / y^(p-1), ones), y = (sum_window |x|^p)^(1/p)"""
    # The windows' gradients are spread back as AveragePool's are (its pads, dilations,
    # ceil_mode and auto_pad); zero padding adds nothing to the sums.
    (g,) = grads
    x, y = ctx.inputs[0], ctx.outputs[0]
    p = _lp_order(ctx)
    kernel = [int(v) for v in ctx.attr("kernel_shape")]
    geo = WindowGeometry(ctx, x, kernel)
    lead, tail = geo.forward_pads(ctx, x, y)
    size, out = dims.dims_of(ctx, x, 2), dims.dims_of(ctx, y, 2, rank=geo.rank)
    spread = _spread(ctx, _lp_scaled(ctx, g, y, p), x, geo, lead, tail, size, out)  # type: ignore[arg-type]
    return [ctx.mul(spread, _lp_direction(ctx, x, p))]


# -------------------------------------------------------------------- unpooling


registry.linear(
    "MaxUnpool",
    "dx = flatten(g)[I]  (I: the flat indices into the output; assumed distinct, as MaxPool's are)",
    lambda ctx, g: ctx.op("Gather", ctx.op("Reshape", g, ctx.int64s([-1])), ctx.cast(ctx.inputs[1], TensorProto.INT64)),
)
