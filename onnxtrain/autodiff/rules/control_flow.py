"""Gradient rules of the control-flow operators ``If``, ``Scan`` and ``Loop``."""

from __future__ import annotations

from onnxtrain.autodiff.rules._builtin import REGISTRY as registry  # noqa: F401 (rules register on import)
