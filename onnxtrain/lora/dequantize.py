"""The float value of a quantized weight, in NumPy, for merging adapters into it.

``DequantizeLinear``: ``(q - zero_point) * scale`` per tensor, per axis or per
block along ``axis``. ``com.microsoft::MatMulNBits``: the ``bits``-wide codes
of ``B`` (low bits first), less the per-block zero point (``2^(bits-1)`` when
omitted), times the per-block scale; rows past ``K`` in the last block dropped.
"""

from __future__ import annotations

import numpy as np
import onnx

from onnxtrain.graph.attributes import attributes
from onnxtrain.graph.external import TensorData


def _value(initializers: dict[str, onnx.TensorProto], name: str, data: TensorData | None) -> np.ndarray:
    """The value of initializer ``name``, read from where ``data`` says (``None``: every tensor holds its data)."""
    if name not in initializers:
        raise ValueError(f"{name!r} is not an initializer: a quantized weight's parameters must be constants")
    return (data or TensorData()).array(initializers[name])


def dequantize_linear(
    node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto], data: TensorData | None
) -> np.ndarray:
    """The output of ``DequantizeLinear`` node ``node`` over constant inputs, in the scale's float type."""
    q = _value(initializers, node.input[0], data).astype(np.float64)
    scale = _value(initializers, node.input[1], data)
    dtype = scale.dtype
    zero = (
        _value(initializers, node.input[2], data).astype(np.float64)
        if len(node.input) > 2 and node.input[2]
        else np.zeros_like(scale, dtype=np.float64)
    )
    scale = scale.astype(np.float64)
    attrs = attributes(node)
    axis = int(attrs.get("axis", 1)) % max(q.ndim, 1)  # type: ignore[call-overload]
    block = int(attrs.get("block_size", 0))  # type: ignore[call-overload]
    if scale.ndim == 0 or (scale.size == 1 and scale.ndim <= 1):
        return ((q - zero.reshape(())) * scale.reshape(())).astype(dtype)
    if block > 0:
        scale = np.repeat(scale, block, axis=axis).take(range(q.shape[axis]), axis=axis)
        zero = np.repeat(zero, block, axis=axis).take(range(q.shape[axis]), axis=axis)
    else:
        shape = [1] * q.ndim
        shape[axis] = q.shape[axis]
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return ((q - zero) * scale).astype(dtype)


def _unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """The ``bits``-wide codes of uint8 ``packed [n, m]``, low bits first: ``[n, m * 8 / bits]``."""
    per_byte = 8 // bits
    shifts = np.arange(per_byte, dtype=np.uint16) * bits
    codes = (packed.astype(np.uint16)[..., None] >> shifts) & ((1 << bits) - 1)
    return codes.reshape(packed.shape[0], -1)


def matmul_nbits_weight(
    node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto], data: TensorData | None
) -> np.ndarray:
    """``dequant(B)^T``, ``[K, N]``: MatMulNBits node ``node`` computes ``A @ dequant(B)^T (+ bias)``."""
    attrs = attributes(node)
    k, n = int(attrs["K"]), int(attrs["N"])  # type: ignore[call-overload]
    bits, block = int(attrs.get("bits", 4)), int(attrs["block_size"])  # type: ignore[call-overload]
    if bits not in (2, 4, 8):
        raise ValueError(f"MatMulNBits node {node.name!r} has bits={bits}; merging supports 2, 4 and 8")
    blocks = -(-k // block)
    codes = _unpack(_value(initializers, node.input[1], data).reshape(n, -1), bits).astype(np.float64)
    scales = _value(initializers, node.input[2], data)
    dtype = scales.dtype
    scales = scales.astype(np.float64).reshape(n, blocks)
    if len(node.input) > 3 and node.input[3]:
        zero_points = _value(initializers, node.input[3], data)
        if zero_points.dtype == np.uint8:
            zero = _unpack(zero_points.reshape(n, -1), bits)[:, :blocks].astype(np.float64)
        else:
            zero = zero_points.astype(np.float64).reshape(n, blocks)
    else:
        zero = np.full((n, blocks), float(1 << (bits - 1)))
    if len(node.input) > 4 and node.input[4]:
        if len(node.input) > 3 and node.input[3] and initializers[node.input[3]].data_type == onnx.TensorProto.UINT8:
            raise ValueError(
                f"MatMulNBits node {node.name!r} has the deprecated g_idx with packed zero points, which "
                "onnxruntime reads otherwise than documented; merging does not support it"
            )
        index = _value(initializers, node.input[4], data).reshape(k).astype(np.int64)
    else:
        index = np.arange(k) // block
    weight = (codes[:, :k] - zero[:, index]) * scales[:, index]  # [N, K]
    return weight.T.astype(dtype)
