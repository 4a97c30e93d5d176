"""Element-wise operators: arithmetic, activations, selection and casts (and Det and OneHot, whose
gradients are as short).

Notation: ``x`` (``a``, ``b``) are the inputs, ``y`` the output and ``g`` the
gradient of the loss with respect to ``y``. Broadcasting rules return
output-shaped gradients; the engine sums them back to the inputs' shapes.

Conventions at points where the derivative is undefined: kinks take the
derivative of the right-hand piece only where the function is ``x`` there
(``Relu'(0) = 0``, ``Abs'(0) = 0``), ``Clip`` passes the gradient to ``x`` on
its (closed) interval, and ``Min``/``Max`` split the gradient evenly among tied
inputs (as JAX and PyTorch do), so the input gradients always sum to ``g``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from onnx import TensorProto

from onnxtrain.autodiff import sized
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.registry import OpsetRange
from onnxtrain.autodiff.rules._builtin import REGISTRY as registry

Grads = Sequence["str | None"]
Result = list["str | None"]


def unary(
    op_type: str, opsets: OpsetRange | None = None
) -> Callable[[Callable[[RuleContext, str, str], str]], Callable]:
    """Register ``dx = g * f'(x)`` for a one-input operator from ``f'``, given ``(ctx, x, y)``."""

    def register(derivative: Callable[[RuleContext, str, str], str]) -> Callable:
        def rule(ctx: RuleContext, grads: Grads) -> Result:
            return [ctx.mul(grads[0], derivative(ctx, ctx.inputs[0], ctx.outputs[0]))]

        rule.__doc__ = derivative.__doc__
        rule.__name__ = rule.__qualname__ = derivative.__name__
        rule.__module__ = derivative.__module__
        registry.rule(op_type, opsets=opsets, inputs=(0,))(rule)
        return derivative

    return register


# ------------------------------------------------------------------ arithmetic


@registry.rule("Add", broadcasting=True)
def add(ctx: RuleContext, grads: Grads) -> Result:
    """da = g, db = g"""
    return [grads[0], grads[0]]


@registry.rule("Sub", broadcasting=True)
def sub(ctx: RuleContext, grads: Grads) -> Result:
    """da = g, db = -g"""
    (g,) = grads
    return [g, ctx.neg(g) if ctx.needs(1) else None]


@registry.rule("Mul", broadcasting=True)
def mul(ctx: RuleContext, grads: Grads) -> Result:
    """da = g * b, db = g * a"""
    (g,) = grads
    a, b = ctx.inputs
    return [ctx.mul(g, b), ctx.mul(g, a)]


@registry.rule("Div", broadcasting=True)
def div(ctx: RuleContext, grads: Grads) -> Result:
    """da = g / b, db = -g * y / b"""
    (g,) = grads
    da = ctx.div(g, ctx.inputs[1])
    return [da, ctx.neg(ctx.mul(da, ctx.outputs[0]))]


@registry.rule("Neg", inputs=(0,))
def neg(ctx: RuleContext, grads: Grads) -> Result:
    """dx = -g"""
    return [ctx.neg(grads[0])]


@registry.rule("Pow", broadcasting=True)
def pow_(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g * p * x**(p - 1), dp = g * y * log(x) (0 where x = 0)"""
    (g,) = grads
    x, p = ctx.inputs
    y = ctx.outputs[0]
    p_float = ctx.cast_like(p, x)
    dx = ctx.mul(g, ctx.mul(p_float, ctx.op("Pow", x, ctx.sub(p_float, 1.0)))) if ctx.needs(0) else None
    dp = None
    if ctx.needs(1):
        is_zero = ctx.compare("Equal", x, 0.0)
        log_x = ctx.op("Log", ctx.where(is_zero, 1.0, x))
        dp = ctx.mul(ctx.mul(g, y), log_x)
    return [dx, dp]


@registry.rule("Reciprocal", inputs=(0,))
def reciprocal(ctx: RuleContext, grads: Grads) -> Result:
    """dx = -g * y**2"""
    return [ctx.neg(ctx.mul(grads[0], ctx.square(ctx.outputs[0])))]


