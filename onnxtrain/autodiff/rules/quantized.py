"""Gradient rules of quantized products, and the straight-through estimator of quantization.

The gradient flows to the float input of ``com.microsoft::MatMulNBits`` (and
of ``DequantizeLinear`` + ``MatMul``, where the engine never reaches the
integer weights), never to the frozen quantized weights.

``DequantizeLinear(QuantizeLinear(x, s, z), s, z)``, the fake quantization of
a QDQ model (``onnxruntime.quantization.quantize_static``: activations, and
weights with ``AddQDQPairToWeight``), is differentiated as one function with
the straight-through estimator of quantization-aware training: ``dx = g``
where the code ``round(x * (1 / s)) + z`` lies in the range of the quantized
type (narrowed by a ``Clip`` of the codes between the two, as the TorchScript
exporter writes PyTorch's codes of 0..127), ``0`` where it is clipped (ONNX
Runtime's ``FakeQuantGrad``, PyTorch's ``fake_quantize_per_tensor_affine``
and ``_per_channel_affine``, whose ``x * (1 / s)`` it computes). It is the
derivative of ``clip(x, (qmin - z - 1/2) s, (qmax - z + 1/2) s)``, the
function the fake quantization rounds. The scale and zero point get no
gradient (they are fixed, as ONNX Runtime's QAT keeps them).

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

import math

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnxtrain.autodiff.broadcast import unbroadcast
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.registry import Grads, Result
from onnxtrain.autodiff.rules._builtin import registry
from onnxtrain.graph.attributes import attributes
from onnxtrain.graph.versions import is_standard

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


#: The codes of each integer type ``QuantizeLinear`` writes: ``(smallest, largest)``.
_INTEGER_CODES = {
    TensorProto.UINT8: (0, 255),
    TensorProto.INT8: (-128, 127),
    TensorProto.UINT16: (0, 65535),
    TensorProto.INT16: (-32768, 32767),
    TensorProto.UINT4: (0, 15),
    TensorProto.INT4: (-8, 7),
    TensorProto.UINT2: (0, 3),
    TensorProto.INT2: (-2, 1),
}

#: The largest finite magnitude of each float type ``QuantizeLinear`` writes (it saturates to it by default).
_FLOAT_CODES = {
    TensorProto.FLOAT8E4M3FN: 448.0,
    TensorProto.FLOAT8E4M3FNUZ: 240.0,
    TensorProto.FLOAT8E5M2: 57344.0,
    TensorProto.FLOAT8E5M2FNUZ: 57344.0,
    TensorProto.FLOAT4E2M1: 6.0,
}


def _code_type(ctx: RuleContext, quantizer: onnx.NodeProto) -> int:
    """The element type of ``quantizer``'s codes: its zero point's, else its ``output_dtype``, else uint8."""
    if len(quantizer.input) > 2 and quantizer.input[2]:
        return ctx.elem_type(quantizer.input[2])
    return int(attributes(quantizer).get("output_dtype", 0)) or TensorProto.UINT8


def _same_parameter(ctx: RuleContext, a: str, b: str) -> bool:
    """Whether two scales (or zero points) are the same value: one name, or equal constants; an absent zero point
    is the same as one of zeros."""
    if a == b:
        return True
    left = np.zeros(1) if not a else ctx.constant_value(a)
    right = np.zeros(1) if not b else ctx.constant_value(b)
    if left is None or right is None:
        return False
    if not (a and b):  # an absent zero point: zeros of any shape
        return not left.any() and not right.any()
    return left.shape == right.shape and bool(np.all(left == right))


def _per_axis(ctx: RuleContext, value: str, x: str, axis: int) -> str:
    """A per-tensor or per-axis quantization parameter (``[]``, ``[1]`` or ``[C]``) shaped to broadcast over ``x``."""
    shape = ctx.static_shape(value)
    if shape is not None and int(np.prod(shape)) == 1:
        return value
    rank = ctx.rank(x)
    if rank is None:
        raise ValueError(
            f"the straight-through gradient of DequantizeLinear node {ctx.node.name!r} needs the rank of {x!r} for "
            "its per-axis scale; declare the model's input shapes (onnx.shape_inference) before generating"
        )
    trailing = rank - (axis % rank) - 1
    return ctx.op("Unsqueeze", value, ctx.int64s(list(range(1, trailing + 1)))) if trailing else value


def _in_range(ctx: RuleContext, quantizer: onnx.NodeProto, clipped: tuple[float, float]) -> str:
    """``1`` where ``QuantizeLinear`` codes ``x`` without clipping (``qmin <= round(x * (1 / s)) + z <= qmax``, the
    range narrowed to ``clipped``), else ``0``, in the type of ``x``."""
    x, scale = quantizer.input[0], quantizer.input[1]
    zero = quantizer.input[2] if len(quantizer.input) > 2 and quantizer.input[2] else ""
    quantizer_attributes = attributes(quantizer)
    if int(quantizer_attributes.get("block_size", 0)):
        raise ValueError(
            f"the straight-through gradient of QuantizeLinear node {quantizer.name!r} does not support blocked "
            "quantization (block_size); quantize per tensor or per axis for training"
        )
    axis = int(quantizer_attributes.get("axis", 1))
    # x times the scale's reciprocal, as PyTorch's fake quantization computes the codes (at x / s = 127.5 exactly,
    # as its symmetric observers make the largest weight, x * (1 / s) rounds to 127, inside: PyTorch's mask)
    inverse = ctx.op("Reciprocal", _per_axis(ctx, ctx.cast_like(scale, x), x, axis))
    scaled = ctx.op("Mul", x, inverse)
    code_type = _code_type(ctx, quantizer)
    if code_type in _FLOAT_CODES:  # zero point 0; saturated beyond the largest magnitude
        if clipped != (-math.inf, math.inf):
            raise ValueError(
                f"the straight-through gradient of QuantizeLinear node {quantizer.name!r} does not support a Clip "
                "of float8 codes; clip the values before quantizing them"
            )
        inside = ctx.op("LessOrEqual", ctx.op("Abs", scaled), ctx.const(_FLOAT_CODES[code_type], x))
        return ctx.cast_like(inside, x)
    if code_type not in _INTEGER_CODES:
        raise ValueError(
            f"the straight-through gradient of QuantizeLinear node {quantizer.name!r} does not know codes of type "
            f"{helper.tensor_dtype_to_string(code_type)}; quantize to 8 or 16 bits for training"
        )
    low, high = _INTEGER_CODES[code_type]
    low, high = max(low, clipped[0]), min(high, clipped[1])
    rounded = ctx.op("Round", scaled)
    known = ctx.constant_value(zero) if zero else np.zeros(1)
    if known is not None:
        bounds = [np.asarray(bound - known.astype(np.float64)) for bound in (low, high)]
        if known.size > 1:
            lower, upper = (_per_axis(ctx, ctx.const(bound, x), x, axis) for bound in bounds)
        else:
            lower, upper = (ctx.const(float(bound.reshape(-1)[0]), x) for bound in bounds)
    else:
        shift = _per_axis(ctx, ctx.cast_like(zero, x), x, axis)
        lower, upper = (ctx.sub(ctx.const(float(bound), x), shift) for bound in (low, high))
    inside = ctx.op("And", ctx.op("GreaterOrEqual", rounded, lower), ctx.op("LessOrEqual", rounded, upper))
    return ctx.cast_like(inside, x)


def _quantizer_of(ctx: RuleContext, codes: str) -> tuple[onnx.NodeProto | None, tuple[float, float]]:
    r"""The node that made ``codes``, seen through ``Clip``\ s of constant bounds (the TorchScript exporter's
    for PyTorch's fake quantization to a narrower range, 0..127), and the range those leave."""
    low, high = -math.inf, math.inf
    node = ctx.producer(codes)
    while node is not None and node.op_type == "Clip" and is_standard(node):
        names = [node.input[k] if len(node.input) > k else "" for k in (1, 2)]  # min, max
        bounds = [ctx.constant_value(name) if name else None for name in names]
        if any(name and bound is None for name, bound in zip(names, bounds, strict=True)):
            raise ValueError(
                f"the straight-through gradient of DequantizeLinear node {ctx.node.name!r} needs the bounds of "
                f"Clip node {node.name!r} on its codes as constants"
            )
        if bounds[0] is not None:
            low = max(low, float(bounds[0]))
        if bounds[1] is not None:
            high = min(high, float(bounds[1]))
        node = ctx.producer(node.input[0])
    return node, (low, high)


@registry.rule("DequantizeLinear", opsets=(10, None), inputs=(0,))
def dequantize_linear(ctx: RuleContext, grads: Grads) -> Result:
    """y = DequantizeLinear(QuantizeLinear(x, s, z), s, z): dx = g * [qmin <= round(x * (1 / s)) + z <= qmax]"""
    (g,) = grads
    assert g is not None  # the engine calls a rule only when its output has a gradient
    codes = ctx.inputs[0]
    quantizer, clipped = _quantizer_of(ctx, codes)
    if quantizer is None or quantizer.op_type != "QuantizeLinear" or not is_standard(quantizer):
        raise ValueError(
            f"DequantizeLinear node {ctx.node.name!r} reads {codes!r}, which depends on a trained value but no "
            "QuantizeLinear made; only QuantizeLinear -> DequantizeLinear pairs (fake quantization) are trained through"
        )
    mine = (ctx.inputs[1], ctx.inputs[2] if ctx.has_input(2) else "")
    theirs = (quantizer.input[1], quantizer.input[2] if len(quantizer.input) > 2 else "")
    same_axis = attributes(ctx.node).get("axis", 1) == attributes(quantizer).get("axis", 1)
    if not (same_axis and all(_same_parameter(ctx, a, b) for a, b in zip(mine, theirs, strict=True))):
        raise ValueError(
            f"DequantizeLinear node {ctx.node.name!r} dequantizes the codes of QuantizeLinear node "
            f"{quantizer.name!r} with another scale, zero point or axis; the straight-through gradient is that of "
            "a pair that shares them (as onnxruntime.quantization writes)"
        )
    x = quantizer.input[0]
    if ctx.depends_on_wrt(x):
        ctx.contribute(x, ctx.mul(g, _in_range(ctx, quantizer, clipped)))
    return [None] * len(ctx.inputs)


registry.straight_through("QuantizeLinear", "DequantizeLinear", through=("Clip",))
