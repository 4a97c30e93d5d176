"""Softmax, LogSoftmax and the loss operators: SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss.

Notation: ``x`` is the input (scores or log-probabilities, classes on axis 1),
``t`` the integer target, ``w`` the optional class weights, ``y`` the output and
``g`` its gradient. A loss's gradient is ``-onehot(t) * w_t`` scaled by ``g``
(``reduction="none"`` or ``"sum"``) or by ``g / sum(w_t)`` (``"mean"``), with
``w_t = 0`` where ``t == ignore_index``.

SoftmaxCrossEntropyLoss reuses its log-probabilities output (declared on the
forward node with ``ctx.ensure_output`` when the model omitted it). A mean
NegativeLogLikelihoodLoss over a LogSoftmax that nothing else reads is
differentiated together with it, as ``(softmax(scores) - onehot(t)) * g / N``;
from :data:`SCATTERED_TARGET_CLASSES` classes on (a language model's
vocabulary), without the one-hot: the target's ``-1`` is written into the
softmax, which saves two tensors of the scores' size.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from onnxtrain.autodiff import dims
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.dims import DimVector
from onnxtrain.autodiff.registry import Grads, Result
from onnxtrain.autodiff.rules._builtin import registry
from onnxtrain.autodiff.rules.backward_helpers import data_only
from onnxtrain.graph.attributes import attribute
from onnxtrain.graph.versions import is_standard

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
    onehot = _class_matches(ctx, target, dims.dims_of(ctx, x, 1, 2), rank)
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
    return data_only(ctx, ctx.sub(glp, ctx.mul(ctx.op("Exp", log_prob), total)))


@registry.rule("NegativeLogLikelihoodLoss", opsets=(12, None), inputs=(0,))
def negative_log_likelihood_loss(ctx: RuleContext, grads: Grads) -> Result:
    """dx = -onehot(t) * w_t * (g, g_i or g / sum(w)), w_t = 0 where t = ignore_index"""
    (g,) = grads
    assert g is not None  # the engine calls a rule only when its output has a gradient
    if _fuse_with_log_softmax(ctx, g):
        return [None] * len(ctx.inputs)
    return data_only(ctx, _nll_grad(ctx, g, ctx.inputs[0]))


def _fuse_with_log_softmax(ctx: RuleContext, g: str) -> bool:
    """Cross-entropy as LogSoftmax + mean NLL: ``d scores = (softmax(scores) - onehot(t)) * g / N``.

    Taken (and given to the LogSoftmax's input) when the log-probabilities come
    from a LogSoftmax over the class axis that nothing else reads, with no class
    weights and no ignored label: the two rules in one, in four or five nodes
    instead of fifteen.
    """
    log_probs = ctx.inputs[0]
    producer = ctx.producer(log_probs)
    if producer is None or producer.op_type != "LogSoftmax" or not is_standard(producer):
        return False
    scores, rank = producer.input[0], ctx.rank(log_probs)
    axis = attribute(producer, "axis", -1)
    if rank is None or axis % rank != 1 or not ctx.read_only_here(log_probs) or not ctx.depends_on_wrt(scores):
        return False
    if ctx.has_input(2) or ctx.attr("ignore_index") is not None or ctx.attr("reduction", "mean") != "mean":
        return False
    size = ctx.static_shape(ctx.inputs[1])
    classes = (ctx.shape(log_probs) or [None, None])[1]
    if isinstance(classes, int) and classes >= SCATTERED_TARGET_CLASSES:
        ctx.contribute(scores, _softmax_minus_target(ctx, g, log_probs, size))
        return True
    onehot = _onehot(ctx, ctx.inputs[1], log_probs, rank)
    diff = ctx.sub(ctx.op("Exp", log_probs), onehot)
    count = ctx.const(float(np.prod(size)), log_probs) if size is not None else ctx.op("ReduceSum", onehot, keepdims=0)
    ctx.contribute(scores, ctx.mul(ctx.div(diff, count), g))
    return True


#: Classes from which the cross-entropy's gradient writes the target's ``-1`` into the softmax
#: (:func:`_softmax_minus_target`) rather than subtracting a one-hot: a language model's ``[N, vocabulary]``
#: one-hot and difference are each as large as its logits. Below, the one-hot's form takes fewer nodes.
SCATTERED_TARGET_CLASSES = 1024


def _softmax_minus_target(ctx: RuleContext, g: str, log_probs: str, size: list[int] | None) -> str:
    """``(softmax - onehot(t)) * g / N`` without a one-hot: the softmax ``p = exp(log_probs)`` with
    ``p[i, t_i] - 1`` written at each target (``GatherElements``, ``ScatterElements``), times ``g / N``."""
    target = _with_class_axis(ctx, ctx.cast(ctx.inputs[1], TensorProto.INT64))
    probs = ctx.op("Exp", log_probs)
    at_target = ctx.sub(ctx.op("GatherElements", probs, target, axis=1), 1.0)
    diff = ctx.op("ScatterElements", probs, target, at_target, axis=1)
    count = (
        ctx.const(float(np.prod(size)), log_probs)
        if size is not None
        else ctx.cast_like(ctx.op("Size", target), log_probs)
    )
    return ctx.mul(diff, ctx.div(g, count))


# ----------------------------------------------------------------- one-hot targets


def _with_class_axis(ctx: RuleContext, target: str) -> str:
    """``target`` with an axis 1 of size 1 inserted: ``Reshape(t, [-1, 1])`` for a 1-D target, else ``Unsqueeze``.

    onnx's shape inference (data propagation) expands a 1-D int64 value element by element through
    ``Unsqueeze`` (about 140 bytes per label), which a static batch of millions makes gigabytes.
    """
    if ctx.rank(target) == 1:
        return ctx.op("Reshape", target, ctx.int64s([-1, 1]))
    return ctx.op("Unsqueeze", target, ctx.int64s([1]))


def _class_matches(ctx: RuleContext, target: str, n_classes: DimVector, rank: int) -> str:
    """``t == c`` (bool) for each class ``c < n_classes`` along axis 1 of a rank-``rank`` result."""
    class_shape = [1, -1] + [1] * (rank - 2)
    if isinstance(n_classes, list):
        classes = dims.arange(ctx, n_classes[0], target, class_shape)
    else:
        classes = ctx.op("Range", ctx.const(0, target), ctx.op("Squeeze", n_classes), ctx.const(1, target))
        classes = ctx.op("Reshape", classes, ctx.int64s(class_shape))
    return ctx.compare("Equal", _with_class_axis(ctx, target), classes)


def _onehot(ctx: RuleContext, target: str, like: str, rank: int) -> str:
    """``onehot(t)`` along axis 1, in ``like``'s element type (rows of out-of-range labels are zero)."""
    depth = dims.dims_of(ctx, like, 1, 2)
    if ctx.elem_type(like) in (TensorProto.FLOAT, TensorProto.FLOAT16):  # onnxruntime's OneHot outputs
        labels = ctx.cast(target, TensorProto.INT64)  # and indices it takes
        return ctx.op("OneHot", labels, dims.as_vector(ctx, depth), ctx.const([0, 1], like), axis=1)
    return ctx.cast_like(_class_matches(ctx, target, depth, rank), like)
