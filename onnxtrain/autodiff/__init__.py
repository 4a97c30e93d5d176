"""Reverse-mode autodiff over ONNX graphs, emitting standard ONNX operators only.

- :func:`build_gradients` appends the gradient graph to a :class:`GraphBuilder`;
  :func:`build_vjp` the vector-Jacobian product of several outputs with given cotangents;
- :class:`GradientRegistry` holds the rules; :func:`builtin_registry` is the
  frozen built-in one (extend a ``copy()`` of it for custom operators);
- :class:`RuleContext` is what a rule sees;
- :func:`hessian_vector_product` and :func:`jacobian` return models of a model's
  higher derivatives (reverse over reverse).
"""

from __future__ import annotations

from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.coverage import CoverageRow, coverage_rows
from onnxtrain.autodiff.derivatives import hessian_vector_product, jacobian
from onnxtrain.autodiff.engine import gradient_name
from onnxtrain.autodiff.errors import MissingGradientError, RuleError
from onnxtrain.autodiff.gradients import build_gradients, build_vjp
from onnxtrain.autodiff.registry import GradientRegistry, Rule
from onnxtrain.autodiff.rules import builtin_registry

__all__ = [
    "CoverageRow",
    "GradientRegistry",
    "MissingGradientError",
    "Rule",
    "RuleContext",
    "RuleError",
    "build_gradients",
    "build_vjp",
    "builtin_registry",
    "coverage_rows",
    "gradient_name",
    "hessian_vector_product",
    "jacobian",
]
