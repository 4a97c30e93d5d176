"""Gradient rules of the operators ONNX Runtime's transformer optimizer writes (``com.microsoft``, and
its ``LayerNormalization`` / ``SimplifiedLayerNormalization`` registered in ``ai.onnx`` below opset 17).

Fused normalizations, GELUs, rotary embeddings, attention and FusedMatMul; their
gradients are written in standard operators. Notation: ``s = input + skip + bias``
is what a Skip normalization normalizes over its last axis, ``xhat`` the
standardized ``s`` (``(s - mean) * inv``, or ``s * r`` for the RMS forms),
``g`` the output gradient, ``n`` the normalized size.

The optional ``mean`` / ``inv_std_var`` outputs carry gradients like
LayerNormalization's (``g_mean / n`` and ``-g_inv * inv^2 * xhat / n``);
``input_skip_bias_sum`` is ``s`` itself, so its gradient adds to ``ds``.

The standard operators emitted here take their opset-dependent forms (a
reduction's ``axes``, Split's ``num_outputs``) by the model's ``ai.onnx`` opset,
``ctx.onnx_opset``: the node's own opset is its domain's.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

from onnx import TensorProto

from onnxtrain.autodiff import dims
from onnxtrain.autodiff.broadcast import product_grad_dims, unbroadcast
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.registry import Grads, Result, RuleFn
from onnxtrain.autodiff.rules import activations
from onnxtrain.autodiff.rules._builtin import registry
from onnxtrain.autodiff.rules.backward_helpers import (
    rms_scale,
    rms_scale_grad,
    scatter_add_rows,
    split_heads,
    standardize,
    standardize_grad,
)
from onnxtrain.graph import ops

MS = "com.microsoft"
#: QuickGelu's default ``alpha`` (ONNX Runtime's).
_QUICK_GELU_ALPHA = 1.702
#: FastGelu's constants, as ONNX Runtime's kernels have them: sqrt(2 / pi) and 0.044715 sqrt(2 / pi), rounded.
_FAST_GELU_A = 0.797885
_FAST_GELU_B = 0.035677
#: Attention's default ``mask_filter_value`` (ONNX Runtime's).
_MASK_FILTER_VALUE = -10000.0


# ------------------------------------------------------------------ helpers


def _rule(op_type: str, **kwargs: Any) -> Callable[[RuleFn], RuleFn]:
    """``registry.rule(op_type, **kwargs)`` for a rule that first checks its node's inputs have known types."""

    def register(fn: RuleFn) -> RuleFn:
        @functools.wraps(fn)
        def checked(ctx: RuleContext, grads: Grads) -> Result:
            _require_known_types(ctx)
            return list(fn(ctx, grads))

        registry.rule(op_type, **kwargs)(checked)
        return fn

    return register


def _require_known_types(ctx: RuleContext) -> None:
    """``TypeError`` naming the first input of unknown type: onnx's shape inference does not know these
    operators, so a model that chains them must declare their outputs' types."""
    for name in ctx.inputs:
        type_proto = ctx.builder.type_of(name) if name else None
        if name and (type_proto is None or not type_proto.tensor_type.elem_type):
            raise TypeError(
                f"{ctx.node.op_type} node {ctx.node.name!r}: the type of its input {name!r} is unknown (onnx's "
                "shape inference does not know onnxruntime's contrib operators); declare the types of the model's "
                "values first, e.g. model = onnxruntime.tools.symbolic_shape_infer.SymbolicShapeInference"
                ".infer_shapes(model, auto_merge=True)"
            )


def _to_vector(ctx: RuleContext, grad: str, like: str) -> str:
    """``grad`` (``[..., H]``) summed over its leading axes to the 1-D shape of ``like`` (``[H]``)."""
    if ctx.rank(grad) is not None:
        return unbroadcast(ctx, grad, like)
    flat = ctx.op("Reshape", grad, ctx.op("Concat", ctx.int64s([-1]), ctx.op("Shape", like), axis=0))
    return ctx.op("ReduceSum", flat, ctx.int64s([0]), keepdims=0)


def _statistics_terms(
    ctx: RuleContext, x: str, xhat: str, inv: str, g_mean: str | None, g_inv: str | None, n_inv: str | float
) -> list[str]:
    """What gradients of the saved statistics add to ``dx``: ``g_mean / n`` and ``-g_inv inv^2 xhat / n``."""
    terms = []
    if g_inv is not None:
        coefficient = ctx.mul(ctx.cast_like(g_inv, x), ctx.square(inv))
        terms.append(ctx.neg(ctx.mul(ctx.mul(coefficient, xhat), n_inv)))
    if g_mean is not None:
        terms.append(ctx.expand_to(ctx.mul(ctx.cast_like(g_mean, x), n_inv), x))
    return terms


