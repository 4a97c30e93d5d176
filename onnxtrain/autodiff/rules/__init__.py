"""Built-in gradient rules, one module per operator family.

Importing this package registers every rule into :data:`BUILTIN` and freezes
it; :func:`onnxtrain.autodiff.builtin_registry` returns it.
"""

from __future__ import annotations

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

__all__ = [
    "BUILTIN",
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
