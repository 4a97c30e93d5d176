"""Normalizations: Batch, Layer, Instance, Group, RMS, Lp and mean-variance normalization, and LRN.

Notation: ``x`` is the input (``[N, C, *S]`` for the per-channel ones), ``y``
the output, ``g`` its gradient, ``xhat`` the standardized ``x`` and ``inv`` its
inverse standard deviation. ``bc(v)`` reshapes a per-channel vector ``[C]`` to
``[C, 1, ..., 1]`` so that it broadcasts against ``x``.

The standardizing ones share ``d/dx [(x - mean) * inv] = inv * (gh - mean(gh)
- xhat * mean(gh * xhat))``, ``gh`` the gradient with respect to ``xhat``
(:func:`~onnxtrain.autodiff.rules.backward_helpers.standardize_grad`). They
recompute their statistics in the input's element type, except
LayerNormalization, which reuses its Mean and InvStdDev outputs when they have
that type (they are float32 by default, also for a double input; declared on
the forward node with ``ctx.ensure_output`` when the model omitted them). The
running mean and variance outputs of training-mode BatchNormalization are
state updates: they carry no gradient.
"""

from __future__ import annotations

import math

from onnx import TensorProto

from onnxtrain.autodiff import dims
from onnxtrain.autodiff.broadcast import unbroadcast
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.registry import Grads, Result
from onnxtrain.autodiff.rules._builtin import registry
from onnxtrain.autodiff.rules.backward_helpers import (
    reduce_over,
    rms_scale,
    rms_scale_grad,
    standardize,
    standardize_grad,
)


def _per_channel(ctx: RuleContext, v: str, rank: int) -> str:
    """``bc(v)``: a per-channel vector ``[C]`` as ``[C, 1, ..., 1]``, broadcasting against ``[N, C, *S]``."""
    return v if rank <= 2 else ctx.op("Unsqueeze", v, ctx.int64s(range(1, rank - 1)))


def _batch_norm_training(ctx: RuleContext) -> bool:
    if ctx.opset >= 14:
        return bool(ctx.attr("training_mode", 0))
    return sum(1 for name in ctx.outputs if name) > 1  # before 14: the optional outputs switch it on


def _batch_norm_training_grads(
    ctx: RuleContext, g: str, x: str, scale: str, axes: list[int], eps: float
) -> tuple[str | None, str | None]:
    """Training-mode BatchNormalization's ``dx`` and ``dscale`` (``None`` where not needed), as a per-channel
    affine function of ``g`` and ``xc = x - mean(x)``:

    ``dx = a (g - mean(g)) - b xc``, ``a = scale inv``, ``b = a inv^2 mean(g xc)``; ``dscale = inv sum(g xc)``
    (``inv = 1 / sqrt(mean(xc^2) + eps)``; ``scale`` per channel, broadcasting). Seven passes over a tensor of
    ``x``'s size where ``inv (gh - mean(gh) - xhat mean(gh xhat))`` took ten: the backward of every BatchNorm of
    a CNN, whose element-wise nodes onnxruntime does not fuse.
    """
    if not (ctx.needs(0) or ctx.needs(1)):
        return None, None
    centered = ctx.sub(x, reduce_over(ctx, "ReduceMean", x, axes))
    inv = ctx.op("Reciprocal", ctx.op("Sqrt", ctx.add(reduce_over(ctx, "ReduceMean", ctx.square(centered), axes), eps)))
    products = ctx.mul(g, centered)
    dx = dscale = None
    if ctx.needs(0):
        a = ctx.mul(scale, inv)
        b = ctx.mul(a, ctx.mul(ctx.square(inv), reduce_over(ctx, "ReduceMean", products, axes)))
        dx = ctx.sub(ctx.mul(ctx.sub(g, reduce_over(ctx, "ReduceMean", g, axes)), a), ctx.mul(centered, b))
    if ctx.needs(1):
        per_channel = ctx.op("Reshape", inv, ctx.int64s([-1]))
        dscale = ctx.mul(ctx.op("ReduceSum", products, ctx.int64s(axes), keepdims=0), per_channel)
    return dx, dscale


