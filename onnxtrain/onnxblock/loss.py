"""``onnxblock.loss``: the loss blocks (see :mod:`onnxtrain.losses`)."""

from __future__ import annotations

from onnxtrain.losses import *  # noqa: F403
from onnxtrain.losses import __all__ as __all__
