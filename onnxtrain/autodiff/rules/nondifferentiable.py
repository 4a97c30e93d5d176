"""Operators whose outputs carry no gradient: they stop it (zero derivative almost everywhere).

Operators with only integer or bool outputs never carry a gradient anyway;
they are declared here so the coverage table lists them and so that no one
mistakes them for "no rule yet".
"""

from __future__ import annotations

from onnxtrain.autodiff.rules._builtin import registry
from onnxtrain.graph.operators import RANDOM_OPERATORS

# Shapes, sizes and indices.
registry.non_differentiable("Shape", "Size", "NonZero", "ArgMax", "ArgMin", "EyeLike", "Range")
# Comparisons and logic.
registry.non_differentiable(
    "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf"
)
registry.non_differentiable("BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot")
# Piecewise-constant functions: the derivative is zero almost everywhere.
registry.non_differentiable("Floor", "Ceil", "Round", "Sign")
# Random numbers.
registry.non_differentiable(*RANDOM_OPERATORS)
# Float inputs to integer results (detection, quantized kernels), or no float input at all.
registry.non_differentiable("NonMaxSuppression", "QLinearConv", "QLinearMatMul", "TfIdfVectorizer", "ImageDecoder")
# Integer and string operators (listed so that the coverage table accounts for every standard operator).
registry.non_differentiable(
    "ConvInteger", "MatMulInteger", "StringConcat", "StringNormalizer", "StringSplit", "RegexFullMatch"
)