@registry.rule("BatchNormalization", inputs=(0, 1, 2, 3, 4))
def batch_norm(ctx: RuleContext, grads: Grads) -> Result:
    """dx = bc(scale * inv) g (inference) or a (g - mean(g)) - b xc, a = scale inv, b = a inv^2 mean(g xc) (training)"""
    # Statistics over all axes but 1. Inference: inv = 1 / sqrt(var + eps) of the running
    # variance, and dmean = -sum(g) * scale * inv, dvar = -sum(g * xhat) * scale * inv**2 / 2.
    # Training: batch statistics, which the running ones do not enter; xc = x - mean(x), the
    # same as bc(scale) * inv * (g - mean(g) - xhat * mean(g * xhat)). dscale = sum(g * xhat),
    # dB = sum(g). The running mean and variance outputs carry no gradient.
    g = grads[0]
    if g is None:
        return [None] * len(ctx.inputs)
    x, scale, bias, mean, var = ctx.inputs
    rank = ctx.known_rank(x)
    axes = [0, *dims.spatial_axes(rank)]
    eps = ctx.attr("epsilon", 1e-5)
    scale_x = ctx.cast_like(scale, x)
    training = _batch_norm_training(ctx)
    dx = dscale = dbias = dmean = dvar = None
    if training:
        dx, dscale = _batch_norm_training_grads(ctx, g, x, _per_channel(ctx, scale_x, rank), axes, eps)
    else:
        inv_c = ctx.op("Reciprocal", ctx.op("Sqrt", ctx.add(ctx.cast_like(var, x), eps)))
        if ctx.needs(0):
            dx = ctx.mul(g, _per_channel(ctx, ctx.mul(scale_x, inv_c), rank))
        if ctx.needs(1) or ctx.needs(4):
            xhat = ctx.mul(ctx.sub(x, _per_channel(ctx, ctx.cast_like(mean, x), rank)), _per_channel(ctx, inv_c, rank))
            dscale = ctx.op("ReduceSum", ctx.mul(g, xhat), ctx.int64s(axes), keepdims=0)
    if ctx.needs(2) or (not training and ctx.needs(3)):
        dbias = ctx.op("ReduceSum", g, ctx.int64s(axes), keepdims=0)
    if not training and ctx.needs(3):
        dmean = ctx.cast_like(ctx.neg(ctx.mul(dbias, ctx.mul(scale_x, inv_c))), mean)  # type: ignore[arg-type]
    if not training and ctx.needs(4):
        half = ctx.mul(ctx.mul(scale_x, ctx.square(inv_c)), -0.5)
        dvar = ctx.cast_like(ctx.mul(dscale, half), var)  # type: ignore[arg-type]
    return [
        dx,
        ctx.cast_like(dscale, scale) if dscale and ctx.needs(1) else None,
        ctx.cast_like(dbias, bias) if dbias and ctx.needs(2) else None,
        dmean,
        dvar,
    ]


@registry.rule("LayerNormalization", opsets=(17, None), inputs=(0, 1, 2))
def layer_norm(ctx: RuleContext, grads: Grads) -> Result:
    """dx = inv * (gh - mean(gh) - xhat * mean(gh * xhat)), gh = g * scale; dscale = sum(g * xhat), dB = sum(g)"""
    # Over the axes from `axis` on. Gradients reaching the Mean and InvStdDev outputs add
    # g_mean / n and -g_inv * inv**2 * xhat / n (n: the normalized size).
    x, scale = ctx.inputs[:2]
    y = ctx.outputs[0]
    rank = ctx.known_rank(x)
    axis = ctx.attr("axis", -1)
    axes = list(range(axis % rank, rank))
    g, g_mean, g_inv = [*grads, None, None][:3]
    if ctx.attr("stash_type", TensorProto.FLOAT) == ctx.elem_type(x):
        # the statistics the forward pass computed anyway, in x's element type
        inv = ctx.ensure_output(2, "inv_std_dev")
        xhat = ctx.mul(ctx.sub(x, ctx.ensure_output(1, "mean")), inv)
    else:
        xhat, inv = standardize(ctx, x, axes, ctx.attr("epsilon", 1e-5))
    dx = None
    if ctx.needs(0):
        terms = []
        if g is not None:
            terms.append(standardize_grad(ctx, ctx.mul(g, scale), xhat, inv, axes))
        if g_mean is not None or g_inv is not None:
            size = dims.dims_of(ctx, x, axes[0]) if axes else []
            if isinstance(size, list):
                n_inv: str | float = 1.0 / math.prod(size)
            else:
                n_inv = ctx.div(ctx.cast_like(ctx.op("Size", inv), x), ctx.cast_like(ctx.op("Size", x), x))
            if g_inv is not None:
                coefficient = ctx.mul(ctx.cast_like(g_inv, x), ctx.square(inv))
                terms.append(ctx.neg(ctx.mul(ctx.mul(coefficient, xhat), n_inv)))
            if g_mean is not None:
                term = ctx.mul(ctx.cast_like(g_mean, x), n_inv)
                terms.append(term if terms else ctx.expand_to(term, x))
        dx = terms[0] if len(terms) == 1 else ctx.op("Sum", *terms)
    dscale = unbroadcast(ctx, ctx.mul(g, xhat), scale, shaped_like=y) if g and ctx.needs(1) else None
    dbias = unbroadcast(ctx, g, ctx.inputs[2], shaped_like=y) if g and ctx.needs(2) else None
    return [dx, dscale, dbias][: len(ctx.inputs)]


