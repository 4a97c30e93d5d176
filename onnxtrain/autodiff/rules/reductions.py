"""Reductions: ReduceSum, ReduceMean, ReduceMax, ... over axes given as attribute or input.

Notation: ``x`` is the input, ``y`` the output and ``g`` its gradient;
``keep(v)`` is ``v`` with the reduced axes restored as size-1 dimensions
(``Unsqueeze`` when ``keepdims=0``), so that it broadcasts against ``x``.
The axes come from the ``axes`` attribute (ReduceSum before opset 13, the
others before 18) or the ``axes`` input, which may be computed at run time;
``noop_with_empty_axes=1`` with empty axes makes the reduction an identity.

Ties of ReduceMax/ReduceMin share the gradient evenly. ReduceProd, ReduceL2
and ReduceLogSum divide by ``x``, ``y`` and ``exp(y)``: their gradients are not
finite where those are zero.
"""

from __future__ import annotations

from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.registry import Grads, Result
from onnxtrain.autodiff.rules._builtin import registry
from onnxtrain.autodiff.rules.backward_helpers import data_only

#: Only the data input is differentiable; the axes input is an integer tensor.
_DATA = (0,)


def _static_axes(ctx: RuleContext) -> list[int] | None:
    """The reduction axes when known while building (``[]`` for none given), else ``None``."""
    if ctx.has_input(1):
        value = ctx.constant_value(ctx.inputs[1])
        return None if value is None else [int(a) for a in value.reshape(-1)]
    return [int(a) for a in ctx.attr("axes", [])]


def _is_identity(ctx: RuleContext) -> bool:
    """Whether the node reduces nothing (empty axes with ``noop_with_empty_axes=1``)."""
    return bool(ctx.attr("noop_with_empty_axes", 0)) and _static_axes(ctx) == []


def keep(ctx: RuleContext, value: str) -> str:
    """``value`` (shaped like the output) with the reduced axes restored as size 1."""
    if ctx.attr("keepdims", 1) or _is_identity(ctx):
        return value
    axes = _static_axes(ctx)
    if axes == []:
        return value  # all axes reduced to a scalar, which broadcasts as it is
    return ctx.op("Unsqueeze", value, ctx.int64s(axes) if axes is not None else ctx.inputs[1])


def _count_keep(ctx: RuleContext, mask: str) -> str:
    """``ReduceSum(mask)`` over the node's axes, with ``keepdims=1``."""
    axes = _static_axes(ctx)
    noop = ctx.attr("noop_with_empty_axes", 0)
    if axes is None:
        return ctx.op("ReduceSum", mask, ctx.inputs[1], keepdims=1, noop_with_empty_axes=noop)
    if not axes:
        return mask if noop else ctx.op("ReduceSum", mask, keepdims=1)
    return ctx.op("ReduceSum", mask, ctx.int64s(axes), keepdims=1)


def _expand(ctx: RuleContext, value: str) -> str:
    return ctx.expand_to(value, ctx.inputs[0])


registry.unary("ReduceSum", "dx = expand(keep(g))", lambda ctx, g, x, y: _expand(ctx, keep(ctx, g)))


@registry.rule("ReduceMean", inputs=_DATA)
def reduce_mean(ctx: RuleContext, grads: Grads) -> Result:
    """dx = expand(keep(g)) * size(y) / size(x)"""
    x, y = ctx.inputs[0], ctx.outputs[0]
    x_shape, y_shape = ctx.static_shape(x), ctx.static_shape(y)
    if x_shape is not None and y_shape is not None:
        count_x = 1
        for d in x_shape:
            count_x *= d
        count_y = 1
        for d in y_shape:
            count_y *= d
        scaled = ctx.mul(keep(ctx, grads[0]), count_y / count_x if count_x else 0.0)
    else:
        ratio = ctx.div(ctx.cast_like(ctx.op("Size", y), x), ctx.cast_like(ctx.op("Size", x), x))
        scaled = ctx.mul(keep(ctx, grads[0]), ratio)
    return data_only(ctx, _expand(ctx, scaled))


def _extremum(ctx: RuleContext, grads: Grads) -> Result:
    """dx = keep(g) * m / keep(sum(m)), m = [x == keep(y)]  (ties share g evenly)"""
    x = ctx.inputs[0]
    mask = ctx.cast_like(ctx.compare("Equal", x, keep(ctx, ctx.outputs[0])), x)
    return data_only(ctx, ctx.mul(mask, ctx.div(keep(ctx, grads[0]), _count_keep(ctx, mask))))


registry.rule("ReduceMax", inputs=_DATA)(_extremum)
registry.rule("ReduceMin", inputs=_DATA)(_extremum)


@registry.rule("ReduceProd", inputs=_DATA)
def reduce_prod(ctx: RuleContext, grads: Grads) -> Result:
    """dx = keep(g) * keep(y) / x  (x != 0)"""
    ky = keep(ctx, ctx.outputs[0])
    return data_only(ctx, ctx.div(ctx.mul(keep(ctx, grads[0]), ky), ctx.inputs[0]))


registry.unary("ReduceSumSquare", "dx = 2 * x * keep(g)", lambda ctx, g, x, y: ctx.mul(ctx.mul(x, 2.0), keep(ctx, g)))
registry.unary("ReduceL1", "dx = sign(x) * keep(g)", lambda ctx, g, x, y: ctx.mul(ctx.op("Sign", x), keep(ctx, g)))


def _l2(ctx: RuleContext, g: str, x: str, y: str) -> str:
    """``x * q``, ``q = keep(g) / keep(y)``, 0 where the norm is 0 (as torch's: ``x`` is all zeros there, and
    ``x / max(norm, eps)``, ``F.normalize``, must not make it NaN); the ``Where`` is over the reduced shape."""
    norm = keep(ctx, y)
    quotient = ctx.div(keep(ctx, g), norm)
    return ctx.mul(x, ctx.where(ctx.compare("Equal", norm, 0.0), 0.0, quotient))


registry.unary("ReduceL2", "dx = x * keep(g) / keep(y), 0 where y = 0", _l2)
registry.unary(
    "ReduceLogSum",
    "dx = expand(keep(g) / exp(keep(y)))",
    lambda ctx, g, x, y: _expand(ctx, ctx.div(keep(ctx, g), ctx.op("Exp", keep(ctx, y)))),
)
registry.unary(
    "ReduceLogSumExp",
    "dx = keep(g) * exp(x - keep(y))  (softmax of x, stable)",
    lambda ctx, g, x, y: ctx.mul(keep(ctx, g), ctx.op("Exp", ctx.sub(x, keep(ctx, y)))),
)
