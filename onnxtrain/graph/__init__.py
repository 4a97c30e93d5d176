"""The graph layer: build contexts, naming, loading and the opset/IR policy."""

from __future__ import annotations

from onnxtrain.graph.builder import GraphBuilder, describe_type, tensor_type
from onnxtrain.graph.context import NoBaseModelError, base, current_builder, empty_base
from onnxtrain.graph.io import load_base_model

__all__ = [
    "GraphBuilder",
    "NoBaseModelError",
    "base",
    "current_builder",
    "describe_type",
    "empty_base",
    "load_base_model",
    "tensor_type",
]