@registry.rule("InstanceNormalization", inputs=(0, 1, 2))
def instance_norm(ctx: RuleContext, grads: Grads) -> Result:
    """dx = inv * (gh - mean(gh) - xhat * mean(gh xhat)) over S, gh = g bc(scale); dscale = sum(g xhat), dB = sum(g)"""
    (g,) = grads
    x, scale, _ = ctx.inputs
    rank = ctx.known_rank(x)
    spatial = dims.spatial_axes(rank)
    xhat, inv = standardize(ctx, x, spatial, ctx.attr("epsilon", 1e-5))
    dx = None
    if ctx.needs(0):
        dx = standardize_grad(ctx, ctx.mul(g, _per_channel(ctx, scale, rank)), xhat, inv, spatial)
    axes = ctx.int64s([0, *spatial])
    dscale = ctx.op("ReduceSum", ctx.mul(g, xhat), axes, keepdims=0) if ctx.needs(1) else None
    dbias = ctx.op("ReduceSum", g, axes, keepdims=0) if ctx.needs(2) else None
    return [dx, dscale, dbias]


@registry.rule("GroupNormalization", opsets=(18, None), inputs=(0, 1, 2))
def group_norm(ctx: RuleContext, grads: Grads) -> Result:
    """dx = inv * (gh - mean(gh) - xhat * mean(gh xhat)) per group, gh = g * scale; dscale = sum(g xhat), dB = sum(g)"""
    # x is viewed as [N, G, C / G * prod(S)]. Opset 18 has one scale and bias per group,
    # opset 21 one per channel.
    (g,) = grads
    x, scale, _ = ctx.inputs
    rank = ctx.known_rank(x)
    groups = int(ctx.attr("num_groups"))
    grouped_shape = ctx.int64s([0, groups, -1])
    x_shape = ctx.shape_of(x)
    xhat, inv = standardize(ctx, ctx.op("Reshape", x, grouped_shape), [2], ctx.attr("epsilon", 1e-5))
    g_grouped = ctx.op("Reshape", g, grouped_shape)
    per_channel = ctx.opset >= 21
    if per_channel:
        gh = ctx.op("Reshape", ctx.mul(g, _per_channel(ctx, scale, rank)), grouped_shape)
        g_sum, xhat_sum, axes = g, ctx.op("Reshape", xhat, x_shape), [0, *dims.spatial_axes(rank)]
    else:
        gh = ctx.mul(g_grouped, ctx.op("Unsqueeze", scale, ctx.int64s([1])))
        g_sum, xhat_sum, axes = g_grouped, xhat, [0, 2]
    dx = None
    if ctx.needs(0):
        dx = ctx.op("Reshape", standardize_grad(ctx, gh, xhat, inv, [2]), x_shape)
    dscale = ctx.op("ReduceSum", ctx.mul(g_sum, xhat_sum), ctx.int64s(axes), keepdims=0) if ctx.needs(1) else None
    dbias = ctx.op("ReduceSum", g_sum, ctx.int64s(axes), keepdims=0) if ctx.needs(2) else None
    return [dx, dscale, dbias]


@registry.rule("RMSNormalization", opsets=(23, None), inputs=(0, 1))
def rms_normalization(ctx: RuleContext, grads: Grads) -> Result:
    """dx = r (gh - xh mean(gh xh)), gh = g scale, xh = x r, r = 1 / sqrt(mean(x^2) + eps); dscale = sum(g xh)"""
    # Over the axes from `axis` on, in x's element type whatever stash_type says.
    (g,) = grads
    x, scale = ctx.inputs[:2]
    rank = ctx.known_rank(x)
    axes = list(range(int(ctx.attr("axis", -1)) % rank, rank))
    xh, r = rms_scale(ctx, x, axes, float(ctx.attr("epsilon", 1e-5)))
    dx = dscale = None
    if ctx.needs(0):
        dx = rms_scale_grad(ctx, ctx.mul(g, scale), xh, r, axes)  # type: ignore[arg-type]
    if ctx.needs(1):
        dscale = unbroadcast(ctx, ctx.mul(g, xh), scale, shaped_like=ctx.outputs[0])  # type: ignore[arg-type]
    return [dx, dscale]


