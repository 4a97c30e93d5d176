"""``onnxblock.blocks``: the elementary blocks (see :mod:`onnxtrain.blocks`), ``Constant`` as ONNX Runtime's."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxtrain import blocks as _blocks
from onnxtrain.blocks import *  # noqa: F403
from onnxtrain.blocks import __all__ as __all__


class Constant(_blocks.Constant):
    """ONNX Runtime's ``Constant(value: float)``: a Python number, an int too, is a float32 scalar, so that
    ``Mul()(Constant(2)(), loss)`` multiplies a float loss as it does there; anything else (arrays, lists,
    ``dtype=``) as :class:`onnxtrain.blocks.Constant`, where ``Constant(2)`` is an int64."""

    def __init__(self, value: Any, dtype: Any = None) -> None:
        if dtype is None and isinstance(value, int) and not isinstance(value, bool):
            dtype = np.float32
        super().__init__(value, dtype)
