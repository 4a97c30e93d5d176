"""Built-in gradient rules, one module per operator family.

Importing this package registers every rule into :data:`BUILTIN` and freezes
it; :func:`builtin_registry` returns it. The registry module knows nothing of
the rules: they register themselves, here.
"""

from __future__ import annotations

from onnxtrain.autodiff.registry import GradientRegistry
from onnxtrain.autodiff.rules import (
    contrib,
    control_flow,
    elementwise,
    matrix,
    nn,
    nondifferentiable,
    quantized,
    recurrent,
    reductions,
    sequence,
    shape,
)
from onnxtrain.autodiff.rules._builtin import REGISTRY

#: The frozen registry of built-in rules.
BUILTIN = REGISTRY.freeze()


def builtin_registry() -> GradientRegistry:
    """The frozen registry of onnxtrain's built-in rules (extend a ``copy()`` of it for custom operators)."""
    return BUILTIN


__all__ = [
    "BUILTIN",
    "builtin_registry",
    "contrib",
    "control_flow",
    "elementwise",
    "matrix",
    "nn",
    "nondifferentiable",
    "quantized",
    "recurrent",
    "reductions",
    "sequence",
    "shape",
]
