"""A graph input or output as the runtime checks it: name, NumPy dtype and dimensions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from onnxtrain.graph import dtypes
from onnxtrain.training.values import dtype_text, is_string

#: A dimension: a fixed size, a symbolic name, or ``None`` (unknown).
Dim = int | str | None


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output: name, NumPy dtype and dimensions (``None``: unknown rank)."""

    name: str
    dtype: np.dtype
    dims: tuple[Dim, ...] | None
    note: str = field(default="", compare=False)  # the value's doc_string: where its shape comes from

    @classmethod
    def of(cls, value: onnx.ValueInfoProto, model: str) -> TensorSpec:
        if not value.type.HasField("tensor_type"):
            raise ValueError(
                f"the {model}'s {value.name!r} is a {value.type.WhichOneof('value')}; only tensors are supported"
            )
        tensor = value.type.tensor_type
        dims = None
        if tensor.HasField("shape"):
            dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim)
        return cls(value.name, dtypes.to_numpy_dtype(tensor.elem_type), dims, value.doc_string)

    @property
    def static(self) -> bool:
        """Whether every dimension is a fixed size (the tensor's shape is known before running)."""
        return self.dims is not None and all(d.__class__ is int for d in self.dims)

    @property
    def shape(self) -> tuple[int, ...]:
        """The fixed shape of a :attr:`static` spec."""
        if not self.static or self.dims is None:
            raise ValueError(f"{self.name!r} ({self.describe()}) has no fixed shape")
        return tuple(int(d) for d in self.dims if d is not None)

    @property
    def is_string(self) -> bool:
        """Whether this is an ONNX STRING tensor (NumPy ``object`` arrays of ``str``)."""
        return is_string(self.dtype)

    def describe(self) -> str:
        """``float32[batch, 784]``; ``string[batch]`` for a STRING tensor."""
        if self.dims is None:
            return f"{dtype_text(self.dtype)}[...]"
        return f"{dtype_text(self.dtype)}[{', '.join('?' if d is None else str(d) for d in self.dims)}]"

    def fits(self, dtype: np.dtype, shape: Sequence[int]) -> bool:
        """Whether a tensor of ``dtype`` and ``shape`` may be fed here (symbolic dimensions take any size)."""
        if dtype != self.dtype:
            return False
        dims = self.dims
        if dims is None:
            return True
        if len(shape) != len(dims):
            return False
        for d, n in zip(dims, shape):  # noqa: B905, SIM110 (lengths checked; a loop is faster than all())
            if d.__class__ is int and d != n:
                return False
        return True


def shape_text(shape: Sequence[int]) -> str:
    """``[64, 784]``."""
    return f"[{', '.join(str(d) for d in shape)}]"


def axes_permutation(sample: tuple[int, ...], wanted: tuple[int, ...]) -> tuple[int, ...] | None:
    """The order of ``sample``'s axes that gives ``wanted`` (equal sizes keep their order); None if there is none."""
    if len(sample) != len(wanted) or sorted(sample) != sorted(wanted) or sample == wanted:
        return None
    free = list(range(len(sample)))
    order = []
    for size in wanted:
        axis = next(axis for axis in free if sample[axis] == size)
        free.remove(axis)
        order.append(axis)
    return tuple(order)


def layout_hint(axes: tuple[int, ...]) -> str:
    """``channels last (NHWC) where the input takes channels first (NCHW)``, or what the order of axes says."""
    if axes == (0, 3, 1, 2):
        return "its samples look channels last (NHWC) where the input takes channels first (NCHW)"
    if axes == (0, 2, 3, 1):
        return "its samples look channels first (NCHW) where the input takes channels last (NHWC)"
    return "its axes have the input's sizes in another order"


__all__ = ["Dim", "TensorSpec", "axes_permutation", "layout_hint", "shape_text"]