def _last_size_inverse(ctx: RuleContext, x: str) -> str | float:
    """``1 / n``, ``n`` the size of ``x``'s last axis (a constant when known)."""
    x_dims = ctx.shape(x)
    if x_dims is not None and x_dims and isinstance(x_dims[-1], int):
        return 1.0 / int(x_dims[-1])
    last = ctx.op("Slice", ctx.op("Shape", x), ctx.int64s([-1]), ctx.int64s([dims.INT64_MAX]))
    return ctx.op("Reciprocal", ctx.cast_like(last, x))


def _sum_of(ctx: RuleContext, terms: Sequence[str]) -> str:
    return terms[0] if len(terms) == 1 else ctx.op("Sum", *terms)


def _skip_sum(ctx: RuleContext, bias_index: int) -> str:
    """``s = input + skip (+ bias)``: the value a Skip normalization normalizes."""
    s = ctx.add(ctx.inputs[0], ctx.inputs[1])
    return ctx.add(s, ctx.inputs[bias_index]) if ctx.has_input(bias_index) else s


def _skip_result(ctx: RuleContext, ds: str | None, bias_index: int, n_inputs: int) -> Result:
    """Input gradients of a Skip normalization from ``ds``: input, skip (summed to its shape), bias."""
    result: Result = [None] * n_inputs
    if ds is None:
        return result
    result[0] = ds if ctx.needs(0) else None
    result[1] = unbroadcast(ctx, ds, ctx.inputs[1]) if ctx.needs(1) else None
    if ctx.needs(bias_index):
        result[bias_index] = _to_vector(ctx, ds, ctx.inputs[bias_index])
    return result


def _layer_norm_last(
    ctx: RuleContext, s: str, grads: Grads, gamma_index: int = 2, beta_index: int | None = 3
) -> tuple[str | None, Result]:
    """``ds`` of LayerNormalization over the last axis of ``s`` and ``[dgamma, dbeta]``; ``grads``: those of
    the output, the mean, the inverse deviation and ``s``."""
    gamma = ctx.inputs[gamma_index]
    g, g_mean, g_inv, g_sum = [*grads, None, None, None][:4]
    xhat, inv = standardize(ctx, s, [-1], float(ctx.attr("epsilon", 1e-12)))
    terms = []
    if g is not None:
        terms.append(standardize_grad(ctx, ctx.mul(g, gamma), xhat, inv, [-1]))
    if g_mean is not None or g_inv is not None:
        terms += _statistics_terms(ctx, s, xhat, inv, g_mean, g_inv, _last_size_inverse(ctx, s))
    if g_sum is not None:
        terms.append(g_sum)
    params: Result = [None, None]
    if g is not None and ctx.needs(gamma_index):
        params[0] = _to_vector(ctx, ctx.mul(g, xhat), gamma)
    if g is not None and beta_index is not None and ctx.has_input(beta_index) and ctx.needs(beta_index):
        params[1] = _to_vector(ctx, g, ctx.inputs[beta_index])
    return (_sum_of(ctx, terms) if terms else None), params


def _rms_norm_last(ctx: RuleContext, s: str, grads: Grads) -> tuple[str | None, str | None]:
    """``ds`` of the RMS normalization over the last axis of ``s`` (scale input 2), and ``dgamma``."""
    gamma = ctx.inputs[2]
    g, _, g_inv, g_sum = [*grads, None, None, None][:4]
    if grads[1:2] and grads[1] is not None:
        raise ValueError(
            f"{ctx.node.op_type} node {ctx.node.name!r}: its mean output (output 1) is not computed by the RMS "
            "normalization; keep it off the path to the loss"
        )
    xh, r = rms_scale(ctx, s, [-1], float(ctx.attr("epsilon", 1e-12)))
    terms = []
    if g is not None:
        terms.append(rms_scale_grad(ctx, ctx.mul(g, gamma), xh, r, [-1]))
    if g_inv is not None:
        terms += _statistics_terms(ctx, s, xh, r, None, g_inv, _last_size_inverse(ctx, s))
    if g_sum is not None:
        terms.append(g_sum)
    dgamma = _to_vector(ctx, ctx.mul(g, xh), gamma) if g is not None and ctx.needs(2) else None
    return (_sum_of(ctx, terms) if terms else None), dgamma


# ------------------------------------------------------------ normalizations


@_rule("SkipLayerNormalization", domain=MS, inputs=(0, 1, 2, 3, 4))
def skip_layer_norm(ctx: RuleContext, grads: Grads) -> Result:
    """ds = inv (gh - mean(gh) - xhat mean(gh xhat)) + g_sum, gh = g gamma; dinput = dskip = dbias = ds; dgamma = sum(g xhat), dbeta = sum(g)"""  # noqa: E501
    s = _skip_sum(ctx, 4)
    ds, (dgamma, dbeta) = _layer_norm_last(ctx, s, grads)
    result = _skip_result(ctx, ds, 4, len(ctx.inputs))
    result[2] = dgamma
    if ctx.has_input(3):
        result[3] = dbeta
    return result


