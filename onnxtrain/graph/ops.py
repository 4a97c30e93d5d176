"""Emitters for operators whose form depends on the opset, and typed constants.

Each function appends nodes through a :class:`GraphBuilder` and returns the
name of the result, choosing the operator's form for the model's opset (for
example ReduceMean takes ``axes`` as an attribute before opset 18 and as an
input from 18 on).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper

from onnxtrain.graph import dtypes
from onnxtrain.graph.attributes import attribute
from onnxtrain.graph.builder import GraphBuilder

#: The opset from which each reduction takes its axes as an input.
_AXES_AS_INPUT_SINCE = {"ReduceSum": 13}
_AXES_AS_INPUT_DEFAULT = 18
#: The opset from which ScatterND and ScatterElements take ``reduction`` (``"add"``, ``"mul"``, ...).
_SCATTER_REDUCTION_SINCE = 16
#: The opset from which Split takes ``num_outputs`` (an even split needs no sizes).
_SPLIT_NUM_OUTPUTS_SINCE = 18
#: The opset from which DFT takes its axis as an input (an attribute before).
_DFT_AXIS_AS_INPUT_SINCE = 20


def axes_as_input(op_type: str, opset: int) -> bool:
    """Whether reduction ``op_type`` takes its axes as an input at ``opset`` (else as the ``axes`` attribute)."""
    return opset >= _AXES_AS_INPUT_SINCE.get(op_type, _AXES_AS_INPUT_DEFAULT)


def scatter_can_add(opset: int) -> bool:
    """Whether ScatterND and ScatterElements take ``reduction="add"`` at ``opset`` (from 16 on)."""
    return opset >= _SCATTER_REDUCTION_SINCE


def scatter_adds(node: onnx.NodeProto) -> bool:
    """Whether ``node`` (a ``ScatterND`` or ``ScatterElements``) adds its updates (``reduction="add"``)."""
    return attribute(node, "reduction") == b"add"


def constant_of_shape_makes(opset: int, elem_type: int) -> bool:
    """Whether ``ConstantOfShape`` at ``opset`` makes tensors of ``elem_type`` (bfloat16 from opset 20 on)."""
    return dtypes.schema_allows(onnx.defs.get_schema("ConstantOfShape", opset), "T2", elem_type)


def dft_axis_as_input(opset: int) -> bool:
    """Whether DFT takes its axis as an input at ``opset`` (from 20 on), else as the ``axis`` attribute."""
    return opset >= _DFT_AXIS_AS_INPUT_SINCE


def even_split(n: int, opset: int) -> dict[str, int]:
    """The attributes of a Split into ``n`` equal parts without a sizes input: ``num_outputs`` from opset 18 on,
    none before (the parts are then as many as the node's outputs)."""
    return {"num_outputs": n} if opset >= _SPLIT_NUM_OUTPUTS_SINCE else {}


def constant(b: GraphBuilder, value: object, elem_type: int, hint: str = "const") -> str:
    """An initializer holding ``value`` as a tensor of ONNX element type ``elem_type``."""
    return b.add_initializer(np.asarray(value, dtype=dtypes.to_numpy_dtype(elem_type)), hint)


def constant_like(b: GraphBuilder, value: object, like: str, hint: str = "const") -> str:
    """A constant with the element type of tensor ``like`` (a scalar by default)."""
    return constant(b, value, b.elem_type(like), hint)


def filled_like(b: GraphBuilder, like: str, value: float, hint: str = "filled") -> str:
    """``ConstantOfShape(Shape(like))`` filled with ``value`` in ``like``'s element type (any run-time shape)."""
    fill = helper.make_tensor("value", b.elem_type(like), [1], [value])
    return b.add_node1("ConstantOfShape", [b.add_node1("Shape", [like])], value=fill, hint=hint)


def int64s(b: GraphBuilder, values: Sequence[int], hint: str = "axes") -> str:
    """A 1-D int64 initializer (axes, shapes, indices)."""
    return b.add_initializer(np.asarray(list(values), dtype=np.int64), hint)


def reduce(
    b: GraphBuilder,
    op_type: str,
    x: str,
    axes: Sequence[int] | None = None,
    *,
    keepdims: bool = False,
    hint: str | None = None,
) -> str:
    """``op_type`` (ReduceSum, ReduceMean, ...) of ``x`` over ``axes``.

    ``None`` or no axes reduce over all axes, as an empty ``axes`` does in ONNX.
    """
    keep = int(keepdims)
    if axes is None or len(axes) == 0:
        return b.add_node1(op_type, [x], keepdims=keep, hint=hint)
    if axes_as_input(op_type, b.opset):
        return b.add_node1(op_type, [x, int64s(b, axes)], keepdims=keep, hint=hint)
    return b.add_node1(op_type, [x], axes=list(axes), keepdims=keep, hint=hint)


def unsqueeze(b: GraphBuilder, x: str, axes: Sequence[int], hint: str | None = None) -> str:
    """Insert size-1 dimensions at ``axes``."""
    return b.add_node1("Unsqueeze", [x, int64s(b, axes)], hint=hint)


def squeeze(b: GraphBuilder, x: str, axes: Sequence[int] | None = None, hint: str | None = None) -> str:
    """Remove the size-1 dimensions at ``axes`` (all of them when ``None``)."""
    inputs = [x] if axes is None else [x, int64s(b, axes)]
    return b.add_node1("Squeeze", inputs, hint=hint)
