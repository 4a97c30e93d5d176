"""Reverse-mode autodiff over ONNX graphs, emitting standard ONNX operators only.

- :func:`build_gradients` appends the gradient graph to a :class:`GraphBuilder`;
- :class:`GradientRegistry` holds the rules; :func:`builtin_registry` is the
  frozen built-in one (extend a ``copy()`` of it for custom operators);
- :class:`RuleContext` is what a rule sees.
"""

from __future__ import annotations

from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.engine import MissingGradientError, RuleError, build_gradients, gradient_name
from onnxtrain.autodiff.registry import CoverageRow, GradientRegistry, Rule, builtin_registry

__all__ = [
    "CoverageRow",
    "GradientRegistry",
    "MissingGradientError",
    "Rule",
    "RuleContext",
    "RuleError",
    "build_gradients",
    "builtin_registry",
    "gradient_name",
]
