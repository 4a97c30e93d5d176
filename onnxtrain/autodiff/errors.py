"""The autodiff's errors: an operator without a rule, a rule that returned something unusable."""

from __future__ import annotations


class MissingGradientError(ValueError):
    """An operator on the path from a ``wrt`` value to the loss has no gradient rule."""


class RuleError(TypeError):
    """A gradient rule returned something the engine cannot use (a bug in the rule)."""


__all__ = ["MissingGradientError", "RuleError"]
