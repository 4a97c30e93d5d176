"""onnxtrain: make any forward-only ONNX model trainable.

Stack losses on a base model with blocks (``onnxtrain.onnxblock``), derive the
training graph in standard ONNX operators, and train on stock onnxruntime.
"""

from __future__ import annotations

from onnxtrain import blocks, lora, losses
from onnxtrain.graph import base, empty_base

__version__ = "0.1.0.dev0"

__all__ = ["__version__", "base", "blocks", "empty_base", "lora", "losses"]
