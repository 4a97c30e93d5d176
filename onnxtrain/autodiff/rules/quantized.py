"""Gradient rules of quantized products.

The gradient flows to the float input of ``com.microsoft::MatMulNBits`` (and
of ``DequantizeLinear`` + ``MatMul``, where the engine never reaches the
integer weights), never to the frozen quantized weights.

``MatMulNBits`` computes ``Y = A @ W^T + bias`` with ``W = dequant(B)`` of shape
``[N, K]``. Its gradient dequantizes ``B`` in standard operators: the ``bits``-wide
codes are unpacked from each byte with integer arithmetic (``Div`` and ``Mod``
by powers of two on int32, low bits first), the per-block zero point (unpacked
the same way when packed in uint8; ``2^(bits-1)`` when omitted) subtracted and
the per-block scale applied; ``g_idx`` (deprecated), when given, names each
row's block instead of ``k // block_size`` (with no or float zero points only:
onnxruntime reads packed zero points otherwise than documented there). The
dequantization depends on a run-time value, so that onnxruntime does not fold
it into a float copy of every quantized weight when a session loads.
"""

from __future__ import annotations

from onnx import TensorProto

from onnxtrain.autodiff.broadcast import unbroadcast
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.registry import Grads, Result
from onnxtrain.autodiff.rules._builtin import registry

#: Bit widths whose codes never straddle a byte (the ones onnxruntime's kernels support).
_BITS = (2, 4, 8)


def _unpack(ctx: RuleContext, packed: str, bits: int, n: int) -> str:
    """The ``bits``-wide codes of uint8 ``packed`` ``[n, m]``, low bits first, as int32 ``[n, m * 8 / bits]``."""
    as_int = ctx.cast(packed, TensorProto.INT32)
    if bits == 8:
        return as_int
    per_byte = 8 // bits
    shifts = ctx.const([1 << (bits * j) for j in range(per_byte)], as_int)
    spread = ctx.op("Div", ctx.op("Unsqueeze", as_int, ctx.int64s([-1])), shifts)  # [n, m, per_byte]
    codes = ctx.op("Mod", spread, ctx.const(1 << bits, as_int))
    return ctx.op("Reshape", codes, ctx.int64s([n, -1]))


def _leading(ctx: RuleContext, x: str, count: int) -> str:
    """The first ``count`` columns of ``x`` ``[n, m]`` (no node when ``m == count`` is known)."""
    shape = ctx.static_shape(x)
    if shape is not None and shape[-1] == count:
        return x
    return ctx.op("Slice", x, ctx.int64s([0]), ctx.int64s([count]), ctx.int64s([1]))


def _zero_points(ctx: RuleContext, a: str, bits: int, n: int, blocks: int) -> str:
    """The zero points as ``[N, k_blocks]`` in ``a``'s type: unpacked uint8, float as given, or ``2^(bits-1)``."""
    if not ctx.has_input(3):
        return ctx.const(float(1 << (bits - 1)), a)
    zp = ctx.inputs[3]
    if ctx.elem_type(zp) == TensorProto.UINT8:
        codes = _unpack(ctx, ctx.op("Reshape", zp, ctx.int64s([n, -1])), bits, n)
        return ctx.cast_like(_leading(ctx, codes, blocks), a)
    return ctx.cast_like(ctx.op("Reshape", zp, ctx.int64s([n, blocks])), a)


def _unfoldable(ctx: RuleContext, dims: list[int], anchor: str) -> str:
    """The int64 vector ``dims``, computed at run time from ``Size(anchor)`` (``dims + 0 * size``).

    A Reshape of the packed weight to it keeps onnxruntime from folding the whole
    dequantization into a float initializer when the session loads (``B``,
    ``scales`` and zero points are constants): that copy would cost the memory
    quantizing saved, for as long as the session lives.
    """
    size = ctx.op("Reshape", ctx.op("Size", anchor), ctx.int64s([1]))
    return ctx.op("Add", ctx.int64s(dims), ctx.op("Mul", size, ctx.int64s([0])))


def dequantize_nbits(ctx: RuleContext, anchor: str) -> str:
    """``W = (q - zero_point) * scale``, ``[N, K]`` in the type of ``A``, from MatMulNBits' inputs.

    ``anchor``: a value known only at run time (the output gradient), see :func:`_unfoldable`.
    """
    a, b, scales = ctx.inputs[0], ctx.inputs[1], ctx.inputs[2]
    k, n = int(ctx.attr("K")), int(ctx.attr("N"))
    bits, block = int(ctx.attr("bits", 4)), int(ctx.attr("block_size"))
    if bits not in _BITS:
        raise ValueError(
            f"the gradient of MatMulNBits node {ctx.node.name!r} supports bits in {_BITS}, not {bits}; "
            "requantize the weight with one of those widths"
        )
    g_idx = ctx.has_input(4)  # the block of each of the K rows, in place of k // block_size (deprecated)
    if g_idx and ctx.has_input(3) and ctx.elem_type(ctx.inputs[3]) == TensorProto.UINT8:
        raise ValueError(
            f"the gradient of MatMulNBits node {ctx.node.name!r} does not support the deprecated g_idx with "
            "packed uint8 zero points (onnxruntime reads them otherwise than documented); give float zero "
            "points, or requantize without g_idx"
        )
    blocks = -(-k // block)
    rows = ctx.op("Reshape", b, _unfoldable(ctx, [n, -1], anchor))
    codes = ctx.cast_like(_unpack(ctx, rows, bits, n), a)  # [N, blocks * block]
    scale = ctx.cast_like(ctx.op("Reshape", scales, ctx.int64s([n, blocks])), a)
    zero = _zero_points(ctx, a, bits, n, blocks)
    if g_idx:
        index = ctx.op("Reshape", ctx.inputs[4], ctx.int64s([k]))
        if ctx.rank(zero) == 2:
            zero = ctx.op("Gather", zero, index, axis=1)
        return ctx.mul(ctx.sub(_leading(ctx, codes, k), zero), ctx.op("Gather", scale, index, axis=1))
    blocked = ctx.op("Reshape", codes, ctx.int64s([n, blocks, block]))
    if ctx.rank(zero) == 2:
        zero = ctx.op("Unsqueeze", zero, ctx.int64s([2]))
    weight = ctx.mul(ctx.sub(blocked, zero), ctx.op("Unsqueeze", scale, ctx.int64s([2])))
    return _leading(ctx, ctx.op("Reshape", weight, ctx.int64s([n, blocks * block])), k)


@registry.rule("MatMulNBits", domain="com.microsoft", inputs=(0, 5))
def matmul_nbits(ctx: RuleContext, grads: Grads) -> Result:
    """Y = A @ W^T + bias, W = (unpack(B) - zero_points) * scales per block: dA = g @ W, dbias = sum(g)"""
    (g,) = grads
    da = dbias = None
    if ctx.needs(0):
        da = ctx.op("MatMul", g, dequantize_nbits(ctx, g))
    if ctx.has_input(5) and ctx.needs(5):
        dbias = unbroadcast(ctx, g, ctx.inputs[5], shaped_like=ctx.outputs[0])
    return [da, None, None, None, None, dbias][: len(ctx.inputs)]
