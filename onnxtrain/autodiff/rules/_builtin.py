"""The built-in registry, filled by the rule modules of this package on import."""

from __future__ import annotations

from onnxtrain.autodiff.registry import GradientRegistry

#: The registry each rule module of this package registers into (``@registry.rule``, ``registry.unary``, ...)
#: when the package is imported; the package then freezes it (``onnxtrain.autodiff.rules.BUILTIN``).
registry = GradientRegistry()
