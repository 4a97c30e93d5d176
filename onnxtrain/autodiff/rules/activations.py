"""The derivatives of the smooth gated activations (GELU, SiLU, QuickGELU), in the fewest element-wise nodes.

Shared by the rules of the operators that compute them (``Gelu``, ``Swish``,
ONNX Runtime's ``Gelu``, ``FastGelu``, ``BiasGelu``, ``QuickGelu``) and by the
rule of the chains of element-wise nodes that exporters write for them
(:mod:`onnxtrain.autodiff.rules.activation_chains`). Each function returns
``f'(x)``, to be multiplied by the output's gradient.

On a GPU each node is a kernel launch and a pass over the activation's size
(GPT-2 small at 16 x 256: 48 MiB per layer, 12 layers), so the count matters:
the tanh GELU's derivative is 12 nodes, written with the sigmoid that its
tanh is (``(1 + tanh(z / 2)) / 2 = sigmoid(z)``), against 15 for the tanh form.
"""

from __future__ import annotations

import math

from onnxtrain.autodiff.context import RuleContext

#: The tanh GELU's constants as ``x * sigmoid(x * (A + B x^2))``: ``A = 2 sqrt(2 / pi)``, ``B = 0.044715 A``.
TANH_GELU_A = 2.0 * math.sqrt(2.0 / math.pi)
TANH_GELU_B = 0.044715 * TANH_GELU_A


def gelu_erf_derivative(ctx: RuleContext, x: str) -> str:
    """d/dx x Phi(x) = Phi(x) + x phi(x): ``(1 + erf(x / sqrt 2)) / 2 + x exp(-x^2 / 2) / sqrt(2 pi)`` (10 nodes)"""
    cdf = ctx.mul(ctx.add(ctx.op("Erf", ctx.mul(x, 1.0 / math.sqrt(2.0))), 1.0), 0.5)
    pdf = ctx.mul(ctx.op("Exp", ctx.mul(ctx.square(x), -0.5)), 1.0 / math.sqrt(2.0 * math.pi))
    return ctx.add(cdf, ctx.mul(x, pdf))


def gelu_tanh_derivative(ctx: RuleContext, x: str, a: float = TANH_GELU_A, b: float = TANH_GELU_B) -> str:
    """d/dx x s = s (1 + x (1 - s) (a + 3 b x^2)), ``s = sigmoid(x (a + b x^2))`` (12 nodes).

    ``x s`` is the tanh GELU ``x (1 + tanh(z / 2)) / 2`` with ``z = x (a + b x^2)``;
    ``a`` and ``b`` are twice the tanh's constants (ONNX Runtime's ``FastGelu``
    rounds them). Written from ``x`` alone, not from the output: in float32 an
    exported chain's ``1 + tanh`` is 0 from ``x = -5.3``, where the sigmoid keeps
    its precision.
    """
    x2 = ctx.square(x)
    s = ctx.op("Sigmoid", ctx.mul(x, ctx.add(ctx.mul(x2, b), a)))
    slope = ctx.add(ctx.mul(x2, 3.0 * b), a)
    return ctx.mul(s, ctx.add(ctx.mul(ctx.mul(x, ctx.sub(1.0, s)), slope), 1.0))


def sigmoid_gated_derivative(ctx: RuleContext, x: str, y: str, alpha: float = 1.0) -> str:
    """d/dx x s = s + alpha y (1 - s), ``s = sigmoid(alpha x)``, ``y = x s``: SiLU (Swish) at ``alpha = 1``,
    QuickGELU at 1.702 (4 nodes at ``alpha = 1``, 6 else)."""
    s = ctx.op("Sigmoid", ctx.mul(x, alpha) if alpha != 1.0 else x)
    scaled = ctx.mul(y, alpha) if alpha != 1.0 else y
    return ctx.add(s, ctx.mul(scaled, ctx.sub(1.0, s)))
