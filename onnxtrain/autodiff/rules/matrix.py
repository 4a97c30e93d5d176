"""Matrix products: MatMul, Gemm, Einsum.

Notation: ``g`` is the gradient of the output; ``X^T`` swaps the last two
axes of ``X``. Products that broadcast batch axes return gradients with the
broadcast batch shape, summed back to each operand's shape here (not by the
engine: the gradient of a product does not have the output's shape).
"""

from __future__ import annotations

import string
from collections import Counter
from collections.abc import Sequence

from onnxtrain.autodiff import dims
from onnxtrain.autodiff.broadcast import product_grad_dims, unbroadcast
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.registry import Grads, Result
from onnxtrain.autodiff.rules._builtin import registry


def _swap_last(ctx: RuleContext, x: str) -> str:
    """``x`` with its last two axes swapped (``Transpose``; ``Einsum`` when the rank is unknown)."""
    rank = ctx.rank(x)
    if rank is None:
        return ctx.op("Einsum", x, equation="...ij->...ji")
    perm = list(range(rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return ctx.op("Transpose", x, perm=perm)


# ---------------------------------------------------------------------- MatMul


@registry.rule("MatMul")
def matmul(ctx: RuleContext, grads: Grads) -> Result:
    """dA = g @ B^T, dB = A^T @ g  (1-D operands promoted to matrices, broadcast batch axes summed)"""
    (g,) = grads
    a, b = ctx.inputs
    rank_a, rank_b = ctx.rank(a), ctx.rank(b)
    # numpy semantics: a 1-D A is a row [1, K], a 1-D B a column [K, 1]; the output lacks that axis.
    a2 = ctx.op("Unsqueeze", a, ctx.int64s([0])) if rank_a == 1 else a
    b2 = ctx.op("Unsqueeze", b, ctx.int64s([1])) if rank_b == 1 else b
    if rank_a == 1 and rank_b == 1:
        g2 = ctx.op("Unsqueeze", g, ctx.int64s([0, 1]))
    elif rank_a == 1:
        g2 = ctx.op("Unsqueeze", g, ctx.int64s([-2]))
    elif rank_b == 1:
        g2 = ctx.op("Unsqueeze", g, ctx.int64s([-1]))
    else:
        g2 = g
    rank_a2 = None if rank_a is None else max(rank_a, 2)
    rank_b2 = None if rank_b is None else max(rank_b, 2)
    da = db = None
    if ctx.needs(0):
        da = ctx.op("MatMul", g2, _swap_last(ctx, b2))
        if rank_b2 != 2:  # B has batch axes: A's may have been broadcast
            known = product_grad_dims(ctx, ctx.outputs[0], a) if rank_a != 1 and rank_b != 1 else None
            da = unbroadcast(ctx, da, a2, grad_dims=known)
        if rank_a == 1:
            da = ctx.op("Reshape", da, ctx.shape_of(a))
    if ctx.needs(1):
        if rank_b2 == 2 and rank_a2 is not None and rank_a2 > 2:
            # a weight shared by every batch row: one product over the flattened batch
            flat_a = ctx.op("Flatten", a2, axis=rank_a2 - 1)
            flat_g = ctx.op("Flatten", g2, axis=rank_a2 - 1)
            db = ctx.op("Gemm", flat_a, flat_g, transA=1)
        else:
            db = ctx.op("MatMul", _swap_last(ctx, a2), g2)
            if rank_a2 != 2:
                known = product_grad_dims(ctx, ctx.outputs[0], b) if rank_a != 1 and rank_b != 1 else None
                db = unbroadcast(ctx, db, b2, grad_dims=known)
        if rank_b == 1:
            db = ctx.op("Reshape", db, ctx.shape_of(b))
    return [da, db]


# ------------------------------------------------------------------------ Gemm


@registry.rule("Gemm")
def gemm(ctx: RuleContext, grads: Grads) -> Result:
    """Y = alpha A' B' + beta C (A' = A or A^T, B' = B or B^T): dA' = alpha g B'^T, dB' = alpha A'^T g, dC = beta g"""
    (g,) = grads
    a, b = ctx.inputs[0], ctx.inputs[1]
    alpha = float(ctx.attr("alpha", 1.0))
    beta = float(ctx.attr("beta", 1.0))
    trans_a, trans_b = int(ctx.attr("transA", 0)), int(ctx.attr("transB", 0))
    scale = {} if alpha == 1.0 else {"alpha": alpha}
    da = db = dc = None
    if ctx.needs(0):
        if not trans_a:  # dA = alpha g B'^T
            da = ctx.op("Gemm", g, b, transB=1 - trans_b, **scale)
        else:  # dA = alpha B' g^T
            da = ctx.op("Gemm", b, g, transA=trans_b, transB=1, **scale)
    if ctx.needs(1):
        if not trans_b:  # dB = alpha A'^T g
            db = ctx.op("Gemm", a, g, transA=1 - trans_a, **scale)
        else:  # dB = alpha g^T A'
            db = ctx.op("Gemm", g, a, transA=1, transB=trans_a, **scale)
    if ctx.has_input(2) and ctx.needs(2):
        c = ctx.inputs[2]
        dc = unbroadcast(ctx, g if beta == 1.0 else ctx.mul(g, beta), c, shaped_like=ctx.outputs[0])
    return [da, db, dc][: len(ctx.inputs)]


# ---------------------------------------------------------------------- Einsum

_ELLIPSIS = "."


def _terms(equation: str, ranks: Sequence[int | None]) -> tuple[list[list[str]], list[str], set[str]]:
    """The operand and output subscripts of ``equation``, with ``...`` spelled as letters.

    Implicit outputs (no ``->``) become explicit: ``...`` first, then the letters
    that appear once, sorted. Returns ``(inputs, output, ellipsis letters)``.
    """
    compact = equation.replace(" ", "")
    lhs, arrow, rhs = compact.partition("->")
    inputs = [list(term.replace("...", _ELLIPSIS)) for term in lhs.split(",")]
    if arrow:
        output = list(rhs.replace("...", _ELLIPSIS))
    else:
        counts = Counter(c for term in inputs for c in term if c != _ELLIPSIS)
        ellipsis = [_ELLIPSIS] if any(_ELLIPSIS in term for term in inputs) else []
        output = ellipsis + sorted(c for c, n in counts.items() if n == 1)
    if not any(_ELLIPSIS in term for term in (*inputs, output)):
        return inputs, output, set()
    used = {c for term in (*inputs, output) for c in term}
    free = [c for c in string.ascii_letters if c not in used]
    widths = {}
    for k, term in enumerate(inputs):
        if _ELLIPSIS in term:
            if ranks[k] is None:
                raise ValueError(
                    f"Einsum {equation!r}: the rank of operand {k} is unknown, so its '...' cannot be resolved; "
                    "give the model's inputs a known rank"
                )
            widths[k] = ranks[k] - (len(term) - 1)  # type: ignore[operator]
    width = max(widths.values(), default=0)
    letters = free[:width]

    def spell(term: list[str], w: int) -> list[str]:
        if _ELLIPSIS not in term:
            return term
        at = term.index(_ELLIPSIS)
        return term[:at] + letters[width - w :] + term[at + 1 :]

    return [spell(t, widths.get(k, 0)) for k, t in enumerate(inputs)], spell(output, width), set(letters)


def _delta(ctx: RuleContext, x: str, p: int, q: int, rank: int) -> str:
    """The Kronecker delta of axes ``p < q`` of ``x`` (ones where the indices agree), shaped to broadcast."""
    static = ctx.static_shape(x)
    if static is not None:
        eye = dims.eye(ctx, static[p], x)
    else:
        n = ctx.op("Gather", ctx.op("Shape", x), ctx.int64s([p]))
        zero = ctx.op("ConstantOfShape", ctx.op("Concat", n, n, axis=0), value=dims.fill_value(ctx, x, 0))
        eye = ctx.op("EyeLike", zero)
    others = [k for k in range(rank) if k not in (p, q)]
    return ctx.op("Unsqueeze", eye, ctx.int64s(others)) if others else eye


def _einsum_operand_grad(
    ctx: RuleContext, g: str, k: int, inputs: list[list[str]], output: list[str], ellipsis: set[str]
) -> str:
    """The gradient of operand ``k``: an Einsum of ``g`` and the other operands onto the letters of
    operand ``k`` that they carry, then its repeated letters (diagonals) put back with Kronecker deltas,
    the letters only it has broadcast back, and '...' axes it broadcast summed."""
    x = ctx.inputs[k]
    term = inputs[k]
    available = set(output).union(*(set(t) for j, t in enumerate(inputs) if j != k))
    kept: list[str] = []
    dropped: list[int] = []
    repeats: list[tuple[int, int]] = []
    first: dict[str, int] = {}
    for p, c in enumerate(term):
        if c in first:
            dropped.append(p)
            repeats.append((first[c], p))
        elif c not in available:
            first[c] = p
            dropped.append(p)
        else:
            first[c] = p
            kept.append(c)
    operands = [g] + [ctx.inputs[j] for j in range(len(inputs)) if j != k]
    subscripts = ["".join(output)] + ["".join(t) for j, t in enumerate(inputs) if j != k]
    target = "".join(kept)
    if len(operands) == 1 and subscripts[0] == target:
        grad = g
    else:
        grad = ctx.op("Einsum", *operands, equation=",".join(subscripts) + "->" + target)
    if dropped:
        grad = ctx.op("Unsqueeze", grad, ctx.int64s(sorted(dropped)))
    for p, q in repeats:
        grad = ctx.mul(grad, _delta(ctx, x, p, q, len(term)))
    if any(c not in available for c in term):
        grad = ctx.expand_to(grad, x)
    if ellipsis & set(term):
        grad = unbroadcast(ctx, grad, x)
    return grad


@registry.rule("Einsum")
def einsum(ctx: RuleContext, grads: Grads) -> Result:
    """dX_k = einsum(g, X_j (j != k) -> subscripts of X_k); diagonals, letters summed in X_k alone and '...' restored"""
    (g,) = grads
    ranks = [ctx.rank(x) for x in ctx.inputs]
    inputs, output, ellipsis = _terms(str(ctx.attr("equation")), ranks)
    return [
        _einsum_operand_grad(ctx, g, k, inputs, output, ellipsis) if ctx.needs(k) else None
        for k in range(len(ctx.inputs))
    ]
