"""What to tell a user whose scikit-learn model, converted by skl2onnx, cannot be trained as it is.

skl2onnx writes some models with ``ai.onnx.ml`` operators that keep their
coefficients in attributes and have no gradient (``LinearRegressor``,
``LinearClassifier``) or return a sequence of maps (``ZipMap``). Most have a
standard-operator form the converter writes on request. The hints live in
:mod:`onnxtrain.graph.converted`, which ``generate_artifacts`` shares.
"""

from __future__ import annotations

from onnxtrain.graph.converted import ALTERNATIVES, NOT_DIFFERENTIABLE, converter_hints, with_converter_hints

__all__ = ["ALTERNATIVES", "NOT_DIFFERENTIABLE", "converter_hints", "with_converter_hints"]
