"""``onnxblock.blocks``: the elementary blocks (see :mod:`onnxtrain.blocks`)."""

from __future__ import annotations

from onnxtrain.blocks import *  # noqa: F403
from onnxtrain.blocks import __all__ as __all__
