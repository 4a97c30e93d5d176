"""Neural-network operators: softmax, loss operators, convolutions, pooling, normalizations, dropout.

Notation: ``x`` is the data input (``[N, C, *S]`` for the spatial operators,
``S`` the spatial sizes), ``y`` the output with spatial sizes ``O``, ``g`` its
gradient; ``s``, ``d``, ``p`` are strides, dilations and pads, ``K`` the kernel
sizes and ``ext = (K - 1) * d + 1`` the extent of a window. ``bc(v)`` reshapes a
per-channel vector ``[C]`` to ``[C, 1, ..., 1]`` so that it broadcasts against ``x``.

Convolutions are differentiated with convolutions: Conv's gradient for ``x`` is
a ConvTranspose with the same weights, for ``w`` a Conv of the batch-transposed
input with the batch-transposed output gradient as kernel (strides and
dilations swapped); ConvTranspose's gradients are the mirror image, and
AveragePool's is a ConvTranspose with a kernel of ones. Sizes known only at run
time (symbolic spatial dimensions, ``auto_pad=SAME_*``) are computed with
Shape/Slice arithmetic on 1-D int64 tensors; when every size is known while
building, that arithmetic folds into attributes and constants.

Normalizations recompute their statistics in the input's element type, except
LayerNormalization, which reuses its Mean and InvStdDev outputs when they have
that type (they are float32 by default, also for a double input). They share
``d/dx [(x - mean) * inv] = inv * (gh - mean(gh) - xhat * mean(gh * xhat))``,
``gh`` the gradient with respect to the standardized ``xhat``.

Rules reuse what the forward pass computes anyway: Dropout its mask, MaxPool
its argmax indices, SoftmaxCrossEntropyLoss its log-probabilities,
LayerNormalization its statistics (declared on the forward node with
``ctx.ensure_output`` when the model omitted them). The running mean and
variance outputs of training-mode BatchNormalization are state updates: they
carry no gradient.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from onnxtrain.autodiff import sized
from onnxtrain.autodiff.broadcast import unbroadcast
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.rules._builtin import REGISTRY as registry
from onnxtrain.autodiff.rules.shape import cubic_slopes, cubic_weights

Grads = Sequence["str | None"]
Result = list["str | None"]

#: A 1-D int64 vector: known while building (a list) or only at run time (a value name).
Ints = list[int] | str

_INT64_MAX = 2**63 - 1
_FOLD: dict[str, Callable[[int, int], int]] = {
    "Add": operator.add,
    "Sub": operator.sub,
    "Mul": operator.mul,
    "Div": operator.floordiv,  # only ever applied to non-negative numbers
    "Max": max,
}


# ------------------------------------------------------------ int64 vector arithmetic


def _vec(ctx: RuleContext, v: Ints) -> str:
    return ctx.int64s(v) if isinstance(v, list) else v


def _iop(ctx: RuleContext, op: str, a: Ints, b: Ints) -> Ints:
    """``op`` (Add, Sub, Mul, Div, Max) of two int vectors, folded when both are known."""
    if isinstance(a, list) and isinstance(b, list):
        return [_FOLD[op](x, y) for x, y in zip(a, b, strict=True)]
    return ctx.op(op, _vec(ctx, a), _vec(ctx, b))


def _cat(ctx: RuleContext, *parts: Ints) -> Ints:
    """The concatenation of int vectors."""
    if all(isinstance(p, list) for p in parts):
        return [v for p in parts for v in p]  # type: ignore[union-attr]
    return ctx.op("Concat", *(_vec(ctx, p) for p in parts), axis=0)


def _dims(ctx: RuleContext, name: str, start: int, stop: int | None = None, rank: int | None = None) -> Ints:
    """Dimensions ``start:stop`` of ``name``: constants when known, else sliced from ``Shape``.

    ``rank``: the rank ``name`` must have; inferred sizes of another rank are not trusted
    (for some ``output_shape`` values, onnx infers ConvTranspose's output with too few axes).
    """
    dims = ctx.shape(name)
    if rank is not None and dims is not None and len(dims) != rank:
        dims = None
    if dims is not None and all(isinstance(d, int) for d in dims[start:stop]):
        return [int(d) for d in dims[start:stop]]  # type: ignore[arg-type]
    end = _INT64_MAX if stop is None else stop
    return ctx.op("Slice", ctx.op("Shape", name), ctx.int64s([start]), ctx.int64s([end]))


def _known(*values: Ints) -> bool:
    return all(isinstance(v, list) for v in values)


# ------------------------------------------------------------------ helpers


def _spatial_axes(rank: int) -> list[int]:
    return list(range(2, rank))


def _reduce(ctx: RuleContext, op: str, v: str, axes: Sequence[int], keepdims: int = 1) -> str:
    """ReduceSum / ReduceMean / ReduceMax over ``axes`` (an input from opset 13 / 18, an attribute before)."""
    if ctx.onnx_opset >= (13 if op == "ReduceSum" else 18):
        return ctx.op(op, v, ctx.int64s(axes), keepdims=keepdims)
    return ctx.op(op, v, axes=list(axes), keepdims=keepdims)


def _bc(ctx: RuleContext, v: str, rank: int) -> str:
    """A per-channel vector ``[C]`` as ``[C, 1, ..., 1]``, broadcasting against ``[N, C, *S]``."""
    return v if rank <= 2 else ctx.op("Unsqueeze", v, ctx.int64s(range(1, rank - 1)))


def _standardize(ctx: RuleContext, x: str, axes: Sequence[int], eps: float) -> tuple[str, str]:
    """``xhat = (x - mean) * inv`` and ``inv = 1 / sqrt(var + eps)`` over ``axes`` (kept as size 1)."""
    xc = ctx.sub(x, _reduce(ctx, "ReduceMean", x, axes))
    inv = ctx.op("Reciprocal", ctx.op("Sqrt", ctx.add(_reduce(ctx, "ReduceMean", ctx.square(xc), axes), eps)))
    return ctx.mul(xc, inv), inv


def _standardize_grad(ctx: RuleContext, gh: str, xhat: str, inv: str, axes: Sequence[int]) -> str:
    """d/dx of ``xhat`` given ``gh = dL/dxhat``: ``inv * (gh - mean(gh) - xhat * mean(gh * xhat))``."""
    centered = ctx.sub(gh, _reduce(ctx, "ReduceMean", gh, axes))
    projected = ctx.mul(xhat, _reduce(ctx, "ReduceMean", ctx.mul(gh, xhat), axes))
    return ctx.mul(inv, ctx.sub(centered, projected))


def _rms_scale(ctx: RuleContext, x: str, axes: Sequence[int], eps: float) -> tuple[str, str]:
    """``xh = x * r`` and ``r = 1 / sqrt(mean(x^2) + eps)`` over ``axes`` (kept as size 1): RMS normalization."""
    r = ctx.op("Reciprocal", ctx.op("Sqrt", ctx.add(_reduce(ctx, "ReduceMean", ctx.square(x), axes), eps)))
    return ctx.mul(x, r), r


def _rms_scale_grad(ctx: RuleContext, gh: str, xh: str, r: str, axes: Sequence[int]) -> str:
    """d/dx of ``xh`` given ``gh = dL/dxh``: ``r * (gh - xh * mean(gh * xh))``."""
    return ctx.mul(r, ctx.sub(gh, ctx.mul(xh, _reduce(ctx, "ReduceMean", ctx.mul(gh, xh), axes))))


def _data_only(ctx: RuleContext, dx: str | None) -> Result:
    return [dx] + [None] * (len(ctx.inputs) - 1)


def _attributes(ctx: RuleContext, drop: Sequence[str] = ()) -> dict[str, Any]:
    """The forward node's attributes, as keyword arguments for ``ctx.op``."""
    return {a.name: helper.get_attribute_value(a) for a in ctx.node.attribute if a.name not in drop}


# ----------------------------------------------------------------------- softmax


@registry.rule("Softmax", opsets=(13, None), inputs=(0,))
def softmax(ctx: RuleContext, grads: Grads) -> Result:
    """dx = y * (g - sum(g * y, axis))"""
    (g,) = grads
    y = ctx.outputs[0]
    dot = ctx.op("ReduceSum", ctx.mul(g, y), ctx.int64s([ctx.attr("axis", -1)]), keepdims=1)
    return [ctx.mul(y, ctx.sub(g, dot))]


@registry.rule("LogSoftmax", opsets=(13, None), inputs=(0,))
def log_softmax(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g - exp(y) * sum(g, axis)"""
    (g,) = grads
    total = ctx.op("ReduceSum", g, ctx.int64s([ctx.attr("axis", -1)]), keepdims=1)
    return [ctx.sub(g, ctx.mul(ctx.op("Exp", ctx.outputs[0]), total))]


# ----------------------------------------------------------------- loss operators


def _nll_grad(ctx: RuleContext, g: str, x: str) -> str:
    """d loss / d x for ``loss_i = -w_i * x[i, t_i]``: ``-onehot(t) * w_i * (g, g_i, or g / sum(w))``.

    ``w_i`` is ``weight[t_i]`` (1 without weights) and 0 where ``t_i == ignore_index``;
    the mean divides by ``sum(w)``.
    """
    rank = ctx.known_rank(x)
    target = ctx.cast(ctx.inputs[1], TensorProto.INT64)
    ignore = ctx.attr("ignore_index")
    ignored = None if ignore is None else ctx.compare("Equal", target, ctx.const(ignore, target))
    w: str | None = None
    if ctx.has_input(2):
        index = target if ignored is None else ctx.where(ignored, ctx.const(0, target), target)  # valid for Gather
        w = ctx.op("Gather", ctx.cast_like(ctx.inputs[2], x), index)
    if ignored is not None:
        w = ctx.where(ignored, ctx.const(0.0, x), w if w is not None else 1.0)
        # no class matches an ignored target: its gradient is 0 even when the mean is 0 / 0 (as in torch)
        target = ctx.where(ignored, ctx.const(-1, target), target)
    reduction = ctx.attr("reduction", "mean")
    size = ctx.static_shape(ctx.inputs[1])
    if reduction != "mean":
        scale = ctx.neg(g)  # the minus sign of the loss
    elif w is None and size is not None:
        scale = ctx.div(g, -float(np.prod(size)))
    else:
        count = ctx.op("ReduceSum", w, keepdims=0) if w is not None else ctx.cast_like(ctx.op("Size", target), x)
        scale = ctx.div(g, ctx.neg(count))
    per_item = reduction == "none" or w is not None  # scale has the target's shape, else it is a scalar
    if w is not None:
        scale = ctx.mul(scale, w)
    if per_item:
        scale = ctx.op("Unsqueeze", scale, ctx.int64s([1]))
    class_shape = [1, -1] + [1] * (rank - 2)
    n_classes = _dims(ctx, x, 1, 2)
    if isinstance(n_classes, list):
        classes = sized.arange(ctx, n_classes[0], target, class_shape)
    else:
        classes = ctx.op("Range", ctx.const(0, target), ctx.op("Squeeze", n_classes), ctx.const(1, target))
        classes = ctx.op("Reshape", classes, ctx.int64s(class_shape))
    onehot = ctx.compare("Equal", _with_class_axis(ctx, target), classes)
    return ctx.where(onehot, scale, 0.0)


@registry.rule("SoftmaxCrossEntropyLoss", opsets=(12, None), inputs=(0,))
def softmax_cross_entropy_loss(ctx: RuleContext, grads: Grads) -> Result:
    """dx = glp - softmax(x) * sum(glp, 1), glp = g_log_prob - onehot(t) * w_t * (g, g_i or g / sum(w))"""
    x = ctx.inputs[0]
    g_loss, g_log_prob = [*grads, None][:2]
    log_prob = ctx.ensure_output(1, "log_prob")
    parts = [p for p in (_nll_grad(ctx, g_loss, x) if g_loss else None, g_log_prob) if p is not None]
    glp = parts[0] if len(parts) == 1 else ctx.add(*parts)
    total = ctx.op("ReduceSum", glp, ctx.int64s([1]), keepdims=1)
    return _data_only(ctx, ctx.sub(glp, ctx.mul(ctx.op("Exp", log_prob), total)))


@registry.rule("NegativeLogLikelihoodLoss", opsets=(12, None), inputs=(0,))
def negative_log_likelihood_loss(ctx: RuleContext, grads: Grads) -> Result:
    """dx = -onehot(t) * w_t * (g, g_i or g / sum(w)), w_t = 0 where t = ignore_index"""
    (g,) = grads
    assert g is not None  # the engine calls a rule only when its output has a gradient
    if _fuse_with_log_softmax(ctx, g):
        return [None] * len(ctx.inputs)
    return _data_only(ctx, _nll_grad(ctx, g, ctx.inputs[0]))


def _fuse_with_log_softmax(ctx: RuleContext, g: str) -> bool:
    """Cross-entropy as LogSoftmax + mean NLL: ``d scores = (softmax(scores) - onehot(t)) * g / N``.

    Taken (and given to the LogSoftmax's input) when the log-probabilities come
    from a LogSoftmax over the class axis that nothing else reads, with no class
    weights and no ignored label: the two rules in one, in four or five nodes
    instead of fifteen.
    """
    log_probs = ctx.inputs[0]
    producer = ctx.producer(log_probs)
    if producer is None or producer.op_type != "LogSoftmax" or producer.domain not in ("", "ai.onnx"):
        return False
    scores, rank = producer.input[0], ctx.rank(log_probs)
    axis = next((helper.get_attribute_value(a) for a in producer.attribute if a.name == "axis"), -1)
    if rank is None or axis % rank != 1 or not ctx.read_only_here(log_probs) or not ctx.depends_on_wrt(scores):
        return False
    if ctx.has_input(2) or ctx.attr("ignore_index") is not None or ctx.attr("reduction", "mean") != "mean":
        return False
    onehot = _onehot(ctx, ctx.inputs[1], log_probs, rank)
    diff = ctx.sub(ctx.op("Exp", log_probs), onehot)
    size = ctx.static_shape(ctx.inputs[1])
    count = ctx.const(float(np.prod(size)), log_probs) if size is not None else ctx.op("ReduceSum", onehot, keepdims=0)
    ctx.contribute(scores, ctx.mul(ctx.div(diff, count), g))
    return True


def _with_class_axis(ctx: RuleContext, target: str) -> str:
    """``target`` with an axis 1 of size 1 inserted: ``Reshape(t, [-1, 1])`` for a 1-D target, else ``Unsqueeze``.

    onnx's shape inference (data propagation) expands a 1-D int64 value element by element through
    ``Unsqueeze`` (about 140 bytes per label), which a static batch of millions makes gigabytes.
    """
    if ctx.rank(target) == 1:
        return ctx.op("Reshape", target, ctx.int64s([-1, 1]))
    return ctx.op("Unsqueeze", target, ctx.int64s([1]))


def _onehot(ctx: RuleContext, target: str, like: str, rank: int) -> str:
    """``onehot(t)`` along axis 1, in ``like``'s element type (rows of out-of-range labels are zero)."""
    depth = _dims(ctx, like, 1, 2)
    if ctx.elem_type(like) in (TensorProto.FLOAT, TensorProto.FLOAT16):  # onnxruntime's OneHot outputs
        labels = ctx.cast(target, TensorProto.INT64)  # and indices it takes
        return ctx.op("OneHot", labels, _vec(ctx, depth), ctx.const([0, 1], like), axis=1)
    class_shape = [1, -1] + [1] * (rank - 2)
    if isinstance(depth, list):
        classes = sized.arange(ctx, depth[0], target, class_shape)
    else:
        classes = ctx.op("Range", ctx.const(0, target), ctx.op("Squeeze", depth), ctx.const(1, target))
        classes = ctx.op("Reshape", classes, ctx.int64s(class_shape))
    matches = ctx.compare("Equal", _with_class_axis(ctx, target), classes)
    return ctx.cast_like(matches, like)


# ------------------------------------------------------------- convolution geometry


class _Geometry:
    """Strides, dilations, kernel and pads of a convolution or pooling node (pads as ``Ints``)."""

    def __init__(self, ctx: RuleContext, x: str, kernel: Ints, weight: str | None = None) -> None:
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
        self.axes = _spatial_axes(self.rank)

    def extent(self, ctx: RuleContext) -> Ints:
        """``(K - 1) * d + 1``: the span of one window."""
        return _iop(
            ctx, "Add", _iop(ctx, "Mul", _iop(ctx, "Sub", self.kernel, [1] * self.n), self.dilations), [1] * self.n
        )

    def split(self, ctx: RuleContext, total: Ints, head_larger: bool) -> tuple[Ints, Ints]:
        """``total`` padding as (begin, end): the odd one at the beginning when ``head_larger``."""
        half = _iop(ctx, "Div", total, [2] * self.n)
        rest = _iop(ctx, "Sub", total, half)
        return (rest, half) if head_larger else (half, rest)

    def forward_pads(self, ctx: RuleContext, x: str, y: str) -> tuple[Ints, Ints]:
        """The pads a Conv or pooling node applied to ``x`` (``auto_pad`` resolved)."""
        n = self.n
        if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            covered = _iop(ctx, "Mul", _iop(ctx, "Sub", _dims(ctx, y, 2, rank=self.rank), [1] * n), self.strides)
            needed = _iop(ctx, "Sub", _iop(ctx, "Add", covered, self.extent(ctx)), _dims(ctx, x, 2))
            return self.split(ctx, _iop(ctx, "Max", needed, [0] * n), self.auto_pad == "SAME_LOWER")
        if self.auto_pad == "VALID":
            return [0] * n, [0] * n
        pads = [int(v) for v in ctx.attr("pads", [0] * 2 * n)]
        return pads[:n], pads[n:]


def _window(ctx: RuleContext, t: str, geo: _Geometry, begin: Ints, length: Ints) -> str:
    """``out[.., j] = t[.., j + begin]`` for ``0 <= j < length`` on the spatial axes, zero outside ``t``."""
    n = geo.n
    have = _dims(ctx, t, 2, rank=geo.rank)
    zeros = [0] * n
    lead = _iop(ctx, "Max", _iop(ctx, "Sub", zeros, begin), zeros)  # zeros to add at the start
    start = _iop(ctx, "Max", begin, zeros)
    tail = _iop(ctx, "Max", _iop(ctx, "Sub", _iop(ctx, "Add", start, length), _iop(ctx, "Add", have, lead)), zeros)
    if not (_known(lead, tail) and not any(lead) and not any(tail)):  # type: ignore[arg-type]
        t = ctx.op("Pad", t, _vec(ctx, _cat(ctx, [0, 0], lead, [0, 0], tail)))
        have = _iop(ctx, "Add", _iop(ctx, "Add", have, lead), tail)
    end = _iop(ctx, "Add", start, length)
    if _known(start, end, have) and not any(start) and end == have:
        return t
    return ctx.op("Slice", t, _vec(ctx, start), _vec(ctx, end), ctx.int64s(geo.axes))


def _framed(ctx: RuleContext, t: str, geo: _Geometry, lead: Ints, length: Ints) -> tuple[str, list[int]]:
    """``t`` after ``lead`` zeros, cut or zero-filled to ``length``: as ``(tensor, Conv pads)``.

    With known sizes the zeros are the Conv's pads (and ``t`` is cut with Slice
    where too long); otherwise the frame is made with Pad/Slice and the pads are 0.
    """
    n = geo.n
    have = _dims(ctx, t, 2, rank=geo.rank)
    if _known(lead, length, have):
        tail = [L - h - p for L, h, p in zip(length, have, lead, strict=True)]  # type: ignore[arg-type]
        if any(v < 0 for v in tail):
            ends = [h + min(v, 0) for h, v in zip(have, tail, strict=True)]  # type: ignore[arg-type]
            t = ctx.op("Slice", t, ctx.int64s([0] * n), ctx.int64s(ends), ctx.int64s(geo.axes))
        return t, list(lead) + [max(v, 0) for v in tail]  # type: ignore[arg-type]
    return _window(ctx, t, geo, _iop(ctx, "Sub", [0] * n, lead), length), [0] * 2 * n


def _transposed_to(
    ctx: RuleContext, t: str, w: str, geo: _Geometry, group: int, lead: Ints, size: Ints, out: Ints
) -> str:
    """``ConvTranspose(t, w)`` (strides, dilations and group of ``geo``) without its first ``lead``
    positions, cut or zero-filled to ``size``; ``out`` are the spatial sizes of ``t``."""
    attrs: dict[str, Any] = {"strides": geo.strides, "dilations": geo.dilations}
    if group != 1:
        attrs["group"] = group
    full = _iop(ctx, "Add", _iop(ctx, "Mul", _iop(ctx, "Sub", out, [1] * geo.n), geo.strides), geo.extent(ctx))
    if _known(full, lead, size):
        tail = [f - b - s for f, b, s in zip(full, lead, size, strict=True)]  # type: ignore[arg-type]
        attrs["pads"] = list(lead) + [max(v, 0) for v in tail]  # type: ignore[arg-type]
        if any(v < 0 for v in tail):
            attrs["output_padding"] = [max(-v, 0) for v in tail]
        return ctx.op("ConvTranspose", t, w, **attrs)
    return _window(ctx, ctx.op("ConvTranspose", t, w, **attrs), geo, lead, size)


def _weight_grad(
    ctx: RuleContext, a: str, pads: list[int], b: str, geo: _Geometry, group: int, kernel: Ints, fits: bool
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
        tail = _dims(ctx, a, 2, rank=geo.rank)
        grouped = ctx.op("Reshape", a, _vec(ctx, _cat(ctx, [0, group, -1], tail)))
        a_t = ctx.op("Transpose", grouped, perm=[2, 1, 0, *range(3, geo.rank + 1)])
        a_t = ctx.op("Reshape", a_t, _vec(ctx, _cat(ctx, [0, -1], tail)))
    b_t = ctx.op("Transpose", b, perm=[1, 0, *rest])
    attrs: dict[str, Any] = {"strides": geo.dilations, "dilations": geo.strides, "pads": pads}
    if group != 1:
        attrs["group"] = group
    dw = ctx.op("Conv", a_t, b_t, **attrs)
    if not fits:
        dw = ctx.op("Slice", dw, ctx.int64s([0] * geo.n), _vec(ctx, kernel), ctx.int64s(geo.axes))
    return ctx.op("Transpose", dw, perm=[1, 0, *rest])


def _kernel(ctx: RuleContext, w: str) -> Ints:
    shape = ctx.attr("kernel_shape")
    return [int(v) for v in shape] if shape is not None else _dims(ctx, w, 2)


def _bias_grad(ctx: RuleContext, g: str, rank: int) -> str | None:
    if not (ctx.has_input(2) and ctx.needs(2)):
        return None
    return ctx.op("ReduceSum", g, ctx.int64s([0, *_spatial_axes(rank)]), keepdims=0)


@registry.rule("Conv", inputs=(0, 1, 2))
def conv(ctx: RuleContext, grads: Grads) -> Result:
    """dx = ConvTranspose(g, w), dw = Conv(x^T, g^T) (strides and dilations swapped), db = sum(g)"""
    (g,) = grads
    x, w = ctx.inputs[:2]
    y = ctx.outputs[0]
    geo = _Geometry(ctx, x, _kernel(ctx, w), weight=w)
    group = int(ctx.attr("group", 1))
    lead, tail = geo.forward_pads(ctx, x, y)
    size, out = _dims(ctx, x, 2), _dims(ctx, y, 2, rank=geo.rank)
    dx = _transposed_to(ctx, g, w, geo, group, lead, size, out) if ctx.needs(0) else None
    dw = None
    if ctx.needs(1):
        padded = _iop(ctx, "Add", _iop(ctx, "Add", size, lead), tail)
        framed, pads = _framed(ctx, x, geo, lead, padded)
        fits = False
        if _known(padded, out, geo.kernel):
            sizes = zip(padded, out, geo.strides, geo.dilations, strict=True)  # type: ignore[arg-type]
            fits = [(p - (o - 1) * s - 1) // d + 1 for p, o, s, d in sizes] == geo.kernel
        dw = _weight_grad(ctx, framed, pads, g, geo, group, geo.kernel, fits)
    return [dx, dw, _bias_grad(ctx, g, geo.rank)][: len(ctx.inputs)]


@registry.rule("ConvTranspose", inputs=(0, 1, 2))
def conv_transpose(ctx: RuleContext, grads: Grads) -> Result:
    """dx = Conv(g, w), dw = Conv(g^T, x^T) (strides and dilations swapped), db = sum(g); g framed in the full output"""
    (g,) = grads
    x, w = ctx.inputs[:2]
    y = ctx.outputs[0]
    geo = _Geometry(ctx, x, _kernel(ctx, w), weight=w)
    n = geo.n
    group = int(ctx.attr("group", 1))
    extra = [int(v) for v in ctx.attr("output_padding", [0] * n)]
    size, out = _dims(ctx, x, 2), _dims(ctx, y, 2, rank=geo.rank)
    full = _iop(ctx, "Add", _iop(ctx, "Mul", _iop(ctx, "Sub", size, [1] * n), geo.strides), geo.extent(ctx))
    if ctx.attr("output_shape") is not None or geo.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        total = _iop(ctx, "Sub", _iop(ctx, "Add", full, extra), out)
        lead, _ = geo.split(ctx, total, head_larger=geo.auto_pad != "SAME_UPPER")
    elif geo.auto_pad == "VALID":
        lead = [0] * n
    else:
        lead = [int(v) for v in ctx.attr("pads", [0] * 2 * n)][:n]
    # y is the full output (length `full`, then output_padding zeros) without its first `lead` positions
    framed, pads = _framed(ctx, g, geo, lead, full)
    conv_attrs: dict[str, Any] = {"strides": geo.strides, "dilations": geo.dilations, "pads": pads}
    if group != 1:
        conv_attrs["group"] = group
    dx = ctx.op("Conv", framed, w, **conv_attrs) if ctx.needs(0) else None
    dw = _weight_grad(ctx, framed, pads, x, geo, group, geo.kernel, fits=True) if ctx.needs(1) else None
    return [dx, dw, _bias_grad(ctx, g, geo.rank)][: len(ctx.inputs)]


# ------------------------------------------------------------------------ pooling


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
        node = ctx.builder.add_node("MaxPool", [x], 2, hint="maxpool_grad", **_attributes(ctx, ("storage_order",)))
        indices = node[1]
    zeros = ctx.flat_zeros_like(x)
    flat = ctx.int64s([-1])
    if ctx.opset >= 16:
        dx = ctx.op(
            "ScatterElements",
            zeros,
            ctx.op("Reshape", indices, flat),
            ctx.op("Reshape", g, flat),
            axis=0,
            reduction="add",
        )
    else:
        # No reduction before opset 16: split the windows into classes of pairwise
        # disjoint ones (output positions congruent modulo ceil(ext / s)) and add up
        # one plain scatter per class.
        geo = _Geometry(ctx, x, [int(v) for v in ctx.attr("kernel_shape")])
        steps = [-(-e // s) for e, s in zip(geo.extent(ctx), geo.strides, strict=True)]  # type: ignore[arg-type]
        parts = []
        for start in itertools.product(*(range(m) for m in steps)):
            g_k, i_k = g, indices
            if any(m > 1 for m in steps):
                where = (ctx.int64s(start), ctx.int64s([_INT64_MAX] * geo.n), ctx.int64s(geo.axes), ctx.int64s(steps))
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
    geo = _Geometry(ctx, x, kernel)
    n = geo.n
    lead, tail = geo.forward_pads(ctx, x, y)
    size, out = _dims(ctx, x, 2), _dims(ctx, y, 2, rank=geo.rank)
    ceil = bool(ctx.attr("ceil_mode", 0))
    include_pad = bool(ctx.attr("count_include_pad", 0))
    ones_kernel = sized.ones(ctx, [1, 1, *kernel], x)
    if include_pad and not ceil:
        scaled = ctx.mul(g, 1.0 / math.prod(kernel))
    else:
        one = helper.make_tensor("value", ctx.elem_type(x), [1], [1])
        ones = ctx.op("ConstantOfShape", _vec(ctx, _cat(ctx, [1, 1], size)), value=one)
        # ceil_mode's last window may reach past the pads: more zeros at the end, cut below
        more = [s - 1 if ceil else 0 for s in geo.strides]
        padded = _iop(ctx, "Add", _iop(ctx, "Add", _iop(ctx, "Add", size, lead), tail), more)
        framed, pads = _framed(ctx, ones, geo, lead, padded)
        # the real (not padding) elements of each window
        count = ctx.op("Conv", framed, ones_kernel, strides=geo.strides, dilations=geo.dilations, pads=pads)
        if ceil:
            count = ctx.op("Slice", count, ctx.int64s([0] * n), _vec(ctx, out), ctx.int64s(geo.axes))
        if include_pad:
            weight = ctx.div(ctx.op("AveragePool", ones, **_attributes(ctx)), count)
        else:
            weight = ctx.op("Reciprocal", count)
        scaled = ctx.mul(g, weight)
    # channels as batch: [N * C, 1, *O] through one single-channel ConvTranspose
    flat = ctx.op("Reshape", scaled, ctx.int64s([-1, 1] + [0] * n))
    dx = _transposed_to(ctx, flat, ones_kernel, geo, 1, lead, size, out)
    return [ctx.op("Reshape", dx, ctx.shape_of(x))]


@registry.rule("GlobalAveragePool", inputs=(0,))
def global_average_pool(ctx: RuleContext, grads: Grads) -> Result:
    """dx = expand(g) / prod(S)"""
    x, y = ctx.inputs[0], ctx.outputs[0]
    size = _dims(ctx, x, 2)
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
    count = ctx.op("ReduceSum", mask, ctx.int64s(_spatial_axes(ctx.known_rank(x))), keepdims=1)
    return [ctx.mul(mask, ctx.div(grads[0], count))]  # type: ignore[arg-type]


# ----------------------------------------------------------------- normalizations


def _batch_norm_training(ctx: RuleContext) -> bool:
    if ctx.opset >= 14:
        return bool(ctx.attr("training_mode", 0))
    return sum(1 for name in ctx.outputs if name) > 1  # before 14: the optional outputs switch it on


@registry.rule("BatchNormalization", inputs=(0, 1, 2, 3, 4))
def batch_norm(ctx: RuleContext, grads: Grads) -> Result:
    """dx = bc(scale * inv) * g (inference) or bc(scale) * inv * (g - mean(g) - xhat * mean(g * xhat)) (training)"""
    # Statistics over all axes but 1. Inference: inv = 1 / sqrt(var + eps) of the running
    # variance, and dmean = -sum(g) * scale * inv, dvar = -sum(g * xhat) * scale * inv**2 / 2.
    # Training: batch statistics, which the running ones do not enter. dscale = sum(g * xhat),
    # dB = sum(g). The running mean and variance outputs carry no gradient.
    g = grads[0]
    if g is None:
        return [None] * len(ctx.inputs)
    x, scale, bias, mean, var = ctx.inputs
    rank = ctx.known_rank(x)
    axes = [0, *_spatial_axes(rank)]
    eps = ctx.attr("epsilon", 1e-5)
    scale_x = ctx.cast_like(scale, x)
    training = _batch_norm_training(ctx)
    if training:
        xhat, inv = _standardize(ctx, x, axes, eps)
    else:
        inv_c = ctx.op("Reciprocal", ctx.op("Sqrt", ctx.add(ctx.cast_like(var, x), eps)))
        inv = _bc(ctx, inv_c, rank)
        xhat = ctx.mul(ctx.sub(x, _bc(ctx, ctx.cast_like(mean, x), rank)), inv)
    dx = dscale = dbias = dmean = dvar = None
    if ctx.needs(0):
        if training:
            dx = _standardize_grad(ctx, ctx.mul(g, _bc(ctx, scale_x, rank)), xhat, inv, axes)
        else:
            dx = ctx.mul(g, _bc(ctx, ctx.mul(scale_x, inv_c), rank))
    if ctx.needs(1) or (not training and ctx.needs(4)):
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
        xhat, inv = _standardize(ctx, x, axes, ctx.attr("epsilon", 1e-5))
    dx = None
    if ctx.needs(0):
        terms = []
        if g is not None:
            terms.append(_standardize_grad(ctx, ctx.mul(g, scale), xhat, inv, axes))
        if g_mean is not None or g_inv is not None:
            size = _dims(ctx, x, axes[0]) if axes else []
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
    spatial = _spatial_axes(rank)
    xhat, inv = _standardize(ctx, x, spatial, ctx.attr("epsilon", 1e-5))
    dx = _standardize_grad(ctx, ctx.mul(g, _bc(ctx, scale, rank)), xhat, inv, spatial) if ctx.needs(0) else None
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
    xhat, inv = _standardize(ctx, ctx.op("Reshape", x, grouped_shape), [2], ctx.attr("epsilon", 1e-5))
    g_grouped = ctx.op("Reshape", g, grouped_shape)
    per_channel = ctx.opset >= 21
    if per_channel:
        gh = ctx.op("Reshape", ctx.mul(g, _bc(ctx, scale, rank)), grouped_shape)
        g_sum, xhat_sum, axes = g, ctx.op("Reshape", xhat, x_shape), [0, *_spatial_axes(rank)]
    else:
        gh = ctx.mul(g_grouped, ctx.op("Unsqueeze", scale, ctx.int64s([1])))
        g_sum, xhat_sum, axes = g_grouped, xhat, [0, 2]
    dx = None
    if ctx.needs(0):
        dx = ctx.op("Reshape", _standardize_grad(ctx, gh, xhat, inv, [2]), x_shape)
    dscale = ctx.op("ReduceSum", ctx.mul(g_sum, xhat_sum), ctx.int64s(axes), keepdims=0) if ctx.needs(1) else None
    dbias = ctx.op("ReduceSum", g_sum, ctx.int64s(axes), keepdims=0) if ctx.needs(2) else None
    return [dx, dscale, dbias]


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


# -------------------------------------------------------------------------- dropout


@registry.rule("Dropout", opsets=(12, None), inputs=(0,))
def dropout(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g * mask / (1 - ratio) in training mode (the forward pass's mask), else dx = g"""
    g = grads[0]
    x = ctx.inputs[0]
    if g is None:
        return [None] * len(ctx.inputs)
    training = ctx.inputs[2] if ctx.has_input(2) else None
    mode = ctx.constant_value(training) if training else np.array(False)
    if mode is not None and not bool(mode):
        return _data_only(ctx, g)
    mask = ctx.ensure_output(1, "dropout_mask")
    ratio = ctx.constant_value(ctx.inputs[1]) if ctx.has_input(1) else np.array(0.5)
    if ratio is not None:
        scale: str | float = 1.0 / (1.0 - float(ratio))
    else:
        scale = ctx.op("Reciprocal", ctx.sub(1.0, ctx.cast_like(ctx.inputs[1], x)))
    if mode is None:  # decided at run time; in inference mode the mask is all true
        scale = ctx.where(training, scale if isinstance(scale, str) else ctx.const(scale, x), 1.0)  # type: ignore[arg-type]
    return _data_only(ctx, ctx.where(mask, ctx.mul(g, scale), 0.0))


# ================================================================ more operators
#
# Lp pooling, MeanVarianceNormalization, LRN, RMSNormalization, region pooling
# (MaxRoiPool, RoiAlign), sampling (GridSample, AffineGrid), Col2Im, MaxUnpool,
# RotaryEmbedding and Attention. Sizes known while building fold into constants;
# the others come from Shape at run time (``_size``). Numbers in the scalar
# arithmetic (``_num``) fold in Python when both operands are known.

#: A scalar: a Python number (known while building) or the name of a 0-d tensor.
Num = str | float | int


def _size(ctx: RuleContext, x: str, axis: int) -> Num:
    """Dimension ``axis`` (non-negative) of ``x``: an int when known, else an int64 scalar."""
    dims = ctx.shape(x)
    if dims is not None and axis < len(dims) and isinstance(dims[axis], int):
        return int(dims[axis])
    return ctx.op("Squeeze", _dims(ctx, x, axis, axis + 1), ctx.int64s([0]))


def _as_float(ctx: RuleContext, v: Num, like: str) -> Num:
    """``v`` in the element type of ``like`` (a Python float when known)."""
    return float(v) if not isinstance(v, str) else ctx.cast_like(v, like)


_NUM_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "Add": operator.add,
    "Sub": operator.sub,
    "Mul": operator.mul,
    "Div": operator.truediv,
}


def _num(ctx: RuleContext, op: str, a: Num, b: Num) -> Num:
    """``a op b`` (Add, Sub, Mul, Div) for scalars or tensors, folded when both are numbers."""
    if not isinstance(a, str) and not isinstance(b, str):
        return _NUM_OPS[op](a, b)
    return {"Add": ctx.add, "Sub": ctx.sub, "Mul": ctx.mul, "Div": ctx.div}[op](a, b)


def _value(ctx: RuleContext, v: Num, like: str) -> str:
    """``v`` as a tensor with the element type of ``like``."""
    return ctx.const(v, like) if not isinstance(v, str) else ctx.cast_like(v, like)


def _arange(ctx: RuleContext, n: Num, like: str, shape: Sequence[int] = (-1,)) -> str:
    """``0, 1, ..., n - 1`` in the element type of ``like``, reshaped to ``shape``."""
    if not isinstance(n, str):
        return sized.arange(ctx, int(n), like, shape)
    values = ctx.op("Range", ctx.const(0, like), ctx.cast_like(n, like), ctx.const(1, like))
    return values if list(shape) == [-1] else ctx.op("Reshape", values, ctx.int64s(shape))


def _batch_sum(ctx: RuleContext, parts: str, batch: str, x: str) -> str:
    """``dx[b] = sum(parts[r] for r where batch[r] == b)``: a one-hot ``[N, R]`` MatMul; ``parts`` is ``[R, ...]``."""
    n = _size(ctx, x, 0)
    batch = ctx.cast(batch, TensorProto.INT64)
    onehot = ctx.compare("Equal", _arange(ctx, n, batch, (-1, 1)), ctx.op("Unsqueeze", batch, ctx.int64s([0])))
    flat = ctx.op("Reshape", parts, ctx.int64s([0, -1]))
    return ctx.op("Reshape", ctx.op("MatMul", ctx.cast_like(onehot, x), flat), ctx.shape_of(x))


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
    geo = _Geometry(ctx, x, kernel)
    lead, _ = geo.forward_pads(ctx, x, y)
    size, out = _dims(ctx, x, 2), _dims(ctx, y, 2, rank=geo.rank)
    flat = ctx.op("Reshape", _lp_scaled(ctx, g, y, p), ctx.int64s([-1, 1] + [0] * geo.n))  # type: ignore[arg-type]
    spread = _transposed_to(ctx, flat, sized.ones(ctx, [1, 1, *kernel], x), geo, 1, lead, size, out)
    return [ctx.mul(ctx.op("Reshape", spread, ctx.shape_of(x)), _lp_direction(ctx, x, p))]


# ------------------------------------------------------- more normalizations


@registry.rule("MeanVarianceNormalization", inputs=(0,))
def mean_variance_normalization(ctx: RuleContext, grads: Grads) -> Result:
    """dx = (g - mean(g)) / (s + eps) - y * mean(g * y) / s, s = std(x) over axes, eps = 1e-9"""
    # y = (x - mean) / (s + eps) with onnx's eps = 1e-9 added to the standard deviation
    (g,) = grads
    x, y = ctx.inputs[0], ctx.outputs[0]
    axes = [int(a) for a in ctx.attr("axes", [0, 2, 3])]
    centered = ctx.sub(x, _reduce(ctx, "ReduceMean", x, axes))
    std = ctx.op("Sqrt", _reduce(ctx, "ReduceMean", ctx.square(centered), axes))
    first = ctx.div(ctx.sub(g, _reduce(ctx, "ReduceMean", g, axes)), ctx.add(std, 1e-9))  # type: ignore[arg-type]
    second = ctx.div(ctx.mul(y, _reduce(ctx, "ReduceMean", ctx.mul(g, y), axes)), std)  # type: ignore[arg-type]
    return [ctx.sub(first, second)]


def _channel_window_sum(ctx: RuleContext, t: str, x: str, size: int, before: int, after: int) -> str:
    """``out[:, c] = sum(t[:, c - before : c + after + 1])`` over channels (zeros outside), as a Conv of ones."""
    grouped = ctx.op("Reshape", t, _vec(ctx, _cat(ctx, [0, 1], _dims(ctx, x, 1, 2), [-1])))  # [N, 1, C, prod(S)]
    ones = sized.ones(ctx, [1, 1, size, 1], t)
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


@registry.rule("RMSNormalization", opsets=(23, None), inputs=(0, 1))
def rms_normalization(ctx: RuleContext, grads: Grads) -> Result:
    """dx = r (gh - xh mean(gh xh)), gh = g scale, xh = x r, r = 1 / sqrt(mean(x^2) + eps); dscale = sum(g xh)"""
    # Over the axes from `axis` on, in x's element type whatever stash_type says.
    (g,) = grads
    x, scale = ctx.inputs[:2]
    rank = ctx.known_rank(x)
    axes = list(range(int(ctx.attr("axis", -1)) % rank, rank))
    xh, r = _rms_scale(ctx, x, axes, float(ctx.attr("epsilon", 1e-5)))
    dx = dscale = None
    if ctx.needs(0):
        dx = _rms_scale_grad(ctx, ctx.mul(g, scale), xh, r, axes)  # type: ignore[arg-type]
    if ctx.needs(1):
        dscale = unbroadcast(ctx, ctx.mul(g, xh), scale, shaped_like=ctx.outputs[0])  # type: ignore[arg-type]
    return [dx, dscale]


# ---------------------------------------------------------------- unpooling, Col2Im


@registry.rule("MaxUnpool", inputs=(0,))
def max_unpool(ctx: RuleContext, grads: Grads) -> Result:
    """dx = flatten(g)[I]  (I: the flat indices into the output; assumed distinct, as MaxPool's are)"""
    flat = ctx.op("Reshape", grads[0], ctx.int64s([-1]))  # type: ignore[arg-type]
    return _data_only(ctx, ctx.op("Gather", flat, ctx.cast(ctx.inputs[1], TensorProto.INT64)))


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
    if k is not None and sized.is_small(k, k):  # else EyeLike at run time, as for a computed block shape
        kernel = ctx.const(np.eye(k).reshape([k, 1, *[int(v) for v in shape]]), x)
    else:
        k_vec = ctx.op("ReduceProd", block, ctx.int64s([0]), keepdims=1)
        square = ctx.op("ConstantOfShape", ctx.op("Concat", k_vec, k_vec, axis=0), value=_one_tensor(ctx, x))
        kernel = ctx.op("Reshape", ctx.op("EyeLike", square), ctx.op("Concat", k_vec, ctx.int64s([1]), block, axis=0))
    attrs = {name: [int(v) for v in ctx.attr(name)] for name in ("dilations", "pads", "strides") if ctx.attr(name)}
    channels_as_batch = ctx.op("Reshape", g, ctx.int64s([-1, 1] + [0] * n))  # type: ignore[arg-type]
    columns = ctx.op("Conv", channels_as_batch, kernel, **attrs)  # [N * C, K, *blocks]
    return _data_only(ctx, ctx.op("Reshape", columns, ctx.shape_of(x)))


def _one_tensor(ctx: RuleContext, like: str) -> TensorProto:
    return helper.make_tensor("value", ctx.elem_type(like), [1], [1])


# ------------------------------------------------------------------ RotaryEmbedding


@registry.rule("RotaryEmbedding", opsets=(23, None), inputs=(0,))
def rotary_embedding(ctx: RuleContext, grads: Grads) -> Result:
    """dx = RotaryEmbedding(g, cos, -sin, position_ids): the inverse rotation"""
    # y1 = cos x1 - sin x2, y2 = sin x1 + cos x2 is a rotation per pair; its transpose
    # rotates by -theta. Dimensions past rotary_embedding_dim pass through both ways.
    inputs = list(ctx.inputs)
    inputs[0] = grads[0]  # type: ignore[call-overload]
    inputs[2] = ctx.neg(inputs[2])
    return _data_only(ctx, ctx.op("RotaryEmbedding", *inputs, **_attributes(ctx)))


# ------------------------------------------------------------------------ AffineGrid


@registry.rule("AffineGrid", opsets=(20, None), inputs=(0,))
def affine_grid(ctx: RuleContext, grads: Grads) -> Result:
    """dtheta = [g^T @ base, sum(g)], base = the normalized grid = AffineGrid(identity, size)"""
    # grid[n, p] = theta[n] @ [base[p], 1]: linear in theta. The base coordinates come
    # from the operator itself with the identity transform, so align_corners agrees.
    (g,) = grads
    theta, size = ctx.inputs[:2]
    rows = _size(ctx, theta, 1)  # theta is [N, 2, 3] (2-D) or [N, 3, 4] (3-D)
    k = rows if isinstance(rows, int) else ctx.known_rank(ctx.outputs[0]) - 2
    batch = ctx.op("Slice", ctx.cast(size, TensorProto.INT64), ctx.int64s([0]), ctx.int64s([1]))
    identity = ctx.op("Expand", ctx.const(np.eye(k, k + 1)[None], theta), _vec(ctx, _cat(ctx, batch, [k, k + 1])))
    base = ctx.op("AffineGrid", identity, size, **_attributes(ctx))
    g_flat = ctx.op("Reshape", g, ctx.int64s([0, -1, k]))  # type: ignore[arg-type]
    linear = ctx.op(
        "MatMul", ctx.op("Transpose", g_flat, perm=[0, 2, 1]), ctx.op("Reshape", base, ctx.int64s([0, -1, k]))
    )
    shift = ctx.op("ReduceSum", g_flat, ctx.int64s([1]), keepdims=0)
    return _data_only(ctx, ctx.op("Concat", linear, ctx.op("Unsqueeze", shift, ctx.int64s([2])), axis=2))


# ------------------------------------------------------------------------ GridSample


def _clamp(ctx: RuleContext, v: str, low: Num, high: Num) -> str:
    """``min(max(v, low), high)``"""
    return ctx.op("Min", ctx.op("Max", v, _value(ctx, low, v)), _value(ctx, high, v))


def _reflect(ctx: RuleContext, c: str, low: Num, high: Num) -> tuple[str, str]:
    """``c`` reflected into ``[low, high]`` (where outside it), and ``d reflected / dc`` (+1 or -1)."""
    span = _num(ctx, "Sub", high, low)
    shifted = ctx.sub(c, _value(ctx, low, c))
    period = _value(ctx, _num(ctx, "Mul", span, 2.0), c)
    phase = ctx.sub(shifted, ctx.mul(period, ctx.op("Floor", ctx.div(shifted, period))))  # in [0, 2 span)
    back = ctx.compare("Greater", phase, _value(ctx, span, c))
    folded = ctx.add(_value(ctx, low, c), ctx.where(back, ctx.sub(period, phase), phase))
    outside = ctx.op("Or", ctx.compare("Less", c, _value(ctx, low, c)), ctx.compare("Greater", c, _value(ctx, high, c)))
    return ctx.where(outside, folded, c), ctx.where(outside, ctx.where(back, ctx.const(-1.0, c), 1.0), 1.0)


def _denormalized(ctx: RuleContext, u: str, size: Num, align: bool) -> tuple[str, Num, Num, Num, Num]:
    """``(c, dc/du, low, high, L - 1)``: the pixel coordinate ``c`` of the normalized ``u`` on an axis of size
    ``L``, and the range ``[low, high]`` that reflection padding reflects into."""
    size_f = _as_float(ctx, size, u)
    last = _num(ctx, "Sub", size_f, 1.0)
    if align:  # c = (u + 1) / 2 * (L - 1)
        scale = _num(ctx, "Mul", last, 0.5)
        return ctx.mul(ctx.add(u, 1.0), _value(ctx, scale, u)), scale, 0.0, last, last
    # c = ((u + 1) * L - 1) / 2
    scale = _num(ctx, "Mul", size_f, 0.5)
    c = ctx.sub(ctx.mul(ctx.add(u, 1.0), _value(ctx, scale, u)), 0.5)
    return c, scale, -0.5, _num(ctx, "Sub", size_f, 0.5), last


def _grid_axis(
    ctx: RuleContext, u: str, size: Num, align: bool, padding: str, nearest: bool
) -> tuple[str, list[tuple[str, str, str]]]:
    """One axis of GridSample: ``(dc/du, taps)``, a tap ``(index, weight, d weight / dc)`` (int64, float, float).

    ``u`` is the normalized coordinate, ``c`` the pixel coordinate after padding_mode's
    border clamp or reflection (which both end in a clamp to ``[0, L-1]``: the corner values
    outside are those of the border). Linear: taps floor(c) and floor(c) + 1; nearest: round(c).
    """
    c, scale, low, high, last = _denormalized(ctx, u, size, align)
    slope = _value(ctx, scale, u)
    if nearest:
        c = ctx.op("Round", c)  # half to even, as nearbyint
    if padding == "reflection":
        c, sign = _reflect(ctx, c, low, high)
        slope = ctx.mul(slope, sign)
    if padding in ("border", "reflection"):
        inside = ctx.op("And", ctx.compare("Greater", c, 0.0), ctx.compare("Less", c, _value(ctx, last, c)))
        slope = ctx.mul(slope, ctx.cast_like(inside, u))
        c = _clamp(ctx, c, 0.0, last)
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
        index = ctx.cast(_clamp(ctx, position, 0.0, last), TensorProto.INT64)
        taps.append((index, _full(ctx, weight, u), _full(ctx, dweight, u)))
    return slope, taps


def _within(ctx: RuleContext, position: str, last: Num, like: str) -> str:
    """``1`` where ``0 <= position <= last`` (a tap inside the image), else ``0``, in ``like``'s type."""
    inside = ctx.op(
        "And",
        ctx.compare("GreaterOrEqual", position, 0.0),
        ctx.compare("LessOrEqual", position, _value(ctx, last, position)),
    )
    return ctx.cast_like(inside, like)


def _grid_axis_cubic(
    ctx: RuleContext, u: str, size: Num, align: bool, padding: str
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
        index = ctx.cast(_clamp(ctx, position, 0.0, last), TensorProto.INT64)
        taps.append((index, weight, dweight))
    return _value(ctx, scale, u), taps


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
    sizes = [_size(ctx, x, 2 + a) for a in range(n)]
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
    stride: Num = 1
    for a in reversed(range(n)):
        index = _corner_stack(ctx, [i for i, _, _ in axes[a][1]], a, n)
        term = index if stride == 1 else ctx.mul(index, _value(ctx, stride, index))
        flat_index = term if flat_index is None else ctx.add(flat_index, term)
        stride = _num(ctx, "Mul", stride, sizes[a])
    assert flat_index is not None
    k = len(axes[0][1]) ** n  # corners: 2^n (linear), 4^n (cubic) or 1 (nearest)
    corners = ctx.int64s([0, 1, k, -1])
    flat_index = ctx.op("Reshape", flat_index, corners)
    x_flat = ctx.op("Reshape", x, ctx.int64s([0, 0, -1]))  # [N, C, P]
    g_flat = ctx.op("Unsqueeze", ctx.op("Reshape", g, ctx.int64s([0, 0, -1])), ctx.int64s([2]))  # [N, C, 1, Q]
    channels = _dims(ctx, x, 1, 2)
    index_c = ctx.op("Expand", flat_index, _vec(ctx, _cat(ctx, [1], channels, [1, 1])))  # [N, C, K, Q]
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


# ------------------------------------------------------------- region pooling


def _per_roi(ctx: RuleContext, v: str) -> str:
    """A per-RoI vector ``[R]`` as ``[R, 1, 1]``."""
    return ctx.op("Unsqueeze", v, ctx.int64s([1, 2]))


def _roi_column(ctx: RuleContext, rois: str, k: int, like: str) -> str:
    """Column ``k`` of ``rois`` ``[R, *]`` as ``[R]`` in the element type of ``like``."""
    return ctx.cast_like(ctx.op("Squeeze", ctx.op("Gather", rois, ctx.int64s([k]), axis=1), ctx.int64s([1])), like)


def _roi_align_axis(
    ctx: RuleContext, start: str, length: str, pooled: int, size: Num, ratio: int, x: str
) -> tuple[str, str, str, Ints]:
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
        grid: Ints = [ratio]
        n_slots: Num = ratio
    else:
        count = ctx.op("Ceil", bin_size)  # ceil(length / pooled); at most 0 for an empty RoI
        most = ctx.op("Max", ctx.op("ReduceMax", count, keepdims=1), ctx.const([1.0], x))  # at least one slot
        grid = ctx.cast(most, TensorProto.INT64)
        n_slots = ctx.op("Squeeze", grid, ctx.int64s([0]))
    slots = _arange(ctx, n_slots, x, (1, 1, -1))
    bins = _arange(ctx, pooled, x, (1, -1, 1))
    step = _per_roi(ctx, bin_size)
    # y = start + p * bin + (s + 0.5) * bin / count, in onnxruntime's order (no samples when count = 0)
    y = ctx.add(
        ctx.add(_per_roi(ctx, start), ctx.mul(bins, step)),
        ctx.div(ctx.mul(ctx.add(slots, 0.5), step), _per_roi(ctx, ctx.op("Max", count, ctx.const(1.0, x)))),
    )  # [R, P, G]
    size_f = _as_float(ctx, size, x)
    last = _value(ctx, _num(ctx, "Sub", size_f, 1.0), x)
    inside = ctx.cast_like(
        ctx.op("Not", ctx.op("Or", ctx.compare("Less", y, -1.0), ctx.compare("Greater", y, _value(ctx, size_f, x)))), x
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
    pixels = _arange(ctx, size, x, (1, 1, 1, 1, -1))
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
    height, width = _size(ctx, x, 2), _size(ctx, x, 3)
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
        "Unsqueeze", ctx.op("Reshape", ay, _vec(ctx, _cat(ctx, [0, -1], _dims(ctx, x, 2, 3)))), ctx.int64s([1])
    )
    cols = ctx.op(
        "Unsqueeze", ctx.op("Reshape", ax, _vec(ctx, _cat(ctx, [0, -1], _dims(ctx, x, 3, 4)))), ctx.int64s([1])
    )
    rois_x = ctx.op("Gather", x, ctx.cast(batch, TensorProto.INT64), axis=0)  # [R, C, H, W]
    weighted = ctx.op("MatMul", ctx.op("MatMul", rows, rois_x), ctx.op("Transpose", cols, perm=[0, 1, 3, 2]))
    split = _vec(ctx, _cat(ctx, [0, 0, ph], grid_y, [2, pw], grid_x, [2]))
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
    slots = _iop(ctx, "Mul", _iop(ctx, "Mul", grid_y, grid_x), [4])
    positions = _arange(ctx, slots[0] if isinstance(slots, list) else ctx.op("Squeeze", slots, ctx.int64s([0])), best)
    chosen = ctx.op("And", ctx.compare("Equal", best, positions), exists)
    spread = ctx.where(chosen, ctx.op("Unsqueeze", g, ctx.int64s([4])), 0.0)  # type: ignore[arg-type]
    unsplit = _vec(ctx, _cat(ctx, [0, 0, ph, pw], grid_y, grid_x, [2, 2]))
    back = ctx.op("Transpose", ctx.op("Reshape", spread, unsplit), perm=[0, 1, 2, 4, 6, 3, 5, 7])
    back = ctx.op("Reshape", back, _vec(ctx, _cat(ctx, [0, 0], _iop(ctx, "Mul", [ph * 2], grid_y), [-1])))
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


def _max_roi_axis(ctx: RuleContext, low: str, high: str, pooled: int, size: Num, x: str) -> tuple[str, str]:
    """MaxRoiPool's bins along one axis: ``(inside[r, p, l], nonempty[r, p])``, as onnxruntime computes them."""

    def rounded(v: str) -> str:  # half away from zero, as std::round
        return ctx.mul(ctx.op("Sign", v), ctx.op("Floor", ctx.add(ctx.op("Abs", v), 0.5)))

    start = rounded(low)
    length = ctx.op("Max", ctx.add(ctx.sub(rounded(high), start), 1.0), ctx.const(1.0, x))
    step = ctx.op("Unsqueeze", ctx.div(length, float(pooled)), ctx.int64s([1]))  # [R, 1]
    bins = _arange(ctx, pooled, x, (1, -1))
    offset = ctx.op("Unsqueeze", start, ctx.int64s([1]))
    size_f = _value(ctx, _as_float(ctx, size, x), x)
    first = _clamp(ctx, ctx.add(ctx.op("Floor", ctx.mul(bins, step)), offset), 0.0, size_f)  # [R, P]
    end = _clamp(ctx, ctx.add(ctx.op("Ceil", ctx.mul(ctx.add(bins, 1.0), step)), offset), 0.0, size_f)
    pixels = _arange(ctx, size, x, (1, 1, -1))
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
    height, width = _size(ctx, x, 2), _size(ctx, x, 3)
    rows, rows_used = _max_roi_axis(ctx, column[2], column[4], ph, height, x)  # [R, P, H], [R, P]
    cols, cols_used = _max_roi_axis(ctx, column[1], column[3], pw, width, x)  # [R, Q, W], [R, Q]
    batch = ctx.cast(column[0], TensorProto.INT64)  # truncated, as onnxruntime
    images = ctx.op("Gather", x, batch, axis=0)  # [R, C, H, W]
    lowest = ctx.const(-np.inf, x)
    per_col = ctx.where(
        ctx.op("Unsqueeze", cols, ctx.int64s([1, 2])), ctx.op("Unsqueeze", images, ctx.int64s([3])), lowest
    )  # [R, C, H, Q, W]
    col_max = _reduce(ctx, "ReduceMax", per_col, [4], keepdims=0)  # [R, C, H, Q]
    col_arg = ctx.op("ArgMax", per_col, axis=4, keepdims=0)
    per_bin = ctx.where(
        ctx.op("Unsqueeze", rows, ctx.int64s([1, 4])), ctx.op("Unsqueeze", col_max, ctx.int64s([2])), lowest
    )  # [R, C, P, H, Q]
    row_arg = ctx.op("ArgMax", per_bin, axis=3, keepdims=0)  # [R, C, P, Q]
    flat = ctx.add(ctx.mul(row_arg, _value(ctx, width, row_arg)), ctx.op("GatherElements", col_arg, row_arg, axis=2))
    used = ctx.op(
        "And", ctx.op("Unsqueeze", rows_used, ctx.int64s([2])), ctx.op("Unsqueeze", cols_used, ctx.int64s([1]))
    )
    update = ctx.where(ctx.op("Unsqueeze", used, ctx.int64s([1])), g, 0.0)  # type: ignore[arg-type]
    by_row = ctx.int64s([0, 0, -1])
    if ctx.opset >= 16:
        zeros = ctx.zeros_like(ctx.op("Reshape", images, by_row))
        per_roi = ctx.op(
            "ScatterElements",
            zeros,
            ctx.op("Reshape", flat, by_row),
            ctx.op("Reshape", update, by_row),
            axis=2,
            reduction="add",
        )
    else:
        pixels = _arange(ctx, _num(ctx, "Mul", height, width), flat, (1, 1, 1, 1, -1))
        hits = ctx.compare("Equal", ctx.op("Unsqueeze", flat, ctx.int64s([4])), pixels)
        spread = ctx.where(hits, ctx.op("Unsqueeze", update, ctx.int64s([4])), 0.0)
        per_roi = ctx.op("ReduceSum", spread, ctx.int64s([2, 3]), keepdims=0)
    per_roi = ctx.op("Reshape", per_roi, ctx.shape_of(images))
    return [_batch_sum(ctx, per_roi, batch, x), None]


# ------------------------------------------------------------------------- Attention


def _heads(ctx: RuleContext, t: str, heads: int) -> str:
    """``[B, S, H * D]`` as ``[B, H, S, D]``."""
    return ctx.op("Transpose", ctx.op("Reshape", t, ctx.int64s([0, 0, heads, -1])), perm=[0, 2, 1, 3])


def _merge_heads(ctx: RuleContext, t: str, like: str) -> str:
    """``[B, H, S, D]`` back to the shape of ``like``, ``[B, S, H * D]``."""
    return ctx.op("Reshape", ctx.op("Transpose", t, perm=[0, 2, 1, 3]), ctx.shape_of(like))


def _attention_bias(ctx: RuleContext, q: str, keys: str, past: Num, like: str) -> str | None:
    """The additive bias of Attention, ``[.., Sq, Sk]``: the mask (bool: 0 / -inf, float: as is, padded
    with -inf to Sk), causal and sliding-window limits (offset by the past length, or per batch by
    ``nonpad_kv_seqlen - Sq``) and the padding of nonpad_kv_seqlen; ``None`` when there is none."""
    terms = []
    sq, sk = _size(ctx, q, 2), _size(ctx, keys, 2)
    minus_inf = ctx.const(-np.inf, like)
    if ctx.has_input(3):
        mask = ctx.inputs[3]
        if ctx.elem_type(mask) == TensorProto.BOOL:
            bias = ctx.where(mask, ctx.const(0.0, like), minus_inf)
        else:
            bias = ctx.cast_like(mask, like)
        rank = ctx.known_rank(mask)
        have, want = _dims(ctx, mask, rank - 1), _dims(ctx, keys, 2, 3)
        if not (_known(have, want) and have == want):  # a shorter mask means -inf beyond it
            pads = _cat(ctx, [0] * (2 * rank - 1), _iop(ctx, "Sub", want, have))
            bias = ctx.op("Pad", bias, _vec(ctx, pads), minus_inf)
        terms.append(bias)
    causal = bool(ctx.attr("is_causal", 0))
    left, right = int(ctx.attr("left_window_size", -1)), int(ctx.attr("right_window_size", -1))
    nonpad = ctx.inputs[6] if ctx.has_input(6) else None
    allowed = None
    if causal or left >= 0 or right >= 0:
        rows = _arange(ctx, sq, ctx.int64s([0]), (-1, 1))
        cols = _arange(ctx, sk, ctx.int64s([0]), (1, -1))
        if nonpad is not None:  # per batch: offset = nonpad_kv_seqlen - Sq, as [B, 1, 1, 1]
            offset = ctx.sub(ctx.op("Reshape", nonpad, ctx.int64s([-1, 1, 1, 1])), _value(ctx, sq, nonpad))
            position = ctx.add(rows, offset)
        else:
            position = rows if past == 0 else ctx.add(rows, _value(ctx, past, rows))
        diff = ctx.sub(position, cols)  # query position - key position
        limits = []
        if causal:
            limits.append(ctx.compare("GreaterOrEqual", diff, ctx.const(0, diff)))
        if left >= 0:
            limits.append(ctx.compare("LessOrEqual", diff, ctx.const(left, diff)))
        if right >= 0:
            limits.append(ctx.compare("GreaterOrEqual", diff, ctx.const(-right, diff)))
        allowed = limits[0]
        for limit in limits[1:]:
            allowed = ctx.op("And", allowed, limit)
    if nonpad is not None:
        cols = _arange(ctx, sk, nonpad, (1, 1, 1, -1))
        valid = ctx.compare("Less", cols, ctx.op("Reshape", nonpad, ctx.int64s([-1, 1, 1, 1])))
        allowed = valid if allowed is None else ctx.op("And", allowed, valid)
    if allowed is not None:
        terms.append(ctx.where(allowed, ctx.const(0.0, like), minus_inf))
    if not terms:
        return None
    return terms[0] if len(terms) == 1 else ctx.add(terms[0], terms[1])


def _masked_softmax(ctx: RuleContext, z: str) -> str:
    """Softmax over the last axis where ``-inf`` entries get 0 and a row of only ``-inf`` gives zeros."""
    last = ctx.int64s([-1])
    top = _reduce(ctx, "ReduceMax", z, [-1])
    top = ctx.where(ctx.op("IsInf", top, detect_positive=0), 0.0, top)
    e = ctx.op("Exp", ctx.sub(z, top))
    total = ctx.op("ReduceSum", e, last, keepdims=1)
    return ctx.div(e, ctx.where(ctx.compare("Equal", total, 0.0), ctx.const(1.0, total), total))


@registry.rule("Attention", opsets=(23, None), inputs=(0, 1, 2, 3, 4, 5))
def attention(ctx: RuleContext, grads: Grads) -> Result:
    """dV = P^T g, dS = P (dP - sum(dP P)), dP = g V^T, dQ = s dS K, dK = s dS^T Q; P = softmax(s Q K^T + bias)"""
    # Recomputes P: Q, K, V as [B, H, S, D] (3-D inputs split by q_num_heads / kv_num_heads),
    # K and V after past_key / past_value, each KV head repeated for its group of query heads
    # (GQA, MQA) and the gradient summed back over the group. softcap c: S = c tanh(S / c),
    # dS *= 1 - tanh^2. A float attn_mask gets dS; present_key / present_value gradients add to
    # those of [past; K] and [past; V]. softmax_precision is ignored (P in the inputs' type).
    q, k, v = ctx.inputs[:3]
    g_y, g_key, g_value, g_qk = [*grads, None, None, None][:4]
    if g_qk is not None:
        raise ValueError(
            f"Attention node {ctx.node.name!r}: its qk_matmul_output (output 3) is a debugging output "
            "without a gradient rule; keep it off the path to the loss"
        )
    rank = ctx.known_rank(q)
    if rank == 3:
        hq, hkv = int(ctx.attr("q_num_heads")), int(ctx.attr("kv_num_heads"))
        q4, k4, v4 = _heads(ctx, q, hq), _heads(ctx, k, hkv), _heads(ctx, v, hkv)
    else:
        q4, k4, v4 = q, k, v
    past: Num = 0
    keys, values = k4, v4
    if ctx.has_input(4):
        past = _size(ctx, ctx.inputs[4], 2)
        keys = ctx.op("Concat", ctx.inputs[4], k4, axis=2)
        values = ctx.op("Concat", ctx.inputs[5], v4, axis=2)
    query_heads, kv_heads = _size(ctx, q4, 1), _size(ctx, keys, 1)
    group: Num = (
        query_heads // kv_heads
        if not isinstance(query_heads, str) and not isinstance(kv_heads, str)
        else ctx.op("Div", _value(ctx, query_heads, ctx.int64s([0])), _value(ctx, kv_heads, ctx.int64s([0])))
    )

    def repeat(t: str) -> str:  # [B, Hkv, S, D] -> [B, Hkv * G, S, D], head h reading KV head h // G
        if group == 1:
            return t
        copies = [group] if not isinstance(group, str) else ctx.op("Unsqueeze", group, ctx.int64s([0]))
        tiles = _cat(ctx, [1, 1], copies, [1, 1])
        expanded = ctx.op("Expand", ctx.op("Unsqueeze", t, ctx.int64s([2])), _vec(ctx, tiles))
        return ctx.op("Reshape", expanded, _vec(ctx, _cat(ctx, [0, -1], _dims(ctx, t, 2, 4))))

    def unrepeat(t: str, like: str) -> str:  # the gradient summed over each group
        if group == 1:
            return t
        grouped = ctx.op("Reshape", t, _vec(ctx, _cat(ctx, [0], _dims(ctx, like, 1, 2), [-1], _dims(ctx, like, 2, 4))))
        return ctx.op("ReduceSum", grouped, ctx.int64s([2]), keepdims=0)

    kx, vx = repeat(keys), repeat(values)
    scale = ctx.attr("scale")
    if scale is None:
        depth = _size(ctx, q4, 3)
        if isinstance(depth, str):
            scale = ctx.op("Reciprocal", ctx.op("Sqrt", ctx.cast_like(depth, q)))
        else:
            scale = 1.0 / math.sqrt(depth)
    t_last = [0, 1, 3, 2]
    scores = ctx.mul(ctx.op("MatMul", q4, ctx.op("Transpose", kx, perm=t_last)), scale)  # type: ignore[arg-type]
    cap = float(ctx.attr("softcap", 0.0))
    if cap > 0:
        capped = ctx.op("Tanh", ctx.div(scores, cap))
        scores = ctx.mul(capped, cap)
    bias = _attention_bias(ctx, q4, keys, past, q)
    p = _masked_softmax(ctx, scores if bias is None else ctx.add(scores, bias))
    n_inputs = len(ctx.inputs)
    result: Result = [None] * n_inputs
    d_keys = d_values = None
    if g_y is not None:
        g4 = _heads(ctx, g_y, hq) if rank == 3 else g_y
        if ctx.needs(2) or ctx.needs(5):
            d_values = unrepeat(ctx.op("MatMul", ctx.op("Transpose", p, perm=t_last), g4), values)
        dp = ctx.op("MatMul", g4, ctx.op("Transpose", vx, perm=t_last))
        dz = ctx.mul(p, ctx.sub(dp, ctx.op("ReduceSum", ctx.mul(dp, p), ctx.int64s([-1]), keepdims=1)))
        if ctx.needs(3):  # a float mask, added to the scores; padded masks get their own columns
            mask = ctx.inputs[3]
            width = _dims(ctx, mask, ctx.known_rank(mask) - 1)
            cut = ctx.op("Slice", dz, ctx.int64s([0]), _vec(ctx, width), ctx.int64s([-1]))
            result[3] = ctx.cast_like(unbroadcast(ctx, cut, mask), mask)
        ds = ctx.mul(dz, ctx.sub(1.0, ctx.square(capped))) if cap > 0 else dz
        ds = ctx.mul(ds, scale)  # type: ignore[arg-type]
        if ctx.needs(0):
            dq = ctx.op("MatMul", ds, kx)
            result[0] = _merge_heads(ctx, dq, q) if rank == 3 else dq
        if ctx.needs(1) or ctx.needs(4):
            d_keys = unrepeat(ctx.op("MatMul", ctx.op("Transpose", ds, perm=t_last), q4), keys)
    for index, total, present in ((1, d_keys, g_key), (2, d_values, g_value)):
        parts = [t for t in (total, present) if t is not None]
        if not parts:
            continue
        total = parts[0] if len(parts) == 1 else ctx.add(parts[0], parts[1])
        source = ctx.inputs[index]
        if ctx.has_input(index + 3):  # [past; new] along the sequence axis
            length = _dims(ctx, ctx.inputs[index + 3], 2, 3)
            if ctx.needs(index + 3):
                result[index + 3] = ctx.op("Slice", total, ctx.int64s([0]), _vec(ctx, length), ctx.int64s([2]))
            total = ctx.op("Slice", total, _vec(ctx, length), ctx.int64s([_INT64_MAX]), ctx.int64s([2]))
        if ctx.needs(index):
            result[index] = _merge_heads(ctx, total, source) if rank == 3 else total
    return result
