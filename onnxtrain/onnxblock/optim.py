"""``onnxblock.optim``: the optimizer blocks (see :mod:`onnxtrain.optim`)."""

from __future__ import annotations

from onnxtrain.optim import *  # noqa: F403
from onnxtrain.optim import __all__ as __all__