@_rule("SkipSimplifiedLayerNormalization", domain=MS, inputs=(0, 1, 2, 3))
def skip_simplified_layer_norm(ctx: RuleContext, grads: Grads) -> Result:
    """ds = r (gh - xh mean(gh xh)) + g_sum, gh = g gamma, xh = s r, r = 1 / sqrt(mean(s^2) + eps); dgamma = sum(g xh)"""  # noqa: E501
    s = _skip_sum(ctx, 3)
    ds, dgamma = _rms_norm_last(ctx, s, grads)
    result = _skip_result(ctx, ds, 3, len(ctx.inputs))
    result[2] = dgamma
    return result


def _embedding_grad(ctx: RuleContext, table: str, rows: str, grad: str, ids: str) -> str:
    """``d table[r] = sum(grad[b, s] for rows[b, s] == r)``, ``rows`` broadcast to the shape of ``ids``."""
    rows = ctx.op("Expand", ctx.cast(rows, TensorProto.INT64), ctx.op("Shape", ids))
    static = ctx.static_shape(table)
    if static is not None:
        count = ctx.const(static[0], rows)
    else:
        count = ctx.op("Squeeze", ctx.op("Slice", ctx.op("Shape", table), ctx.int64s([0]), ctx.int64s([1])))
    return scatter_add_rows(ctx, rows, grad, count, table)


@_rule("EmbedLayerNormalization", domain=MS, inputs=(2, 3, 4, 5, 6))
def embed_layer_norm(ctx: RuleContext, grads: Grads) -> Result:
    """e = W[ids] + P[positions] + G[segments]: de = inv (gh - mean(gh) - xhat mean(gh xhat)) + g_sum, gh = g gamma; dW[i] = sum(de where ids == i), likewise dP, dG; dgamma = sum(g xhat), dbeta = sum(g)"""  # noqa: E501
    # positions: position_ids ([B, S] or [1, S]) when given, else 0 .. S - 1; outputs: y, the
    # mask index (an integer count, no gradient) and embedding_sum e.
    ids = ctx.inputs[0]
    positions = ctx.inputs[8] if ctx.has_input(8) else _arange_of(ctx, ids, 1)
    tables = [(2, ids), (3, positions)] + ([(4, ctx.inputs[1])] if ctx.has_input(4) else [])
    looked_up = [ctx.op("Gather", ctx.inputs[t], ctx.cast(rows, TensorProto.INT64)) for t, rows in tables]
    e = looked_up[0]
    for part in looked_up[1:]:
        e = ctx.add(e, part)
    g_sum = grads[2] if len(grads) > 2 else None
    de, (dgamma, dbeta) = _layer_norm_last(ctx, e, [grads[0], None, None, g_sum], gamma_index=5, beta_index=6)
    result: Result = [None] * len(ctx.inputs)
    result[5], result[6] = dgamma, dbeta
    if de is not None:
        for t, rows in tables:
            if ctx.needs(t):
                result[t] = _embedding_grad(ctx, ctx.inputs[t], rows, de, ids)
    return result


def _normalized_axes(ctx: RuleContext, x: str) -> list[int]:
    """The normalized axes, ``axis`` to the last: counted from the end when ``axis`` is negative and the rank
    of ``x`` unknown (onnx's inference can lose it in graphs ONNX Runtime rewrote), else from the start."""
    axis = int(ctx.attr("axis", -1))
    if axis < 0 and ctx.rank(x) is None:
        return list(range(axis, 0))
    rank = ctx.known_rank(x)
    return list(range(axis % rank, rank))


def _inverse_size(ctx: RuleContext, x: str, axes: list[int]) -> str | float:
    """``1 / n``, ``n`` the number of normalized elements per row."""
    size = dims.dims_of(ctx, x, axes[0])
    if isinstance(size, list):
        return 1.0 / math.prod(size)
    return ctx.op("Reciprocal", ctx.cast_like(ctx.op("ReduceProd", size, keepdims=0), x))


@_rule("LayerNormalization", opsets=(1, 16), inputs=(0, 1, 2))
def layer_norm_contrib(ctx: RuleContext, grads: Grads) -> Result:
    """(ONNX Runtime's, below opset 17) dx = inv (gh - mean(gh) - xhat mean(gh xhat)), gh = g scale; dscale = sum(g xhat), dB = sum(g)"""  # noqa: E501
    # onnx defines LayerNormalization from opset 17 (normalization.layer_norm); below, ONNX Runtime
    # registers its own with the same math, whose Mean / InvStdDev are recomputed here.
    x, scale = ctx.inputs[:2]
    axes = _normalized_axes(ctx, x)
    g, g_mean, g_inv = [*grads, None, None][:3]
    xhat, inv = standardize(ctx, x, axes, ctx.attr("epsilon", 1e-5))
    terms = []
    if g is not None:
        terms.append(standardize_grad(ctx, ctx.mul(g, scale), xhat, inv, axes))
    if g_mean is not None or g_inv is not None:
        terms += _statistics_terms(ctx, x, xhat, inv, g_mean, g_inv, _inverse_size(ctx, x, axes))
    dx = _sum_of(ctx, terms) if terms and ctx.needs(0) else None
    dscale = unbroadcast(ctx, ctx.mul(g, xhat), scale) if g is not None and ctx.needs(1) else None
    dbias = unbroadcast(ctx, g, ctx.inputs[2]) if g is not None and ctx.has_input(2) and ctx.needs(2) else None
    return [dx, dscale, dbias][: len(ctx.inputs)]


