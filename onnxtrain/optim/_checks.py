"""Validation of optimizer hyper-parameters: errors that name the argument and its valid range."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping

import numpy as np


def number(owner: str, argument: str, value: object, valid: Callable[[float], bool], valid_range: str) -> float:
    """``value`` as a float; ``TypeError`` if it is no real number, ``ValueError`` if not in ``valid_range``.

    NaN is never valid; ``valid`` decides about infinities.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{owner}: {argument} must be {valid_range} (a real number), not {type(value).__name__} {value!r}"
        )
    result = float(value)
    if math.isnan(result) or not valid(result):
        raise ValueError(f"{owner}: {argument}={value!r} is out of range; {argument} must be {valid_range}")
    return result


def non_negative(owner: str, argument: str, value: object) -> float:
    """A finite number >= 0 (weight decay, momentum, eps, ...)."""
    return number(owner, argument, value, lambda v: 0.0 <= v < math.inf, "a finite number >= 0")


def unit_interval(owner: str, argument: str, value: object, *, include_one: bool = True) -> float:
    """A number in ``[0, 1]`` (or ``[0, 1)`` with ``include_one=False``)."""
    if include_one:
        return number(owner, argument, value, lambda v: 0.0 <= v <= 1.0, "in [0, 1]")
    return number(owner, argument, value, lambda v: 0.0 <= v < 1.0, "in [0, 1)")


def flag(owner: str, argument: str, value: object) -> bool:
    """A bool (NumPy bools too); ``TypeError`` otherwise."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{owner}: {argument} must be True or False, not {type(value).__name__} {value!r}")
    return bool(value)


def betas(owner: str, value: object) -> tuple[float, float]:
    """A pair ``(beta1, beta2)``, each in ``[0, 1)``."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or not hasattr(value, "__iter__"):
        raise TypeError(f"{owner}: betas must be a pair (beta1, beta2) of numbers in [0, 1), not {value!r}")
    items = tuple(value)  # type: ignore[arg-type]
    if len(items) != 2:
        raise ValueError(f"{owner}: betas={value!r} must be a pair (beta1, beta2) of numbers in [0, 1)")
    return (
        unit_interval(owner, "betas[0]", items[0], include_one=False),
        unit_interval(owner, "betas[1]", items[1], include_one=False),
    )


def patterns(owner: str, argument: str, value: object) -> tuple[str, ...]:
    """Glob patterns: one string, or a sequence of non-empty strings."""
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(item, str) and item for item in items):
        raise TypeError(
            f"{owner}: {argument} must be a list of parameter-name patterns (non-empty strings), not {value!r}"
        )
    return tuple(items)


def scales(owner: str, argument: str, value: object) -> dict[str, float]:
    """``{pattern: factor}``: non-empty string patterns, each to a finite number > 0; ``None`` is none."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(key, str) and key for key in value):
        raise TypeError(
            f"{owner}: {argument} must be a mapping of parameter-name patterns to factors "
            f"({{'classifier.*': 10.0}}), not {value!r}"
        )
    return {
        pattern: number(owner, f"{argument}[{pattern!r}]", factor, lambda v: 0.0 < v < math.inf, "a finite number > 0")
        for pattern, factor in value.items()
    }


#: Keyword arguments of ``torch.optim``'s constructors that an optimizer block does not take.
_TORCH_ONLY = ("params", "lr", "learning_rate")


def torch_habits(
    owner: str, names: list[str], positional: int, args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    """``TypeError`` for a ``torch.optim`` habit in an optimizer block's arguments: parameters or a learning
    rate passed in (``SGD(model.parameters(), lr=0.1)``), or more positional arguments than the block takes
    (``positional`` of its hyper-parameters ``names``), whose order is not torch's."""
    given = [name for name in _TORCH_ONLY if name in kwargs]
    first = args[0] if args else None
    rate = (
        "lr" in given
        or "learning_rate" in given
        or (isinstance(first, numbers.Real) and not isinstance(first, (bool, np.bool_)))
    )
    if "params" in given or (args and not isinstance(first, (numbers.Real, bool, np.bool_, tuple, list))):
        raise TypeError(
            f"{owner} takes no parameters: the parameters it updates are the artifacts' trainable ones "
            "(generate_artifacts's requires_grad); pass only its hyper-parameters, by keyword"
        )
    if rate:
        raise TypeError(
            f"{owner} takes no learning rate: the optimizer model takes the rate at each step; set it when "
            "training (onnxtrain.api.Optimizer.set_learning_rate(1e-3), a scheduler, or onnxtrain train --lr); "
            f"pass {owner} only its hyper-parameters, by keyword"
        )
    if len(args) > positional:
        raise TypeError(
            f"{owner}'s hyper-parameters are keyword arguments, in any order ({', '.join(names)}): "
            f"{owner}({', '.join(map(repr, args))}) does not say which is which"
        )
