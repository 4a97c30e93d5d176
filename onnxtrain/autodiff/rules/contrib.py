"""Gradient rules of the ``com.microsoft`` operators that ONNX Runtime's transformer optimizer writes.

Fused normalizations, GELUs, rotary embeddings and attention; their
gradients are written in standard operators.
"""

from __future__ import annotations

from onnxtrain.autodiff.rules._builtin import REGISTRY as registry  # noqa: F401 (rules register on import)
