"""Built-in gradient rules, one module per operator family.

Importing this package registers every rule into :data:`BUILTIN` and freezes
it; :func:`builtin_registry` returns it. The registry module knows nothing of
the rules: they register themselves, here.
"""

from __future__ import annotations

from onnxtrain.autodiff.registry import GradientRegistry
from onnxtrain.autodiff.rules import (
    attention,
    contrib,
    control_flow,
    convolution,
    elementwise,
    indexing,
    losses,
    matrix,
    nondifferentiable,
    normalization,
    pooling,
    quantized,
    recurrent,
    reductions,
    region_pooling,
    resize,
    sampling,
    sequence,
    shape,
    spectral,
)
from onnxtrain.autodiff.rules._builtin import registry

#: The frozen registry of built-in rules.
BUILTIN = registry.freeze()


def builtin_registry() -> GradientRegistry:
    """The frozen registry of onnxtrain's built-in rules (extend a ``copy()`` of it for custom operators)."""
    return BUILTIN


__all__ = [
    "BUILTIN",
    "attention",
    "builtin_registry",
    "contrib",
    "control_flow",
    "convolution",
    "elementwise",
    "indexing",
    "losses",
    "matrix",
    "nondifferentiable",
    "normalization",
    "pooling",
    "quantized",
    "recurrent",
    "reductions",
    "region_pooling",
    "resize",
    "sampling",
    "sequence",
    "shape",
    "spectral",
]
