"""The built-in registry, filled by the rule modules of this package on import."""

from __future__ import annotations

from onnxtrain.autodiff.registry import GradientRegistry

#: Populated by ``onnxtrain.autodiff.rules.*`` when the package is imported, then frozen.
REGISTRY = GradientRegistry()
