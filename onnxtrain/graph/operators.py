"""Facts about ONNX operators that more than one layer needs (the graph passes, the gradient rules)."""

from __future__ import annotations

#: Operators that draw random numbers: two evaluations may differ, and their draws carry no gradient.
RANDOM_OPERATORS = (
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
)

__all__ = ["RANDOM_OPERATORS"]
