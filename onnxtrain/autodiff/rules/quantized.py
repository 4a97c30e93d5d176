"""Gradient rules of quantized products.

The gradient flows to the float input of ``com.microsoft::MatMulNBits`` (and
of ``DequantizeLinear`` + ``MatMul``), never to the frozen quantized weights.
"""

from __future__ import annotations

from onnxtrain.autodiff.rules._builtin import REGISTRY as registry  # noqa: F401 (rules register on import)
