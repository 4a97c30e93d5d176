"""Fixed tables, told by their values: position encodings of sines and cosines, and additive attention masks.

A table of positions sliced to the sequence and added to the embeddings is a
learned position embedding (a parameter: ``nn.Parameter(torch.zeros(1, L, D))``)
or the Transformer's fixed encoding (a buffer: ``pe[p, 2i] = sin(p w_i)``,
``pe[p, 2i + 1] = cos(p w_i)``), and a TorchScript export writes both the
same way. :func:`is_sinusoidal` tells the fixed one by its values: with its
size-1 axes dropped, a ``[positions, width]`` table whose first row is ``0``
(sines) or ``1`` (cosines) in every column, some of each, no value above 1
in magnitude, and each column a sinusoid of the position, which
``t[p + 1] + t[p - 1] = 2 cos(w) t[p]`` checks whatever the frequency and
however the columns are laid out (interleaved or in halves).

A causal mask sliced to the sequence and added to the attention scores
(``scores + self.mask[:T, :T]``) is a buffer too, which :func:`is_mask` tells:
only zeros and values of -10,000 or less (or minus infinity), both present.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx

from onnxtrain.graph import dtypes
from onnxtrain.graph.external import TensorData

#: The most elements of a table whose values are read to tell (a fixed encoding of 8,192 positions of 1,024).
MAX_ELEMENTS = 1 << 23
#: The element types whose values are read, as NumPy's.
_READ = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64, onnx.TensorProto.FLOAT16: np.float16}
#: Per position, the rounding of a float32 ``sin(p * w)`` the check allows (the argument's rounding grows with p).
_ROUNDING_PER_POSITION = 4e-7


def is_sinusoidal(values: np.ndarray) -> bool:
    """Whether ``values`` is a fixed sinusoidal position encoding (see the module docstring)."""
    given = np.asarray(values)
    rounding = float(np.finfo(given.dtype).eps) if given.dtype.kind == "f" else 0.0  # of each stored value
    table = given.astype(np.float64).reshape([size for size in given.shape if size != 1])
    if table.ndim != 2 or table.shape[0] < 3 or table.shape[1] < 2 or not np.isfinite(table).all():
        return False
    if np.abs(table).max() > 1.0 + 1e-5:
        return False
    sines, cosines = np.abs(table[0]) <= 1e-5, np.abs(table[0] - 1.0) <= 1e-5
    if not (sines | cosines).all() or not sines.any() or not cosines.any():
        return False
    middle, around = table[1:-1], table[2:] + table[:-2]
    energy = (middle * middle).sum(axis=0)
    cos_w = np.where(energy > 0, (middle * around).sum(axis=0) / (2.0 * np.where(energy > 0, energy, 1.0)), 1.0)
    if np.abs(cos_w).max() > 1.0 + 1e-6 + 8 * rounding or cos_w.min() > 1.0 - 1e-9:  # some column must turn
        return False
    allowed = 1e-5 + 8 * rounding + _ROUNDING_PER_POSITION * np.arange(1, len(middle) + 1)[:, None]
    return bool((np.abs(around - 2.0 * cos_w * middle) <= allowed).all())


def is_mask(values: np.ndarray) -> bool:
    """Whether ``values`` is an additive mask: zeros and values <= -1e4 (or minus infinity), some of each."""
    table = np.asarray(values, dtype=np.float64)
    if np.isnan(table).any() or np.isposinf(table).any():
        return False
    zeros, masked = table == 0.0, table <= -1e4
    return bool((zeros | masked).all() and zeros.any() and masked.any())


@dataclass(frozen=True)
class Tables:
    """The float initializers of a model, whose values :meth:`fixed` reads through ``data``, once each (roles
    ask again at each round of their fixpoint)."""

    tensors: Mapping[str, onnx.TensorProto]
    data: TensorData
    _told: dict[str, bool | None] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, model: onnx.ModelProto, data: TensorData) -> Tables:
        return cls({t.name: t for t in model.graph.initializer if dtypes.is_float(t.data_type)}, data)

    def fixed(self, name: str) -> bool | None:
        """Whether initializer ``name`` is a fixed table (:func:`is_sinusoidal`, :func:`is_mask`); ``None`` where
        its values cannot be read here (no data, a file not found, too large)."""
        if name not in self._told:
            self._told[name] = self._fixed(name)
        return self._told[name]

    def _fixed(self, name: str) -> bool | None:
        tensor = self.tensors.get(name)
        size = int(np.prod(tensor.dims)) if tensor is not None else 0
        if tensor is None or tensor.data_type not in _READ or not 0 < size <= MAX_ELEMENTS:
            return None
        if not self.data.reaches(tensor):
            return None
        dtype = _READ[tensor.data_type]
        try:
            raw = b"".join(self.data.chunks(tensor))
        except (ValueError, OSError):
            return None
        if len(raw) != size * np.dtype(dtype).itemsize:  # a stub without its data
            return None
        values = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).reshape(tensor.dims)
        return is_sinusoidal(values) or is_mask(values)


__all__ = ["MAX_ELEMENTS", "Tables", "is_mask", "is_sinusoidal"]
