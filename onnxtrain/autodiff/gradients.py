"""The autodiff's public entry points: gradients and vector-Jacobian products, with the built-in rules by default.

The engine (:mod:`onnxtrain.autodiff.engine`) takes the rules it is given;
these functions give it :func:`~onnxtrain.autodiff.rules.builtin_registry`
unless ``registry`` is passed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from onnxtrain.autodiff.engine import backward, vector_jacobian_product
from onnxtrain.autodiff.registry import GradientRegistry
from onnxtrain.autodiff.rules import builtin_registry
from onnxtrain.graph.builder import GraphBuilder


def build_gradients(
    builder: GraphBuilder, loss: str, wrt: Sequence[str], registry: GradientRegistry | None = None
) -> dict[str, str]:
    """Append ``d loss / d x`` for every ``x`` in ``wrt``; return ``{x: "x_grad"}``.

    Args:
        builder: the model being built; the gradient nodes are appended to it.
        loss: a float scalar value (shape ``[]`` or all dimensions 1; a loss whose
            rank is unknown is taken to be a scalar, and seeded with ones of its
            run-time shape).
        wrt: float initializers, graph inputs or intermediate values.
        registry: the rules to use; default :func:`~onnxtrain.autodiff.rules.builtin_registry`.

    Raises:
        ValueError: a bad ``loss`` or ``wrt`` name, or a ``x_grad`` name already used.
        MissingGradientError: an operator on the path has no rule.

    On error the model is left as it was.
    """
    return backward(builder, loss, wrt, builtin_registry() if registry is None else registry)


def build_vjp(
    builder: GraphBuilder, seeds: Mapping[str, str], wrt: Sequence[str], registry: GradientRegistry | None = None
) -> dict[str, str | None]:
    """Append ``sum_y <seeds[y], d y / d x>`` for every ``x`` in ``wrt`` (a vector-Jacobian product).

    Args:
        builder: the model being built; the gradient nodes are appended to it.
        seeds: ``{value: cotangent}``, each cotangent a value of its value's type.
        wrt: float values of the model.
        registry: the rules to use; default :func:`~onnxtrain.autodiff.rules.builtin_registry`.

    Returns ``{x: gradient value}`` (generated names), ``None`` for an ``x`` no
    seeded value depends on. On error the model is left as it was.
    """
    return vector_jacobian_product(builder, seeds, wrt, builtin_registry() if registry is None else registry)


__all__ = ["build_gradients", "build_vjp"]