@registry.rule("Sqrt", inputs=(0,))
def sqrt(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g * 0.5 / y"""
    return [ctx.div(ctx.mul(grads[0], 0.5), ctx.outputs[0])]


@registry.rule("Exp", inputs=(0,))
def exp(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g * y"""
    return [ctx.mul(grads[0], ctx.outputs[0])]


@registry.rule("Log", inputs=(0,))
def log(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g / x"""
    return [ctx.div(grads[0], ctx.inputs[0])]


@registry.rule("Abs", inputs=(0,))
def abs_(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g * sign(x)  (0 at x = 0)"""
    return [ctx.mul(grads[0], ctx.op("Sign", ctx.inputs[0]))]


@registry.rule("Identity", inputs=(0,))
def identity(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g"""
    return [grads[0]]


@registry.rule("Cast", inputs=(0,))
def cast(ctx: RuleContext, grads: Grads) -> Result:
    """dx = cast(g, type of x); a cast from an integer type has no gradient"""
    return [ctx.cast_like(grads[0], ctx.inputs[0])]


# ----------------------------------------------------------- variadic and selection


@registry.rule("Sum", broadcasting=True)
def sum_(ctx: RuleContext, grads: Grads) -> Result:
    """dx_i = g"""
    return [grads[0]] * len(ctx.inputs)


@registry.rule("Mean", broadcasting=True)
def mean(ctx: RuleContext, grads: Grads) -> Result:
    """dx_i = g / n"""
    share = ctx.div(grads[0], float(len(ctx.inputs)))
    return [share] * len(ctx.inputs)


def _extremum(ctx: RuleContext, grads: Grads) -> Result:
    """dx_i = g * [x_i == y] / #{j: x_j == y}  (ties share g evenly)"""
    (g,) = grads
    if len(ctx.inputs) == 1:
        return [g]
    y = ctx.outputs[0]
    masks = [ctx.cast_like(ctx.compare("Equal", x, y), y) for x in ctx.inputs]
    count = masks[0] if len(masks) == 1 else ctx.op("Sum", *masks)
    share = ctx.div(g, count)
    return [ctx.mul(share, mask) if ctx.needs(i) else None for i, mask in enumerate(masks)]


registry.rule("Max", broadcasting=True)(_extremum)
registry.rule("Min", broadcasting=True)(_extremum)


@registry.rule("Where", inputs=(1, 2), broadcasting=True)
def where(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g where c, dy = g where not c"""
    (g,) = grads
    c = ctx.inputs[0]
    dx = ctx.where(c, g, 0.0) if ctx.needs(1) else None
    dy = ctx.where(c, 0.0, g) if ctx.needs(2) else None
    return [None, dx, dy]


@registry.rule("Clip", broadcasting=True)
def clip(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g where min <= x <= max, dmin = g where x < min, dmax = g where x > max  (assumes min <= max)"""
    (g,) = grads
    x = ctx.inputs[0]
    lo = ctx.inputs[1] if ctx.has_input(1) else None
    hi = ctx.inputs[2] if ctx.has_input(2) else None
    inside = [ctx.compare(op, x, bound) for op, bound in (("GreaterOrEqual", lo), ("LessOrEqual", hi)) if bound]
    dx = None
    if ctx.needs(0):
        mask = inside[0] if len(inside) == 1 else ctx.op("And", *inside) if inside else None
        dx = g if mask is None else ctx.where(mask, g, 0.0)
    dlo = ctx.where(ctx.compare("Less", x, lo), g, 0.0) if lo and ctx.needs(1) else None
    dhi = ctx.where(ctx.compare("Greater", x, hi), g, 0.0) if hi and ctx.needs(2) else None
    return [dx, dlo, dhi][: len(ctx.inputs)]


# ------------------------------------------------------------------ transcendental


@unary("Erf")
def erf(ctx: RuleContext, x: str, y: str) -> str:
    """d/dx erf(x) = 2 / sqrt(pi) * exp(-x**2)"""
    return ctx.mul(ctx.op("Exp", ctx.neg(ctx.square(x))), 2.0 / math.sqrt(math.pi))


@unary("Sin")
def sin(ctx: RuleContext, x: str, y: str) -> str:
    """d/dx sin(x) = cos(x)"""
    if ctx.elem_type(x) == TensorProto.DOUBLE:  # as sin(x + pi/2): onnxruntime <= 1.23 has no double Cos kernel
        return ctx.op("Sin", ctx.add(x, math.pi / 2))
    return ctx.op("Cos", x)


@registry.rule("Cos", inputs=(0,))
def cos(ctx: RuleContext, grads: Grads) -> Result:
    """d/dx cos(x) = -sin(x)"""
    return [ctx.neg(ctx.mul(grads[0], ctx.op("Sin", ctx.inputs[0])))]


@unary("Tan")
def tan(ctx: RuleContext, x: str, y: str) -> str:
    """d/dx tan(x) = 1 + y**2"""
    return ctx.add(ctx.square(y), 1.0)


@unary("Asin")
def asin(ctx: RuleContext, x: str, y: str) -> str:
    """d/dx asin(x) = 1 / sqrt(1 - x**2)"""
    return ctx.op("Reciprocal", ctx.op("Sqrt", ctx.sub(1.0, ctx.square(x))))


@unary("Acos")
def acos(ctx: RuleContext, x: str, y: str) -> str:
    """d/dx acos(x) = -1 / sqrt(1 - x**2)"""
    return ctx.div(-1.0, ctx.op("Sqrt", ctx.sub(1.0, ctx.square(x))))


@unary("Atan")
def atan(ctx: RuleContext, x: str, y: str) -> str:
    """d/dx atan(x) = 1 / (1 + x**2)"""
    return ctx.op("Reciprocal", ctx.add(ctx.square(x), 1.0))


@unary("Sinh")
def sinh(ctx: RuleContext, x: str, y: str) -> str:
    """d/dx sinh(x) = cosh(x)"""
    return ctx.op("Cosh", x)


@unary("Cosh")
def cosh(ctx: RuleContext, x: str, y: str) -> str:
    """d/dx cosh(x) = sinh(x)"""
    return ctx.op("Sinh", x)


@unary("Tanh")
def tanh(ctx: RuleContext, x: str, y: str) -> str:
    """d/dx tanh(x) = 1 - y**2"""
    return ctx.sub(1.0, ctx.square(y))


@unary("Asinh")
def asinh(ctx: RuleContext, x: str, y: str) -> str:
    """d/dx asinh(x) = 1 / sqrt(x**2 + 1)"""
    return ctx.op("Reciprocal", ctx.op("Sqrt", ctx.add(ctx.square(x), 1.0)))


@unary("Acosh")
def acosh(ctx: RuleContext, x: str, y: str) -> str:
    """d/dx acosh(x) = 1 / sqrt(x**2 - 1)"""
    return ctx.op("Reciprocal", ctx.op("Sqrt", ctx.sub(ctx.square(x), 1.0)))


@unary("Atanh")
def atanh(ctx: RuleContext, x: str, y: str) -> str:
    """d/dx atanh(x) = 1 / (1 - x**2)"""
    return ctx.op("Reciprocal", ctx.sub(1.0, ctx.square(x)))


# --------------------------------------------------------------------- activations


@unary("Sigmoid")
def sigmoid(ctx: RuleContext, x: str, y: str) -> str:
    """d/dx sigmoid(x) = y * (1 - y)"""
    return ctx.mul(y, ctx.sub(1.0, y))


@unary("Softplus")
def softplus(ctx: RuleContext, x: str, y: str) -> str:
    """d/dx log(1 + exp(x)) = sigmoid(x)"""
    return ctx.op("Sigmoid", x)


@unary("Softsign")
def softsign(ctx: RuleContext, x: str, y: str) -> str:
    """d/dx x / (1 + |x|) = 1 / (1 + |x|)**2"""
    return ctx.op("Reciprocal", ctx.square(ctx.add(ctx.op("Abs", x), 1.0)))


@registry.rule("Relu", inputs=(0,))
def relu(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g where x > 0, else 0"""
    return [ctx.where(ctx.compare("Greater", ctx.inputs[0], 0.0), grads[0], 0.0)]


@registry.rule("LeakyRelu", inputs=(0,))
def leaky_relu(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g where x > 0, else alpha * g"""
    (g,) = grads
    alpha = ctx.attr("alpha", 0.01)
    return [ctx.where(ctx.compare("Greater", ctx.inputs[0], 0.0), g, ctx.mul(g, alpha))]


@registry.rule("ThresholdedRelu", inputs=(0,))
def thresholded_relu(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g where x > alpha, else 0"""
    alpha = ctx.attr("alpha", 1.0)
    return [ctx.where(ctx.compare("Greater", ctx.inputs[0], alpha), grads[0], 0.0)]


@registry.rule("PRelu", broadcasting=True)
def prelu(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g where x > 0, else slope * g; dslope = g * x where x <= 0"""
    (g,) = grads
    x, slope = ctx.inputs
    positive = ctx.compare("Greater", x, 0.0)
    dx = ctx.where(positive, g, ctx.mul(g, slope)) if ctx.needs(0) else None
    dslope = ctx.where(positive, 0.0, ctx.mul(g, x)) if ctx.needs(1) else None
    return [dx, dslope]


@registry.rule("Elu", inputs=(0,))
def elu(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g where x > 0, else g * (y + alpha)"""
    (g,) = grads
    alpha = ctx.attr("alpha", 1.0)
    y = ctx.outputs[0]
    return [ctx.where(ctx.compare("Greater", ctx.inputs[0], 0.0), g, ctx.mul(g, ctx.add(y, alpha)))]


@registry.rule("Selu", inputs=(0,))
def selu(ctx: RuleContext, grads: Grads) -> Result:
    """dx = gamma * g where x > 0, else g * (y + gamma * alpha)"""
    (g,) = grads
    alpha = ctx.attr("alpha", 1.67326319217681884765625)
    gamma = ctx.attr("gamma", 1.05070102214813232421875)
    y = ctx.outputs[0]
    return [
        ctx.where(ctx.compare("Greater", ctx.inputs[0], 0.0), ctx.mul(g, gamma), ctx.mul(g, ctx.add(y, gamma * alpha)))
    ]


@registry.rule("Celu", inputs=(0,))
def celu(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g where x > 0, else g * (y / alpha + 1)"""
    (g,) = grads
    alpha = ctx.attr("alpha", 1.0)
    y = ctx.outputs[0]
    return [ctx.where(ctx.compare("Greater", ctx.inputs[0], 0.0), g, ctx.mul(g, ctx.add(ctx.div(y, alpha), 1.0)))]


@registry.rule("HardSigmoid", inputs=(0,))
def hard_sigmoid(ctx: RuleContext, grads: Grads) -> Result:
    """dx = alpha * g where 0 < y < 1, else 0"""
    (g,) = grads
    y = ctx.outputs[0]
    alpha = ctx.attr("alpha", 0.2)
    linear = ctx.op("And", ctx.compare("Greater", y, 0.0), ctx.compare("Less", y, 1.0))
    return [ctx.where(linear, ctx.mul(g, alpha), 0.0)]


@registry.rule("HardSwish", inputs=(0,))
def hard_swish(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g * (0 for x < -3, x / 3 + 1/2 for -3 <= x <= 3, 1 for x > 3)"""
    (g,) = grads
    x = ctx.inputs[0]
    middle = ctx.where(ctx.compare("Less", x, -3.0), 0.0, ctx.add(ctx.div(x, 3.0), 0.5))
    return [ctx.mul(g, ctx.where(ctx.compare("Greater", x, 3.0), 1.0, middle))]


@unary("Mish", opsets=(18, None))
def mish(ctx: RuleContext, x: str, y: str) -> str:
    """d/dx x * tanh(softplus(x)) = t + x * sigmoid(x) * (1 - t**2), t = y / x (tanh(log 2) at 0)"""
    t = ctx.where(ctx.compare("Equal", x, 0.0), math.tanh(math.log(2.0)), ctx.div(y, x))
    return ctx.add(t, ctx.mul(ctx.mul(x, ctx.op("Sigmoid", x)), ctx.sub(1.0, ctx.square(t))))


_GELU_K = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715


@unary("Gelu", opsets=(20, None))
def gelu(ctx: RuleContext, x: str, y: str) -> str:
    """d/dx x * Phi(x) = Phi(x) + x * phi(x); tanh form: (1 + t) / 2 + x (1 - t**2) k (1 + 3 c x**2) / 2"""
    x2 = ctx.square(x)
    if ctx.attr("approximate", "none") == "tanh":
        # y = x / 2 * (1 + t), t = tanh(k * (x + c * x**3))
        t = ctx.op("Tanh", ctx.mul(ctx.mul(x, ctx.add(ctx.mul(x2, _GELU_C), 1.0)), _GELU_K))
        du = ctx.add(ctx.mul(x2, 3.0 * _GELU_C * _GELU_K), _GELU_K)
        return ctx.mul(ctx.add(t, ctx.add(ctx.mul(ctx.mul(x, ctx.sub(1.0, ctx.square(t))), du), 1.0)), 0.5)
    cdf = ctx.mul(ctx.add(ctx.op("Erf", ctx.mul(x, 1.0 / math.sqrt(2.0))), 1.0), 0.5)
    pdf = ctx.mul(ctx.op("Exp", ctx.mul(x2, -0.5)), 1.0 / math.sqrt(2.0 * math.pi))
    return ctx.add(cdf, ctx.mul(x, pdf))


@unary("Swish", opsets=(24, None))
def swish(ctx: RuleContext, x: str, y: str) -> str:
    """d/dx x * sigmoid(alpha x) = s + alpha * y * (1 - s), s = sigmoid(alpha x)"""
    alpha = float(ctx.attr("alpha", 1.0))
    s = ctx.op("Sigmoid", ctx.mul(x, alpha) if alpha != 1.0 else x)
    return ctx.add(s, ctx.mul(ctx.mul(y, alpha), ctx.sub(1.0, s)))


@registry.rule("Shrink", inputs=(0,))
def shrink(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g where |x| > lambd, else 0"""
    lambd = float(ctx.attr("lambd", 0.5))
    return [ctx.where(ctx.compare("Greater", ctx.op("Abs", ctx.inputs[0]), lambd), grads[0], 0.0)]


# --------------------------------------------------------------------- casts and remainders


@registry.rule("CastLike", inputs=(0,))
def cast_like(ctx: RuleContext, grads: Grads) -> Result:
    """dx = cast(g, type of x); target_type only gives the type"""
    return [ctx.cast_like(grads[0], ctx.inputs[0]), None]


@registry.rule("Mod", broadcasting=True)
def mod(ctx: RuleContext, grads: Grads) -> Result:
    """fmod=1: da = g, db = -g * trunc(a / b) = g * (y - a) / b"""
    (g,) = grads
    if int(ctx.attr("fmod", 0)) != 1:
        raise ValueError(
            f"Mod node {ctx.node.name!r} has fmod=0 on floating-point inputs, which ONNX forbids (fmod=0 is "
            "the integer, sign-of-divisor remainder): set fmod=1 for floats"
        )
    a, b = ctx.inputs
    db = ctx.div(ctx.mul(g, ctx.sub(ctx.outputs[0], a)), b) if ctx.needs(1) else None
    return [g, db]


# --------------------------------------------------------------------- determinants


def _i64(ctx: RuleContext, value: object) -> str:
    """An int64 constant (a scalar for a scalar ``value``)."""
    return ctx.const(np.asarray(value, dtype=np.int64), ctx.int64s([0]))


def _minor_indices(ctx: RuleContext, n: str | int) -> str:
    """``r[i, k] = k + (k >= i)``, shape ``[n, n - 1]``: the rows (or columns) left when row ``i`` goes."""
    if isinstance(n, int):
        return ctx.const(
            np.array([[k + (k >= i) for k in range(n - 1)] for i in range(n)], np.int64).reshape(n, max(n - 1, 0)),
            ctx.int64s([0]),
        )
    i = ctx.op("Unsqueeze", ctx.op("Range", _i64(ctx, 0), n, _i64(ctx, 1)), ctx.int64s([1]))
    k = ctx.op(
        "Unsqueeze", ctx.op("Range", _i64(ctx, 0), ctx.op("Sub", n, _i64(ctx, 1)), _i64(ctx, 1)), ctx.int64s([0])
    )
    return ctx.op("Add", k, ctx.cast(ctx.op("GreaterOrEqual", k, i), TensorProto.INT64))


def _checkerboard(ctx: RuleContext, n: str | int, like: str) -> str:
    """``(-1)**(i + j)``, shape ``[n, n]``, of the element type of ``like``."""
    if isinstance(n, int):
        return ctx.const(np.fromfunction(lambda i, j: 1.0 - 2.0 * ((i + j) % 2), (n, n)), like)
    i = ctx.op("Range", _i64(ctx, 0), n, _i64(ctx, 1))
    parity = ctx.op("Mod", ctx.op("Add", ctx.op("Unsqueeze", i, ctx.int64s([1])), i), _i64(ctx, 2))
    return ctx.sub(1.0, ctx.mul(ctx.cast_like(parity, like), 2.0))


@registry.rule("Det", inputs=(0,))
def det(ctx: RuleContext, grads: Grads) -> Result:
    """dX = g * det(X) * inverse(X)^T = g * cofactors(X), cofactor_ij = (-1)**(i+j) * det(X without row i, column j)"""
    # No inverse, so singular X is fine; n^2 determinants of size n - 1 per matrix (memory ~ n^4).
    (g,) = grads
    x = ctx.inputs[0]
    dims = ctx.shape(x)
    n: str | int
    if dims is not None and isinstance(dims[-1], int) and sized.is_small(dims[-1], dims[-1]):
        n = int(dims[-1])
    else:  # unknown, or too large for the index and sign constants
        n = ctx.op("Gather", ctx.op("Shape", x), _i64(ctx, -1))
    if n == 0:  # 0 x 0 matrices (the minors of 1 x 1 ones, in a second derivative): an empty gradient
        return [ctx.mul(x, 0.0)]
    r = _minor_indices(ctx, n)
    # the batch flattened: [B, n, n]; then minors[b, i, j] = X[b] without row i and column j
    n_1d = ctx.int64s([n]) if isinstance(n, int) else ctx.op("Reshape", n, ctx.int64s([1]))
    flat = ctx.op("Reshape", x, ctx.op("Concat", ctx.int64s([-1]), n_1d, n_1d, axis=0))
    rows = ctx.op("Gather", flat, r, axis=1)  # [B, n(i), n-1, n]
    both = ctx.op("Gather", rows, r, axis=3)  # [B, n(i), n-1, n(j), n-1]
    minors = ctx.op("Det", ctx.op("Transpose", both, perm=[0, 1, 3, 2, 4]))  # [B, n, n]
    cofactors = ctx.mul(minors, _checkerboard(ctx, n, x))
    scaled = ctx.mul(cofactors, ctx.op("Reshape", g, ctx.int64s([-1, 1, 1])))
    return [ctx.op("Reshape", scaled, ctx.shape_of(x))]


# --------------------------------------------------------------------- one-hot encoding


@registry.rule("OneHot", inputs=(2,))
def one_hot(ctx: RuleContext, grads: Grads) -> Result:
    """dvalues = [sum(g * (1 - h)), sum(g * h)], h = OneHot(indices, depth, [0, 1]); indices, depth: none"""
    (g,) = grads
    indices, depth, values = ctx.inputs
    hot = ctx.op("OneHot", indices, depth, ctx.const([0, 1], values), axis=int(ctx.attr("axis", -1)))
    on = ctx.op("ReduceSum", ctx.mul(g, hot), keepdims=1)
    off = ctx.sub(ctx.op("ReduceSum", g, keepdims=1), on)
    flat = ctx.int64s([1])
    return [None, None, ctx.op("Concat", ctx.op("Reshape", off, flat), ctx.op("Reshape", on, flat), axis=0)]


# Piecewise constant (Hardmax: a one-hot argmax) or a reinterpretation of bits: no useful derivative.
# (QuantizeLinear is left without a rule on purpose: its derivative is zero almost everywhere, but
# quantization-aware training wants a straight-through estimator instead; register one on a copy.)
registry.non_differentiable("Hardmax", "BitCast")
