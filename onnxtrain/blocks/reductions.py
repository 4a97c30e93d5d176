"""Reduction blocks: sums, means and extrema over axes, and the global L2 norm."""

from __future__ import annotations

from collections.abc import Sequence

from onnxtrain.blocks.block import Block, as_axes
from onnxtrain.graph import ops


class _Reduce(Block):
    """``op(x)`` over ``axes`` (an axis or a list; all axes when ``None`` or empty, as in ONNX).

    ``keepdims`` defaults to ``True`` as in ONNX (and in ONNX Runtime's blocks,
    which reduce over all axes and keep them); the axes go in as an attribute or
    as an input, whichever the model's opset wants.
    """

    _op_type: str = ""

    def __init__(self, axes: int | Sequence[int] | None = None, keepdims: bool = True) -> None:
        super().__init__()
        self._axes = None if axes is None else as_axes(axes, type(self).__name__)
        self._keepdims = keepdims

    def build(self, input_name: str) -> str:
        return ops.reduce(self.builder, self._op_type, input_name, self._axes, keepdims=self._keepdims)


class ReduceMean(_Reduce):
    """Mean over ``axes`` (ONNX ``ReduceMean``)."""

    _op_type = "ReduceMean"


class ReduceSum(_Reduce):
    """Sum over ``axes`` (ONNX ``ReduceSum``)."""

    _op_type = "ReduceSum"


class ReduceMax(_Reduce):
    """Maximum over ``axes`` (ONNX ``ReduceMax``)."""

    _op_type = "ReduceMax"


class ReduceMin(_Reduce):
    """Minimum over ``axes`` (ONNX ``ReduceMin``)."""

    _op_type = "ReduceMin"


class ReduceAllL2(Block):
    """``sqrt(sum_i sum(x_i ** 2))``: the L2 norm of all inputs together, a scalar.

    Emits ``ReduceSumSquare`` per input, ``Sum`` and ``Sqrt``: standard
    operators only (ONNX Runtime's block needs its ``com.microsoft`` kernel).
    All inputs must share one floating-point element type.
    """

    def build(self, *reduce_node_input_names: str) -> str:
        if not reduce_node_input_names:
            raise ValueError("ReduceAllL2 needs at least one input name")
        b = self.builder
        squares = [ops.reduce(b, "ReduceSumSquare", name, None, keepdims=False) for name in reduce_node_input_names]
        total = squares[0] if len(squares) == 1 else b.add_node1("Sum", squares)
        return b.add_node1("Sqrt", [total], hint="reducealll2")