@_rule("SimplifiedLayerNormalization", inputs=(0, 1))
def simplified_layer_norm(ctx: RuleContext, grads: Grads) -> Result:
    """(ONNX Runtime's RMSNorm) dx = r (gh - xh mean(gh xh)), gh = g scale, xh = x r, r = 1 / sqrt(mean(x^2) + eps); dscale = sum(g xh)"""  # noqa: E501
    x, scale = ctx.inputs[:2]
    axes = _normalized_axes(ctx, x)
    g, g_inv = [*grads, None][:2]
    xh, r = rms_scale(ctx, x, axes, float(ctx.attr("epsilon", 1e-5)))
    terms = []
    if g is not None:
        terms.append(rms_scale_grad(ctx, ctx.mul(g, scale), xh, r, axes))
    if g_inv is not None:
        terms += _statistics_terms(ctx, x, xh, r, None, g_inv, _inverse_size(ctx, x, axes))
    dx = _sum_of(ctx, terms) if terms and ctx.needs(0) else None
    dscale = unbroadcast(ctx, ctx.mul(g, xh), scale) if g is not None and ctx.needs(1) else None
    return [dx, dscale]


# --------------------------------------------------------------------- GELUs


def _biased(ctx: RuleContext, index: int) -> str:
    """``x + bias`` when the bias input ``index`` is present, else ``x``."""
    return ctx.add(ctx.inputs[0], ctx.inputs[index]) if ctx.has_input(index) else ctx.inputs[0]


