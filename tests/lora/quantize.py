"""Quantized bases for the LoRA tests: 4-bit ``MatMulNBits`` (onnxruntime's quantizer) and int8 ``DequantizeLinear``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tests.autodiff.specs_quantized import pack


def quantize_4bit(weight: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """MatMulNBits' ``B``, ``scales`` and packed ``zero_points`` of ``weight: [K, N]``, asymmetric per block of K;
    and the weight they stand for (``[K, N]``, ``(code - zero) * scale``)."""
    k, n = weight.shape
    blocks = -(-k // block_size)
    rows = np.zeros((n, blocks * block_size), weight.dtype)
    rows[:, :k] = weight.T
    grouped = rows.reshape(n, blocks, block_size).astype(np.float64)
    low, high = np.minimum(grouped.min(axis=2), 0.0), np.maximum(grouped.max(axis=2), 0.0)
    scale = np.where(high > low, (high - low) / 15.0, 1.0)
    zero = np.clip(np.round(-low / scale), 0, 15)
    codes = np.clip(np.round(grouped / scale[..., None] + zero[..., None]), 0, 15).astype(np.uint8)
    packed = pack(codes.reshape(n, -1), 4).reshape(n, blocks, block_size // 2)
    zero_codes = np.zeros((n, blocks + blocks % 2), np.uint8)
    zero_codes[:, :blocks] = zero
    dequantized = ((codes - zero[..., None]) * scale[..., None]).reshape(n, -1)[:, :k].T.astype(weight.dtype)
    return packed, scale.astype(weight.dtype).reshape(-1), pack(zero_codes, 4).reshape(-1), dequantized


def matmul_nbits(
    model: onnx.ModelProto, weights: Sequence[str], block_size: int = 16
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``model`` with the MatMul/Gemm (``alpha = beta = 1``) over each of ``weights`` made a 4-bit ``MatMulNBits``.

    The weight is quantized as onnxruntime's ``MatMulNBitsQuantizer`` does
    with ``is_symmetric=False`` (which needs ``onnx_ir``, not installed here):
    per block of ``block_size`` rows, ``scale = (max - min) / 15``, a uint8 zero
    point, codes packed two to a byte, low nibble first. A Gemm's bias becomes
    MatMulNBits' ``bias``. Also returns ``{weight: its dequantized value}``, stored
    as the float weight was (``[out, in]`` under Gemm's ``transB=1``).
    """
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    values = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    added: list[onnx.TensorProto] = []
    dequantized: dict[str, np.ndarray] = {}
    nodes = []
    for node in graph.node:
        if node.op_type not in ("MatMul", "Gemm") or node.input[1] not in weights:
            nodes.append(node)
            continue
        name = node.input[1]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        weight = values[name].T if attrs.get("transB", 0) else values[name]
        packed, scales, zero, value = quantize_4bit(weight, block_size)
        dequantized[name] = value.T if attrs.get("transB", 0) else value
        added += [
            numpy_helper.from_array(packed, f"{name}_Q4"),
            numpy_helper.from_array(scales, f"{name}_scales"),
            numpy_helper.from_array(zero, f"{name}_zero_points"),
        ]
        inputs = [node.input[0], f"{name}_Q4", f"{name}_scales", f"{name}_zero_points"]
        if node.op_type == "Gemm" and len(node.input) > 2:
            inputs += ["", node.input[2]]
        k, n = weight.shape
        nodes.append(
            helper.make_node(
                "MatMulNBits",
                inputs,
                list(node.output),
                name=node.name,
                domain="com.microsoft",
                K=k,
                N=n,
                bits=4,
                block_size=block_size,
            )
        )
    quantized = {name for name in weights}
    kept = [tensor for tensor in graph.initializer if tensor.name not in quantized]
    assert len(kept) == len(graph.initializer) - len(quantized), f"not all of {weights} are initializers"
    del graph.initializer[:]
    graph.initializer.extend([*kept, *added])
    del graph.node[:]
    graph.node.extend(nodes)
    copy.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return copy, dequantized


def dequantize_linear(model: onnx.ModelProto, weights: Sequence[str]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``model`` with each of ``weights`` (``[in, out]``) stored as int8 per output column, and dequantized.

    ``W`` becomes ``W.int8`` (``round(W / s)``, ``s = max|W[:, j]| / 127``) and a
    ``DequantizeLinear(W.int8, W.scale, W.zero_point, axis=1)`` node (zero points
    0, written out as onnxruntime's quantizer does) gives ``W`` back. Also returns
    ``{W: codes * scale}``. Without the zero point, onnxruntime 1.23 cannot load the
    training model: its QDQ propagation inserts a QuantizeLinear of the default
    type (uint8) beside the int8 weight.
    """
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    kept, nodes = [], []
    dequantized: dict[str, np.ndarray] = {}
    for tensor in graph.initializer:
        if tensor.name not in weights:
            kept.append(tensor)
            continue
        value = numpy_helper.to_array(tensor)
        scale = (np.abs(value).max(axis=0) / 127.0).astype(value.dtype)
        codes = np.clip(np.round(value / scale), -127, 127).astype(np.int8)
        dequantized[tensor.name] = (codes.astype(np.float64) * scale).astype(value.dtype)
        kept += [
            numpy_helper.from_array(codes, f"{tensor.name}.int8"),
            numpy_helper.from_array(scale, f"{tensor.name}.scale"),
            numpy_helper.from_array(np.zeros(scale.shape, np.int8), f"{tensor.name}.zero_point"),
        ]
        nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [f"{tensor.name}.int8", f"{tensor.name}.scale", f"{tensor.name}.zero_point"],
                [tensor.name],
                axis=1,
                name=f"{tensor.name}/DequantizeLinear",
            )
        )
    assert len(nodes) == len(weights), f"not all of {weights} are initializers"
    del graph.initializer[:]
    graph.initializer.extend(kept)
    rest = list(graph.node)
    del graph.node[:]
    graph.node.extend([*nodes, *rest])
    return copy, dequantized
