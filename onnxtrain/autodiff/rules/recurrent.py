"""Gradient rules of the recurrent layers ``RNN``, ``GRU`` and ``LSTM`` (forward, reverse, bidirectional)."""

from __future__ import annotations

from onnxtrain.autodiff.rules._builtin import REGISTRY as registry  # noqa: F401 (rules register on import)
