"""Attention (scaled dot-product, grouped-query, with a key / value cache) and RotaryEmbedding.

Notation: ``Q``, ``K``, ``V`` are ``[B, H, S, D]`` (3-D inputs ``[B, S, H * D]``
split into heads), ``s`` the scale (``1 / sqrt(D)`` by default), ``P =
softmax(s Q K^T + bias)`` the attention weights, ``g`` the output gradient.
``dV = P^T g``, ``dP = g V^T``, ``dS = P (dP - sum(dP P))`` (the softmax's
gradient), ``dQ = s dS K``, ``dK = s dS^T Q``. The rule recomputes ``P``; each
KV head is repeated for its group of query heads (GQA, MQA) and its gradient
summed back over the group.

RotaryEmbedding rotates pairs of entries by position-dependent angles: its
gradient is the inverse rotation, the operator itself with ``-sin``.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto

from onnxtrain.autodiff import dims
from onnxtrain.autodiff.broadcast import unbroadcast
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.dims import Scalar
from onnxtrain.autodiff.registry import Grads, Result
from onnxtrain.autodiff.rules._builtin import registry
from onnxtrain.autodiff.rules.backward_helpers import (
    data_only,
    forward_attributes,
    merge_heads,
    reduce_over,
    split_heads,
)


def _attention_bias(ctx: RuleContext, q: str, keys: str, past: Scalar, like: str) -> str | None:
    """The additive bias of Attention, ``[.., Sq, Sk]``: the mask (bool: 0 / -inf, float: as is, padded
    with -inf to Sk), causal and sliding-window limits (offset by the past length, or per batch by
    ``nonpad_kv_seqlen - Sq``) and the padding of nonpad_kv_seqlen; ``None`` when there is none."""
    terms = []
    sq, sk = dims.dim_of(ctx, q, 2), dims.dim_of(ctx, keys, 2)
    minus_inf = ctx.const(-np.inf, like)
    if ctx.has_input(3):
        mask = ctx.inputs[3]
        if ctx.elem_type(mask) == TensorProto.BOOL:
            bias = ctx.where(mask, ctx.const(0.0, like), minus_inf)
        else:
            bias = ctx.cast_like(mask, like)
        rank = ctx.known_rank(mask)
        have, want = dims.dims_of(ctx, mask, rank - 1), dims.dims_of(ctx, keys, 2, 3)
        if not (dims.all_known(have, want) and have == want):  # a shorter mask means -inf beyond it
            pads = dims.concat_dims(ctx, [0] * (2 * rank - 1), dims.combine(ctx, "Sub", want, have))
            bias = ctx.op("Pad", bias, dims.as_vector(ctx, pads), minus_inf)
        terms.append(bias)
    causal = bool(ctx.attr("is_causal", 0))
    left, right = int(ctx.attr("left_window_size", -1)), int(ctx.attr("right_window_size", -1))
    nonpad = ctx.inputs[6] if ctx.has_input(6) else None
    allowed = None
    if causal or left >= 0 or right >= 0:
        rows = dims.arange(ctx, sq, ctx.int64s([0]), (-1, 1))
        cols = dims.arange(ctx, sk, ctx.int64s([0]), (1, -1))
        if nonpad is not None:  # per batch: offset = nonpad_kv_seqlen - Sq, as [B, 1, 1, 1]
            offset = ctx.sub(ctx.op("Reshape", nonpad, ctx.int64s([-1, 1, 1, 1])), dims.as_tensor(ctx, sq, nonpad))
            position = ctx.add(rows, offset)
        else:
            position = rows if past == 0 else ctx.add(rows, dims.as_tensor(ctx, past, rows))
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
        cols = dims.arange(ctx, sk, nonpad, (1, 1, 1, -1))
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
    top = reduce_over(ctx, "ReduceMax", z, [-1])
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
        q4, k4, v4 = split_heads(ctx, q, hq), split_heads(ctx, k, hkv), split_heads(ctx, v, hkv)
    else:
        q4, k4, v4 = q, k, v
    past: Scalar = 0
    keys, values = k4, v4
    if ctx.has_input(4):
        past = dims.dim_of(ctx, ctx.inputs[4], 2)
        keys = ctx.op("Concat", ctx.inputs[4], k4, axis=2)
        values = ctx.op("Concat", ctx.inputs[5], v4, axis=2)
    query_heads, kv_heads = dims.dim_of(ctx, q4, 1), dims.dim_of(ctx, keys, 1)
    group: Scalar = (
        query_heads // kv_heads
        if not isinstance(query_heads, str) and not isinstance(kv_heads, str)
        else ctx.op(
            "Div", dims.as_tensor(ctx, query_heads, ctx.int64s([0])), dims.as_tensor(ctx, kv_heads, ctx.int64s([0]))
        )
    )

    def repeat(t: str) -> str:  # [B, Hkv, S, D] -> [B, Hkv * G, S, D], head h reading KV head h // G
        if group == 1:
            return t
        copies = [group] if not isinstance(group, str) else ctx.op("Unsqueeze", group, ctx.int64s([0]))
        tiles = dims.concat_dims(ctx, [1, 1], copies, [1, 1])
        expanded = ctx.op("Expand", ctx.op("Unsqueeze", t, ctx.int64s([2])), dims.as_vector(ctx, tiles))
        return ctx.op(
            "Reshape", expanded, dims.as_vector(ctx, dims.concat_dims(ctx, [0, -1], dims.dims_of(ctx, t, 2, 4)))
        )

    def unrepeat(t: str, like: str) -> str:  # the gradient summed over each group
        if group == 1:
            return t
        grouped = ctx.op(
            "Reshape",
            t,
            dims.as_vector(
                ctx, dims.concat_dims(ctx, [0], dims.dims_of(ctx, like, 1, 2), [-1], dims.dims_of(ctx, like, 2, 4))
            ),
        )
        return ctx.op("ReduceSum", grouped, ctx.int64s([2]), keepdims=0)

    kx, vx = repeat(keys), repeat(values)
    scale = ctx.attr("scale")
    if scale is None:
        depth = dims.dim_of(ctx, q4, 3)
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
        g4 = split_heads(ctx, g_y, hq) if rank == 3 else g_y
        if ctx.needs(2) or ctx.needs(5):
            d_values = unrepeat(ctx.op("MatMul", ctx.op("Transpose", p, perm=t_last), g4), values)
        dp = ctx.op("MatMul", g4, ctx.op("Transpose", vx, perm=t_last))
        dz = ctx.mul(p, ctx.sub(dp, ctx.op("ReduceSum", ctx.mul(dp, p), ctx.int64s([-1]), keepdims=1)))
        if ctx.needs(3):  # a float mask, added to the scores; padded masks get their own columns
            mask = ctx.inputs[3]
            width = dims.dims_of(ctx, mask, ctx.known_rank(mask) - 1)
            cut = ctx.op("Slice", dz, ctx.int64s([0]), dims.as_vector(ctx, width), ctx.int64s([-1]))
            result[3] = ctx.cast_like(unbroadcast(ctx, cut, mask), mask)
        ds = ctx.mul(dz, ctx.sub(1.0, ctx.square(capped))) if cap > 0 else dz
        ds = ctx.mul(ds, scale)  # type: ignore[arg-type]
        if ctx.needs(0):
            dq = ctx.op("MatMul", ds, kx)
            result[0] = merge_heads(ctx, dq, q) if rank == 3 else dq
        if ctx.needs(1) or ctx.needs(4):
            d_keys = unrepeat(ctx.op("MatMul", ctx.op("Transpose", ds, perm=t_last), q4), keys)
    for index, total, present in ((1, d_keys, g_key), (2, d_values, g_value)):
        parts = [t for t in (total, present) if t is not None]
        if not parts:
            continue
        total = parts[0] if len(parts) == 1 else ctx.add(parts[0], parts[1])
        source = ctx.inputs[index]
        if ctx.has_input(index + 3):  # [past; new] along the sequence axis
            length = dims.dims_of(ctx, ctx.inputs[index + 3], 2, 3)
            if ctx.needs(index + 3):
                result[index + 3] = ctx.op(
                    "Slice", total, ctx.int64s([0]), dims.as_vector(ctx, length), ctx.int64s([2])
                )
            total = ctx.op("Slice", total, dims.as_vector(ctx, length), ctx.int64s([dims.INT64_MAX]), ctx.int64s([2]))
        if ctx.needs(index):
            result[index] = merge_heads(ctx, total, source) if rank == 3 else total
    return result


# ------------------------------------------------------------------ RotaryEmbedding


@registry.rule("RotaryEmbedding", opsets=(23, None), inputs=(0,))
def rotary_embedding(ctx: RuleContext, grads: Grads) -> Result:
    """dx = RotaryEmbedding(g, cos, -sin, position_ids): the inverse rotation"""
    # y1 = cos x1 - sin x2, y2 = sin x1 + cos x2 is a rotation per pair; its transpose
    # rotates by -theta. Dimensions past rotary_embedding_dim pass through both ways.
    inputs = list(ctx.inputs)
    inputs[0] = grads[0]  # type: ignore[call-overload]
    inputs[2] = ctx.neg(inputs[2])
    return data_only(ctx, ctx.op("RotaryEmbedding", *inputs, **forward_attributes(ctx)))