@registry.rule("LpNormalization", inputs=(0,))
def lp_normalization(ctx: RuleContext, grads: Grads) -> Result:
    """p = 2: dx = (g - y * sum(g * y)) / |x|_2; p = 1: dx = (g - sign(x) * sum(g * y)) / |x|_1"""
    (g,) = grads
    x, y = ctx.inputs[0], ctx.outputs[0]
    axis = ctx.int64s([ctx.attr("axis", -1)])
    p = ctx.attr("p", 2)
    if p == 2:
        norm, direction = ctx.op("Sqrt", ctx.op("ReduceSum", ctx.square(x), axis, keepdims=1)), y
    elif p == 1:
        norm, direction = ctx.op("ReduceSum", ctx.op("Abs", x), axis, keepdims=1), ctx.op("Sign", x)
    else:
        raise ValueError(f"LpNormalization node {ctx.node.name!r} has p={p}; ONNX allows only p=1 or p=2")
    dot = ctx.op("ReduceSum", ctx.mul(g, y), axis, keepdims=1)
    return [ctx.div(ctx.sub(g, ctx.mul(direction, dot)), norm)]


@registry.rule("MeanVarianceNormalization", inputs=(0,))
def mean_variance_normalization(ctx: RuleContext, grads: Grads) -> Result:
    """dx = (g - mean(g)) / (s + eps) - y * mean(g * y) / s, s = std(x) over axes, eps = 1e-9"""
    # y = (x - mean) / (s + eps) with onnx's eps = 1e-9 added to the standard deviation
    (g,) = grads
    x, y = ctx.inputs[0], ctx.outputs[0]
    axes = [int(a) for a in ctx.attr("axes", [0, 2, 3])]
    centered = ctx.sub(x, reduce_over(ctx, "ReduceMean", x, axes))
    std = ctx.op("Sqrt", reduce_over(ctx, "ReduceMean", ctx.square(centered), axes))
    first = ctx.div(ctx.sub(g, reduce_over(ctx, "ReduceMean", g, axes)), ctx.add(std, 1e-9))  # type: ignore[arg-type]
    second = ctx.div(ctx.mul(y, reduce_over(ctx, "ReduceMean", ctx.mul(g, y), axes)), std)  # type: ignore[arg-type]
    return [ctx.sub(first, second)]


def _channel_window_sum(ctx: RuleContext, t: str, x: str, size: int, before: int, after: int) -> str:
    """``out[:, c] = sum(t[:, c - before : c + after + 1])`` over channels (zeros outside), as a Conv of ones."""
    channels = dims.dims_of(ctx, x, 1, 2)
    grouped = ctx.op("Reshape", t, dims.as_vector(ctx, dims.concat_dims(ctx, [0, 1], channels, [-1])))  # [N, 1, C, S]
    ones = dims.ones(ctx, [1, 1, size, 1], t)
    summed = ctx.op("Conv", grouped, ones, pads=[before, 0, after, 0])
    return ctx.op("Reshape", summed, ctx.shape_of(x))


@registry.rule("LRN", inputs=(0,))
def lrn(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g * d^-beta - 2 alpha beta / size * x * wsum^T(g * y / d), d = bias + alpha / size * wsum(x^2)"""
    # wsum sums over the channels [c - floor((size-1)/2), c + ceil((size-1)/2)]; its
    # transpose wsum^T over the mirrored window.
    (g,) = grads
    x, y = ctx.inputs[0], ctx.outputs[0]
    size = int(ctx.attr("size"))
    alpha, beta, bias = float(ctx.attr("alpha", 1e-4)), float(ctx.attr("beta", 0.75)), float(ctx.attr("bias", 1.0))
    before, after = (size - 1) // 2, size // 2
    d = ctx.add(ctx.mul(_channel_window_sum(ctx, ctx.square(x), x, size, before, after), alpha / size), bias)
    direct = ctx.mul(g, ctx.op("Pow", d, ctx.const(-beta, x)))  # type: ignore[arg-type]
    spread = _channel_window_sum(ctx, ctx.div(ctx.mul(g, y), d), x, size, after, before)  # type: ignore[arg-type]
    return [ctx.sub(direct, ctx.mul(ctx.mul(x, spread), 2 * alpha * beta / size))]
