"""Blocks that move data around: concatenation, reshapes, transposes, squeezes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from onnxtrain.blocks.block import Block, as_axes
from onnxtrain.graph import ops


class Concat(Block):
    """The inputs joined along ``axis`` (ONNX ``Concat``)."""

    def __init__(self, axis: int = 0) -> None:
        super().__init__()
        self._axis = int(axis)

    def build(self, *input_names: str) -> str:
        if not input_names:
            raise ValueError("Concat needs at least one input name")
        return self.builder.add_node1("Concat", list(input_names), axis=self._axis)


class Reshape(Block):
    """``x`` with a new shape (ONNX ``Reshape``).

    With ``shape`` given, it becomes a constant (``0`` copies the input's
    dimension, ``-1`` is inferred); with ``shape=None`` the block takes the
    shape as a second, int64 input.
    """

    def __init__(self, shape: Sequence[int] | None = None, allowzero: bool = False) -> None:
        super().__init__()
        self._shape = None if shape is None else [int(d) for d in shape]
        if self._shape is not None and self._shape.count(-1) > 1:
            raise ValueError(f"Reshape allows at most one -1 in shape, got {self._shape}")
        self._allowzero = int(allowzero)

    def build(self, input_name: str, shape_name: str | None = None) -> str:
        b = self.builder
        if self._shape is not None:
            if shape_name is not None:
                raise ValueError("Reshape got a shape both in the constructor and as an input; pass only one")
            shape_name = b.add_initializer(np.asarray(self._shape, dtype=np.int64), "shape")
        elif shape_name is None:
            raise ValueError("Reshape() without a shape needs two inputs: build(input_name, shape_name)")
        attributes = {"allowzero": self._allowzero} if self._allowzero else {}
        return b.add_node1("Reshape", [input_name, shape_name], **attributes)


class Transpose(Block):
    """``x`` with its axes permuted by ``perm`` (reversed when ``None``) (ONNX ``Transpose``)."""

    def __init__(self, perm: Sequence[int] | None = None) -> None:
        super().__init__()
        self._perm = None if perm is None else [int(axis) for axis in perm]

    def build(self, input_name: str) -> str:
        b = self.builder
        rank = b.rank(input_name)
        if self._perm is not None and rank is not None and sorted(self._perm) != list(range(rank)):
            raise ValueError(f"Transpose perm {self._perm} is not a permutation of the {rank} axes of {input_name!r}")
        if self._perm == [] and rank != 0:
            known = "unknown" if rank is None else rank
            raise ValueError(f"Transpose perm [] fits only a scalar, but {input_name!r} has rank {known}")
        attributes = {"perm": self._perm} if self._perm else {}  # a scalar's perm [] is the default
        return b.add_node1("Transpose", [input_name], **attributes)


class Flatten(Block):
    """``x`` as a matrix: axes before ``axis`` become rows, the rest columns (ONNX ``Flatten``)."""

    def __init__(self, axis: int = 1) -> None:
        super().__init__()
        self._axis = int(axis)

    def build(self, input_name: str) -> str:
        return self.builder.add_node1("Flatten", [input_name], axis=self._axis)


class Squeeze(Block):
    """``x`` without its size-1 axes ``axes`` (all size-1 axes when ``None``) (ONNX ``Squeeze``)."""

    def __init__(self, axes: int | Sequence[int] | None = None) -> None:
        super().__init__()
        self._axes = None if axes is None else as_axes(axes, "Squeeze")
        if self._axes == []:  # onnxruntime then removes all size-1 axes, onnx's shape inference none
            raise ValueError("Squeeze got axes=[]; pass the axes to remove, or None for all size-1 axes")

    def build(self, input_name: str) -> str:
        return ops.squeeze(self.builder, input_name, self._axes)


class Unsqueeze(Block):
    """``x`` with new size-1 axes at ``axes`` (ONNX ``Unsqueeze``)."""

    def __init__(self, axes: int | Sequence[int]) -> None:
        super().__init__()
        self._axes = as_axes(axes, "Unsqueeze")
        if not self._axes:
            raise ValueError("Unsqueeze needs at least one axis")

    def build(self, input_name: str) -> str:
        return ops.unsqueeze(self.builder, input_name, self._axes)