@_rule("Gelu", domain=MS, inputs=(0,))
def gelu(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g (Phi(x) + x phi(x))"""
    return [ctx.mul(grads[0], activations.gelu_erf_derivative(ctx, ctx.inputs[0]))]  # type: ignore[arg-type]


@_rule("BiasGelu", domain=MS, inputs=(0, 1), broadcasting=True)
def bias_gelu(ctx: RuleContext, grads: Grads) -> Result:
    """dA = dB = g (Phi(u) + u phi(u)), u = A + B"""
    d = ctx.mul(grads[0], activations.gelu_erf_derivative(ctx, _biased(ctx, 1)))  # type: ignore[arg-type]
    return [d, d]


@_rule("BiasSplitGelu", domain=MS, inputs=(0, 1))
def bias_split_gelu(ctx: RuleContext, grads: Grads) -> Result:
    """u = X + bias = [a, b] (halves of the last axis), y = a Gelu(b): dX = dbias = [g Gelu(b), g a (Phi(b) + b phi(b))]"""  # noqa: E501
    # ONNX Runtime's fusion of Add, two Slices, Gelu (erf) and Mul (a GEGLU); its kernel is CUDA's only
    u = ctx.add(ctx.inputs[0], ctx.inputs[1])
    a, b = ctx.op_n("Split", 2, u, axis=-1, **ops.even_split(2, ctx.onnx_opset))
    cdf = ctx.mul(ctx.add(ctx.op("Erf", ctx.mul(b, 1.0 / math.sqrt(2.0))), 1.0), 0.5)
    pdf = ctx.mul(ctx.op("Exp", ctx.mul(ctx.square(b), -0.5)), 1.0 / math.sqrt(2.0 * math.pi))
    g = grads[0]
    da = ctx.mul(g, ctx.mul(b, cdf))
    db = ctx.mul(ctx.mul(g, a), ctx.add(cdf, ctx.mul(b, pdf)))
    d = ctx.op("Concat", da, db, axis=-1)  # X's shape; the bias's gradient sums it over the leading axes
    return [d, unbroadcast(ctx, d, ctx.inputs[1]) if ctx.needs(1) else None]


@_rule("FastGelu", domain=MS, inputs=(0, 1), broadcasting=True)
def fast_gelu(ctx: RuleContext, grads: Grads) -> Result:
    """dX = dbias = g s (1 + u (1 - s) (2a + 6 b u^2)), s = sigmoid(2 (a u + b u^3)), u = X + bias, a = 0.797885, b = 0.035677"""  # noqa: E501
    # u (1 + tanh(a u + b u^3)) / 2 = u s; ONNX Runtime's constants, rounded: a = sqrt(2 / pi), b = 0.044715 a
    derivative = activations.gelu_tanh_derivative(ctx, _biased(ctx, 1), 2.0 * _FAST_GELU_A, 2.0 * _FAST_GELU_B)
    d = ctx.mul(grads[0], derivative)  # type: ignore[arg-type]
    return [d, d if ctx.has_input(1) else None][: len(ctx.inputs)]


@_rule("QuickGelu", domain=MS, inputs=(0,))
def quick_gelu(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g (s + alpha y (1 - s)), s = sigmoid(alpha x)"""
    alpha = float(ctx.attr("alpha", _QUICK_GELU_ALPHA))
    derivative = activations.sigmoid_gated_derivative(ctx, ctx.inputs[0], ctx.outputs[0], alpha)
    return [ctx.mul(grads[0], derivative)]  # type: ignore[arg-type]


# ------------------------------------------------------------------ FusedMatMul


def _swap_last(ctx: RuleContext, x: str, rank: int) -> str:
    perm = list(range(rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return ctx.op("Transpose", x, perm=perm)


@_rule("FusedMatMul", domain=MS, inputs=(0, 1))
def fused_matmul(ctx: RuleContext, grads: Grads) -> Result:
    """Y = alpha op(A) op(B): dop(A) = alpha g op(B)^T, dop(B) = alpha op(A)^T g, transposed back where op is"""
    # op() swaps the last two axes where transA / transB is set (on operands of rank >= 2);
    # 1-D operands are promoted as in MatMul, and broadcast batch axes are summed back.
    if ctx.attr("transBatchA", 0) or ctx.attr("transBatchB", 0):
        raise ValueError(
            f"FusedMatMul node {ctx.node.name!r}: transBatchA / transBatchB have no gradient rule; export the "
            "model without that fusion (onnxruntime's optimizer writes it only at opt_level >= 2)"
        )
    a, b = ctx.inputs
    rank_a, rank_b = ctx.known_rank(a), ctx.known_rank(b)
    trans_a = bool(ctx.attr("transA", 0)) and rank_a >= 2
    trans_b = bool(ctx.attr("transB", 0)) and rank_b >= 2
    a2 = ctx.op("Unsqueeze", a, ctx.int64s([0])) if rank_a == 1 else (_swap_last(ctx, a, rank_a) if trans_a else a)
    b2 = ctx.op("Unsqueeze", b, ctx.int64s([1])) if rank_b == 1 else (_swap_last(ctx, b, rank_b) if trans_b else b)
    g = ctx.mul(grads[0], float(ctx.attr("alpha", 1.0)))  # type: ignore[arg-type]
    if rank_a == 1 and rank_b == 1:
        g = ctx.op("Unsqueeze", g, ctx.int64s([0, 1]))
    elif rank_a == 1:
        g = ctx.op("Unsqueeze", g, ctx.int64s([-2]))
    elif rank_b == 1:
        g = ctx.op("Unsqueeze", g, ctx.int64s([-1]))
    ra, rb = max(rank_a, 2), max(rank_b, 2)
    da = db = None
    if ctx.needs(0):
        da = ctx.op("MatMul", g, _swap_last(ctx, b2, rb))
        da = _swap_last(ctx, da, ctx.known_rank(da)) if trans_a else da
        if rank_a >= 2:
            known = product_grad_dims(ctx, ctx.outputs[0], a) if rank_b >= 2 else None
            da = unbroadcast(ctx, da, a, grad_dims=known)
        else:
            da = ctx.op("Reshape", unbroadcast(ctx, da, a2), ctx.shape_of(a))
    if ctx.needs(1):
        db = ctx.op("MatMul", _swap_last(ctx, a2, ra), g)
        db = _swap_last(ctx, db, ctx.known_rank(db)) if trans_b else db
        if rank_b >= 2:
            known = product_grad_dims(ctx, ctx.outputs[0], b) if rank_a >= 2 else None
            db = unbroadcast(ctx, db, b, grad_dims=known)
        else:
            db = ctx.op("Reshape", unbroadcast(ctx, db, b2), ctx.shape_of(b))
    return [da, db]


# -------------------------------------------------------------------- attention


def _attention_allowed(ctx: RuleContext, mask: str | None, x: str, rows: str, cols: str, causal: bool) -> str | None:
    """Where attention is allowed, ``[B or 1, 1, S, T]`` bool (``None``: everywhere), as onnxruntime's CPU
    kernels read ``mask``: ``[B, T]`` / ``[B, S, T]`` raw (non-zero: attend), ``[B]`` end positions
    (right padding), ``[2B]`` end then start positions (left padding); ``causal``: column <= row."""
    allowed = None
    if mask is not None:
        rank = ctx.known_rank(mask)
        if rank in (2, 3):
            allowed = ctx.compare("Greater", mask, ctx.const(0, mask))
            allowed = ctx.op("Unsqueeze", allowed, ctx.int64s([1, 2] if rank == 2 else [1]))
        elif rank == 1:
            positions = ctx.cast(mask, TensorProto.INT64)
            batch = ctx.op("Slice", ctx.op("Shape", x), ctx.int64s([0]), ctx.int64s([1]))
            end = ctx.op("Slice", positions, ctx.int64s([0]), batch)
            # a [B] mask has no start positions: they are the zeros appended
            padded = ctx.op(
                "Concat", positions, ctx.op("ConstantOfShape", batch, value=dims.fill_value(ctx, positions, 0)), axis=0
            )
            start = ctx.op("Slice", padded, batch, ctx.op("Add", batch, batch))
            column = ctx.op("Reshape", cols, ctx.int64s([1, 1, 1, -1]))

            def per_batch(v: str) -> str:
                return ctx.op("Reshape", v, ctx.int64s([-1, 1, 1, 1]))

            allowed = ctx.op(
                "And",
                ctx.compare("Less", column, per_batch(end)),
                ctx.compare("GreaterOrEqual", column, per_batch(start)),
            )
        else:
            raise ValueError(
                f"{ctx.node.op_type} node {ctx.node.name!r}: a mask of rank {rank} (the 4-D Megatron mask, or the "
                "packed [3B + 2] index) has no gradient rule; give a [B, T] or [B, S, T] mask, or [B] / [2B] positions"
            )
    if causal:
        later = ctx.compare(
            "LessOrEqual", ctx.op("Reshape", cols, ctx.int64s([1, -1])), ctx.op("Reshape", rows, ctx.int64s([-1, 1]))
        )
        allowed = later if allowed is None else ctx.op("And", allowed, later)
    return allowed


def _arange_of(ctx: RuleContext, x: str, axis: int) -> str:
    """``0, 1, ..., x.shape[axis] - 1`` as int64."""
    size = ctx.op("Squeeze", ctx.op("Slice", ctx.op("Shape", x), ctx.int64s([axis]), ctx.int64s([axis + 1])))
    return ctx.op("Range", ctx.const(0, size), size, ctx.const(1, size))


def _scaled_dot_product_grads(
    ctx: RuleContext, g: str, q4: str, k4: str, v4: str, heads: int, allowed: str | None, bias_input: int | None
) -> tuple[str, str, str, str | None]:
    """dq, dk, dv (``[B, S, H]`` layouts) and d attention_bias of ``softmax(scale q k^T + bias + mask) v``."""
    depth = dims.dims_of(ctx, q4, 3, 4)
    if ctx.attr("scale") is not None and float(ctx.attr("scale")) != 0.0:
        scale: str | float = float(ctx.attr("scale"))
    elif isinstance(depth, list):
        scale = 1.0 / math.sqrt(depth[0])
    else:
        scale = ctx.op("Reciprocal", ctx.op("Sqrt", ctx.cast_like(depth, q4)))
    t_last = [0, 1, 3, 2]
    z = ctx.mul(ctx.op("MatMul", q4, ctx.op("Transpose", k4, perm=t_last)), scale)
    if bias_input is not None:
        z = ctx.add(z, ctx.inputs[bias_input])
    if allowed is not None:
        masked = ctx.const(float(ctx.attr("mask_filter_value", _MASK_FILTER_VALUE)), q4)
        z = ctx.add(z, ctx.where(allowed, ctx.const(0.0, q4), masked))
    p = ctx.op("Softmax", z, axis=-1)
    g4 = split_heads(ctx, g, heads)
    dv = ctx.op("MatMul", ctx.op("Transpose", p, perm=t_last), g4)
    dp = ctx.op("MatMul", g4, ctx.op("Transpose", v4, perm=t_last))
    dz = ctx.mul(p, ctx.sub(dp, ctx.op("ReduceSum", ctx.mul(dp, p), ctx.int64s([-1]), keepdims=1)))
    d_bias = None
    if bias_input is not None and ctx.needs(bias_input):
        d_bias = unbroadcast(ctx, dz, ctx.inputs[bias_input])
    ds = ctx.mul(dz, scale)
    dq = ctx.op("MatMul", ds, k4)
    dk = ctx.op("MatMul", ctx.op("Transpose", ds, perm=t_last), q4)
    return _merge(ctx, dq), _merge(ctx, dk), _merge(ctx, dv), d_bias


def _merge(ctx: RuleContext, t: str) -> str:
    """``[B, N, S, D]`` as ``[B, S, N * D]``."""
    return ctx.op("Reshape", ctx.op("Transpose", t, perm=[0, 2, 1, 3]), ctx.int64s([0, 0, -1]))


def _no_state(ctx: RuleContext, indices: Sequence[int], outputs: Sequence[int], what: str) -> None:
    """Refuse the key / value cache inputs and outputs, which inference uses and training does not."""
    present = [i for i in indices if ctx.has_input(i)] + [o for o in outputs if len(ctx.outputs) > o and ctx.outputs[o]]
    if present or ctx.attr("do_rotary", 0) or ctx.attr("past_present_share_buffer", 0):
        raise ValueError(
            f"{ctx.node.op_type} node {ctx.node.name!r}: {what}, do_rotary and past_present_share_buffer have no "
            "gradient rule (they serve generation); export the model for training without a key / value cache"
        )


@_rule("Attention", domain=MS, inputs=(0, 1, 2, 5))
def attention_contrib(ctx: RuleContext, grads: Grads) -> Result:
    """dqkv = [dQ, dK, dV] by heads (dV = P^T g, dS = P (dP - sum(dP P)), dP = g V^T, dQ = s dS K, dK = s dS^T Q); dx = dqkv W^T, dW = x^T dqkv, dbias = sum(dqkv)"""  # noqa: E501
    # [Q, K, V] = x W + bias, split by qkv_hidden_sizes (three equal parts by default), heads by
    # num_heads; P = softmax(s Q K^T + attention_bias + mask), s = scale or 1 / sqrt(head size), the
    # mask adding mask_filter_value (-10000) where mask_index or unidirectional forbids.
    _no_state(ctx, (4, 6), (1,), "past, past_sequence_length and present")
    x, w = ctx.inputs[:2]
    heads = int(ctx.attr("num_heads"))
    qkv = ctx.op("MatMul", x, w)
    if ctx.has_input(2):
        qkv = ctx.add(qkv, ctx.inputs[2])
    sizes = ctx.attr("qkv_hidden_sizes")
    if sizes:
        q, k, v = ctx.op_n("Split", 3, qkv, ctx.int64s([int(d) for d in sizes]), axis=-1)
    else:
        q, k, v = ctx.op_n("Split", 3, qkv, axis=-1, **ops.even_split(3, ctx.onnx_opset))
    q4, k4, v4 = split_heads(ctx, q, heads), split_heads(ctx, k, heads), split_heads(ctx, v, heads)
    mask = ctx.inputs[3] if ctx.has_input(3) else None
    positions = _arange_of(ctx, x, 1)
    allowed = _attention_allowed(ctx, mask, x, positions, positions, bool(ctx.attr("unidirectional", 0)))
    bias_input = 5 if ctx.has_input(5) else None
    dq, dk, dv, d_bias = _scaled_dot_product_grads(ctx, grads[0], q4, k4, v4, heads, allowed, bias_input)  # type: ignore[arg-type]
    dqkv = ctx.op("Concat", dq, dk, dv, axis=-1)
    result: Result = [None] * len(ctx.inputs)
    if ctx.needs(0):
        result[0] = ctx.op("MatMul", dqkv, ctx.op("Transpose", w, perm=[1, 0]))
    if ctx.needs(1):
        rank = ctx.known_rank(x)
        result[1] = ctx.op(
            "Gemm", ctx.op("Flatten", x, axis=rank - 1), ctx.op("Flatten", dqkv, axis=rank - 1), transA=1
        )
    if ctx.has_input(2) and ctx.needs(2):
        result[2] = _to_vector(ctx, dqkv, ctx.inputs[2])
    if bias_input is not None:
        result[5] = d_bias
    return result


@_rule("MultiHeadAttention", domain=MS, inputs=(0, 1, 2, 3, 5))
def multi_head_attention(ctx: RuleContext, grads: Grads) -> Result:
    """dV = P^T g, dS = P (dP - sum(dP P)), dP = g V^T, dQ = s dS K, dK = s dS^T Q (by heads); dbias = [sum dQ, sum dK, sum dV]"""  # noqa: E501
    # Q, K, V = query, key, value ([B, S or L, hidden]) plus their parts of bias; P = softmax(s Q K^T
    # + attention_bias + mask), the mask adding mask_filter_value where key_padding_mask or
    # unidirectional (key position <= query position) forbids.
    _no_state(ctx, (6, 7, 8, 9), (1, 2), "past_key, past_value, past_sequence_length, cache_indirection, present")
    if len(grads) > 3 and grads[3] is not None:
        raise ValueError(
            f"MultiHeadAttention node {ctx.node.name!r}: its qk output (output 3) is a debugging output without a "
            "gradient rule; keep it off the path to the loss"
        )
    if not (ctx.has_input(1) and ctx.has_input(2)) or any(ctx.known_rank(ctx.inputs[i]) != 3 for i in range(3)):
        raise ValueError(
            f"MultiHeadAttention node {ctx.node.name!r}: only separate 3-D query, key and value [B, S, hidden] have a "
            "gradient rule (not packed QKV / KV, nor keys already split into heads)"
        )
    query, key, value = ctx.inputs[:3]
    heads = int(ctx.attr("num_heads"))
    parts = [query, key, value]
    biases: list[str] = []
    if ctx.has_input(3):
        widths = [ctx.op("Slice", ctx.op("Shape", t), ctx.int64s([-1]), ctx.int64s([3])) for t in parts]
        biases = ctx.op_n("Split", 3, ctx.inputs[3], ctx.op("Concat", *widths, axis=0), axis=0)
        parts = [ctx.add(t, b) for t, b in zip(parts, biases, strict=True)]
    q4, k4, v4 = (split_heads(ctx, t, heads) for t in parts)
    mask = ctx.inputs[4] if ctx.has_input(4) else None
    causal = bool(ctx.attr("unidirectional", 0))
    allowed = _attention_allowed(ctx, mask, query, _arange_of(ctx, query, 1), _arange_of(ctx, key, 1), causal)
    bias_input = 5 if ctx.has_input(5) else None
    dq, dk, dv, d_bias = _scaled_dot_product_grads(ctx, grads[0], q4, k4, v4, heads, allowed, bias_input)  # type: ignore[arg-type]
    result: Result = [None] * len(ctx.inputs)
    result[:3] = [dq, dk, dv]
    if ctx.has_input(3) and ctx.needs(3):
        sums = (_to_vector(ctx, d, b) for d, b in zip((dq, dk, dv), biases, strict=True))
        result[3] = ctx.op("Concat", *sums, axis=0)
    if bias_input is not None:
        result[5] = d_bias
    return result


# ------------------------------------------------------------------ RotaryEmbedding


def _rotary_angles(ctx: RuleContext, cache: str, positions: str, like: str, transposed: bool) -> str:
    """Rows of ``cache`` at the positions, as ``[B or 1, S, 1, R/2]`` (``[B or 1, 1, S, R/2]`` when
    ``transposed``): ``position_ids[b, s]``, or ``position_ids[0] + s`` for a ``[1]`` start."""
    if ctx.known_rank(positions) == 2:
        rows = ctx.op("Gather", cache, positions)
    else:
        steps = _arange_of(ctx, like, 2 if transposed else 1)
        rows = ctx.op("Unsqueeze", ctx.op("Gather", cache, ctx.add(steps, positions)), ctx.int64s([0]))
    return ctx.op("Unsqueeze", rows, ctx.int64s([1 if transposed else 2]))


@_rule("RotaryEmbedding", domain=MS, inputs=(0,))
def rotary_embedding_contrib(ctx: RuleContext, grads: Grads) -> Result:
    """dx = the inverse rotation of g: dx_a = g_a cos + g_b sin, dx_b = g_b cos - g_a sin per rotated pair (a, b)"""
    # Forward: y_a = x_a cos - x_b sin, y_b = x_b cos + x_a sin, pairs (i, i + R/2) or (2i, 2i + 1)
    # (interleaved) of the first R = rotary_embedding_dim (2 * cache width) entries of each head;
    # the rest of the head passes through. Input [B, S, N * D] or [B, N, S, D] (transposed).
    if ctx.attr("is_packed_batching", 0):
        raise ValueError(
            f"RotaryEmbedding node {ctx.node.name!r}: is_packed_batching has no gradient rule; use padded batches"
        )
    g = grads[0]
    x, positions, cos_cache, sin_cache = ctx.inputs[:4]
    rank = ctx.known_rank(x)
    transposed = rank == 4
    half = dims.dims_of(ctx, cos_cache, 1, 2)
    rotary = int(ctx.attr("rotary_embedding_dim", 0))
    width: list[int] | str = [rotary] if rotary else (half if not isinstance(half, list) else [2 * half[0]])
    if isinstance(width, str):
        width = ctx.op("Mul", half, ctx.int64s([2]))
    if not transposed:  # [B, S, N, D]
        heads = int(ctx.attr("num_heads", 0))
        shape = (
            ctx.int64s([0, 0, heads, -1])
            if heads
            else ctx.op("Concat", ctx.int64s([0, 0, -1]), dims.as_vector(ctx, width), axis=0)
        )
        g = ctx.op("Reshape", g, shape)  # type: ignore[arg-type]
    cos = _rotary_angles(ctx, cos_cache, positions, x, transposed)
    sin = _rotary_angles(ctx, sin_cache, positions, x, transposed)
    last = ctx.int64s([-1])
    rotated = ctx.op("Slice", g, ctx.int64s([0]), dims.as_vector(ctx, width), last)  # type: ignore[arg-type]
    rest = ctx.op("Slice", g, dims.as_vector(ctx, width), ctx.int64s([dims.INT64_MAX]), last)  # type: ignore[arg-type]
    if ctx.attr("interleaved", 0):
        pairs = ctx.op("Reshape", rotated, ctx.int64s([0, 0, 0, -1, 2]))
        a, b = ctx.op_n("Split", 2, pairs, ctx.int64s([1, 1]), axis=-1)
        cos, sin = (ctx.op("Unsqueeze", t, last) for t in (cos, sin))
    else:
        a, b = ctx.op_n(
            "Split", 2, rotated, ctx.op("Concat", dims.as_vector(ctx, half), dims.as_vector(ctx, half), axis=0), axis=-1
        )
    da = ctx.add(ctx.mul(a, cos), ctx.mul(b, sin))
    db = ctx.sub(ctx.mul(b, cos), ctx.mul(a, sin))
    back = ctx.op("Concat", da, db, axis=-1)
    if ctx.attr("interleaved", 0):
        back = ctx.op("Reshape", back, ctx.int64s([0, 0, 0, -1]))
    dx = ctx.op("Reshape", ctx.op("Concat", back, rest, axis=-1), ctx.shape_of(x))
    return [dx, None, None, None]
