"""Shape and data-movement operators (rules for this family are being added)."""

from __future__ import annotations

from collections.abc import Sequence

from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.rules._builtin import REGISTRY as registry

Grads = Sequence["str | None"]
Result = list["str | None"]


@registry.rule("Split", inputs=(0,))
def split(ctx: RuleContext, grads: Grads) -> Result:
    """dx = concat(g_1, ..., g_n, axis)  (zeros for outputs without a gradient)"""
    parts = [g if g is not None else ctx.zeros_like(y) for g, y in zip(grads, ctx.outputs, strict=True)]
    return [ctx.op("Concat", *parts, axis=ctx.attr("axis", 0))] + [None] * (len(ctx.inputs) - 1)
