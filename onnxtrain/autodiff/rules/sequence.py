"""Sequence and optional operators: building, indexing, editing, splitting into and concatenating sequences.

**The gradient of a sequence value is a 1-D tensor**: the gradients of its
elements, each flattened (row-major), concatenated in sequence order. A
gradient with a tensor type lets the engine accumulate fan-out with ``Sum`` as
it does for tensors (``Sum`` takes no sequences), and every rule here reads and
writes that layout: ``SequenceAt`` pads ``g`` into the span of its element,
``SequenceConstruct`` splits it back into its inputs, ``SequenceErase`` inserts
zeros for the erased element, and ``SplitToSequence``/``ConcatFromSequence``
map positions between the concatenated tensor and the flat layout. The span of
element ``i`` starts at ``sum(size(s[j]) for j < i)``; the sizes come from the
sequence's element type when its shape is static, else from ``SequenceMap``
(opset 17+) or ``Loop``. The gradient of an optional is that of its element.

The engine puts sequence- and optional-typed values holding floats on the
gradient path (:func:`onnxtrain.autodiff.paths.carries_float`).
``SequenceEmpty``, ``SequenceLength`` and ``OptionalHasElement`` are declared
non-differentiable, and ``OptionalGetElement`` (which also passes tensors
through, opset 18+) is registered.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from onnxtrain.autodiff import dims
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.registry import GradientRegistry, Grads, Result
from onnxtrain.autodiff.rules._builtin import registry

_INT64 = onnx.TensorProto.INT64


def _as_1d(ctx: RuleContext, value: str) -> str:
    return ctx.op("Reshape", value, ctx.int64s([1]))


def _element_type(ctx: RuleContext, seq: str) -> onnx.TypeProto | None:
    """The type of the elements of sequence ``seq``, when known."""
    type_proto = ctx.builder.type_of(seq)
    if type_proto is None or not type_proto.HasField("sequence_type"):
        return None
    elem = type_proto.sequence_type.elem_type
    return elem if elem.HasField("tensor_type") else None


def _static_numel(type_proto: onnx.TypeProto | None) -> int | None:
    """The number of elements of a tensor type whose dimensions are all known, else ``None``."""
    if type_proto is None or not type_proto.tensor_type.HasField("shape"):
        return None
    declared = type_proto.tensor_type.shape.dim
    if not all(d.HasField("dim_value") for d in declared):
        return None
    return int(np.prod([d.dim_value for d in declared], dtype=np.int64))


def _sizes(ctx: RuleContext, seq: str, elem_type: int) -> str:
    """``[size(s[0]), size(s[1]), ...]`` (int64, 1-D) for sequence ``seq`` of ``elem_type`` tensors."""
    elem = _element_type(ctx, seq)
    numel = _static_numel(elem)
    count = ctx.op("SequenceLength", seq)
    if numel is not None:
        return ctx.op("Expand", ctx.int64s([numel]), _as_1d(ctx, count))
    names = ctx.builder.names
    x, size = names.fresh("seq_element"), names.fresh("seq_element_size")
    x_info = helper.make_tensor_value_info(x, elem_type, None)
    size_info = helper.make_tensor_value_info(size, _INT64, [])
    if ctx.opset >= 17:  # a sequence of scalar sizes, stacked
        body = helper.make_graph([helper.make_node("Size", [x], [size])], names.fresh("sizes"), [x_info], [size_info])
        return ctx.op("ConcatFromSequence", ctx.op("SequenceMap", seq, body=body), axis=0, new_axis=1)
    step, cond, cond_out = (names.fresh(hint) for hint in ("seq_step", "seq_cond", "seq_cond_out"))
    body = helper.make_graph(  # reads `seq` from the enclosing graph (opset 13 Identity takes no sequences)
        [
            helper.make_node("Identity", [cond], [cond_out]),
            helper.make_node("SequenceAt", [seq, step], [x]),
            helper.make_node("Size", [x], [size]),
        ],
        names.fresh("sizes"),
        [
            helper.make_tensor_value_info(step, _INT64, []),
            helper.make_tensor_value_info(cond, onnx.TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info(cond_out, onnx.TensorProto.BOOL, []), size_info],
    )
    return ctx.op("Loop", count, "", body=body)


def _span(ctx: RuleContext, sizes: str, index: str) -> tuple[str, str, str]:
    """``(start, size, total)`` of element ``index`` (a non-negative int64 scalar) in the flat layout."""
    starts = ctx.op("CumSum", sizes, dims.int64_scalar(ctx, 0), exclusive=1)
    return ctx.op("Gather", starts, index), ctx.op("Gather", sizes, index), ctx.op("ReduceSum", sizes, keepdims=0)


def _wrap(ctx: RuleContext, position: str, count: str) -> str:
    """A position in ``[-count, count)`` as a non-negative int64 scalar."""
    return ctx.op("Mod", dims.int64_scalar(ctx, position), count)


def _flat_slice(ctx: RuleContext, g: str, start: str, end: str) -> str:
    return ctx.op("Slice", g, _as_1d(ctx, start), _as_1d(ctx, end), ctx.int64s([0]))


# ---------------------------------------------------------------- building and indexing


def sequence_construct(ctx: RuleContext, grads: Grads) -> Result:
    """dx_i = reshape(split(g, [size(x_0), size(x_1), ...])_i, shape(x_i))"""
    (g,) = grads
    static = [ctx.static_shape(x) for x in ctx.inputs]
    if all(s is not None for s in static):
        sizes = ctx.int64s([int(np.prod(s, dtype=np.int64)) for s in static])  # type: ignore[arg-type]
    else:
        sizes = ctx.op("Concat", *(_as_1d(ctx, ctx.op("Size", x)) for x in ctx.inputs), axis=0)
    parts = [g] if len(ctx.inputs) == 1 else ctx.op_n("Split", len(ctx.inputs), g, sizes, axis=0)
    return [
        ctx.op("Reshape", part, ctx.shape_of(x)) if ctx.needs(i) else None
        for i, (part, x) in enumerate(zip(parts, ctx.inputs, strict=True))
    ]


def sequence_at(ctx: RuleContext, grads: Grads) -> Result:
    """ds = zeros with g written (flat) into the span of element p"""
    (g,) = grads
    seq, position = ctx.inputs
    sizes = _sizes(ctx, seq, ctx.elem_type(g))
    index = _wrap(ctx, position, ctx.op("SequenceLength", seq))
    start, size, total = _span(ctx, sizes, index)
    after = ctx.op("Sub", total, ctx.op("Add", start, size))
    pads = ctx.op("Concat", _as_1d(ctx, start), _as_1d(ctx, after), axis=0)
    return [ctx.op("Pad", ctx.op("Reshape", g, ctx.int64s([-1])), pads, mode="constant"), None]


def sequence_insert(ctx: RuleContext, grads: Grads) -> Result:
    """dx = reshape(g[span of the inserted element], shape(x)); ds = g without that span"""
    (g,) = grads
    seq, x = ctx.inputs[:2]
    count = ctx.op("SequenceLength", seq)
    if ctx.has_input(2):  # in [-n, n]: a negative position counts from the back of the input sequence
        position = dims.int64_scalar(ctx, ctx.inputs[2])
        index = ctx.where(
            ctx.compare("Less", position, dims.int64_scalar(ctx, 0)), ctx.op("Add", position, count), position
        )
    else:
        index = count
    start, size, total = _span(ctx, _sizes(ctx, ctx.outputs[0], ctx.elem_type(g)), index)
    end = ctx.op("Add", start, size)
    ds = dx = None
    if ctx.needs(0):
        ds = ctx.op(
            "Concat", _flat_slice(ctx, g, dims.int64_scalar(ctx, 0), start), _flat_slice(ctx, g, end, total), axis=0
        )
    if ctx.needs(1):
        dx = ctx.op("Reshape", _flat_slice(ctx, g, start, end), ctx.shape_of(x))
    return [ds, dx, None][: len(ctx.inputs)]


def sequence_erase(ctx: RuleContext, grads: Grads) -> Result:
    """ds = g with zeros inserted for the span of the erased element"""
    (g,) = grads
    seq = ctx.inputs[0]
    count = ctx.op("SequenceLength", seq)
    last = ctx.op("Sub", count, dims.int64_scalar(ctx, 1))
    index = _wrap(ctx, ctx.inputs[1], count) if ctx.has_input(1) else last
    start, size, total = _span(ctx, _sizes(ctx, seq, ctx.elem_type(g)), index)
    zeros = ctx.op("ConstantOfShape", _as_1d(ctx, size), value=dims.fill_value(ctx, g, 0))
    rest = ctx.op("Sub", total, size)
    ds = ctx.op(
        "Concat", _flat_slice(ctx, g, dims.int64_scalar(ctx, 0), start), zeros, _flat_slice(ctx, g, start, rest), axis=0
    )
    return [ds, None][: len(ctx.inputs)]


# ---------------------------------------------------------------- splitting and concatenating


def _layout(ctx: RuleContext, sizes: str, pre: str, length: str, post: str) -> str:
    """For a tensor ``[pre, length, post]`` concatenated along its middle axis from pieces of ``sizes``
    along it: the position of each element in the flat layout (int64, shape ``[pre, length, post]``).

    Element ``(p, k, q)`` of piece ``i`` (starting at ``o_i`` along the axis) is at
    ``pre * post * o_i + (p * s_i + k - o_i) * post + q``.
    """
    k = dims.int64_range(ctx, length)
    ends = ctx.op("CumSum", sizes, dims.int64_scalar(ctx, 0))
    piece = ctx.op(
        "ReduceSum",
        ctx.cast(ctx.op("GreaterOrEqual", ctx.op("Unsqueeze", k, ctx.int64s([1])), ends), _INT64),
        ctx.int64s([1]),
        keepdims=0,
    )
    start = ctx.op("Gather", ctx.op("Sub", ends, sizes), piece)  # [length]
    size = ctx.op("Gather", sizes, piece)
    base = ctx.op(
        "Add", ctx.op("Mul", start, ctx.op("Mul", pre, post)), ctx.op("Mul", ctx.op("Sub", k, start), post)
    )  # [length]
    p = ctx.op("Reshape", dims.int64_range(ctx, pre), ctx.int64s([-1, 1, 1]))
    q = ctx.op("Reshape", dims.int64_range(ctx, post), ctx.int64s([1, 1, -1]))
    stride = ctx.op("Reshape", ctx.op("Mul", size, post), ctx.int64s([1, -1, 1]))
    return ctx.op("Add", ctx.op("Add", ctx.op("Mul", p, stride), ctx.op("Reshape", base, ctx.int64s([1, -1, 1]))), q)


def split_to_sequence(ctx: RuleContext, grads: Grads) -> Result:
    """dx[.., k, ..] = g[flat position of element k of piece i]  (pieces of split along axis; default 1)"""
    (g,) = grads
    x = ctx.inputs[0]
    rank = ctx.known_rank(x)
    axis = int(ctx.attr("axis", 0)) % rank
    length = dims.dims_product(ctx, x, axis, axis + 1)
    split = ctx.inputs[1] if ctx.has_input(1) else None
    known = ctx.constant_value(split) if split else None
    if split is None:
        sizes = ctx.op("Expand", ctx.int64s([1]), _as_1d(ctx, length))
    elif (known is not None and known.ndim == 0) or (known is None and ctx.rank(split) == 0):
        chunk = dims.int64_scalar(ctx, split)  # chunks of `split`, the last one maybe shorter
        count = ctx.op("Div", ctx.op("Sub", ctx.op("Add", length, chunk), dims.int64_scalar(ctx, 1)), chunk)
        taken = ctx.op("Mul", dims.int64_range(ctx, count), chunk)
        sizes = ctx.op("Min", ctx.op("Expand", chunk, _as_1d(ctx, count)), ctx.op("Sub", length, taken))
    else:
        sizes = ctx.cast(split, _INT64)
    positions = _layout(
        ctx, sizes, dims.dims_product(ctx, x, 0, axis), length, dims.dims_product(ctx, x, axis + 1, rank)
    )
    dx = ctx.op("Reshape", ctx.op("Gather", g, ctx.op("Reshape", positions, ctx.int64s([-1]))), ctx.shape_of(x))
    return [dx, None][: len(ctx.inputs)]


def concat_from_sequence(ctx: RuleContext, grads: Grads) -> Result:
    """ds[flat position of element k of s_i] = g[.., k, ..]  (new_axis: each element one step along axis)"""
    (g,) = grads
    seq, y = ctx.inputs[0], ctx.outputs[0]
    rank = ctx.known_rank(y)
    axis = int(ctx.attr("axis")) % rank
    pre, post = dims.dims_product(ctx, y, 0, axis), dims.dims_product(ctx, y, axis + 1, rank)
    length = dims.dims_product(ctx, y, axis, axis + 1)
    if int(ctx.attr("new_axis", 0)):
        sizes = ctx.op("Expand", ctx.int64s([1]), _as_1d(ctx, length))
    else:
        sizes = ctx.op("Div", _sizes(ctx, seq, ctx.elem_type(g)), ctx.op("Mul", pre, post))
    positions = ctx.op("Reshape", _layout(ctx, sizes, pre, length, post), ctx.int64s([-1]))
    zeros = ctx.op("ConstantOfShape", _as_1d(ctx, dims.dims_product(ctx, y, 0, rank)), value=dims.fill_value(ctx, g, 0))
    flat = ctx.op("ScatterElements", zeros, positions, ctx.op("Reshape", g, ctx.int64s([-1])), axis=0)
    return [flat]


# ---------------------------------------------------------------- optionals


def optional(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g  (the gradient of an optional is that of its element)"""
    return [grads[0]][: len(ctx.inputs)]


@registry.rule("OptionalGetElement", inputs=(0,))
def optional_get_element(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g  (a tensor or sequence input passes through; an optional's gradient is that of its element)"""
    return [grads[0]]


registry.non_differentiable("SequenceEmpty", "SequenceLength", "OptionalHasElement")


def register_sequence_rules(target: GradientRegistry) -> GradientRegistry:
    """Register the differentiable sequence rules (and ``Optional``) on ``target``; return it."""
    target.rule("SequenceConstruct")(sequence_construct)
    target.rule("SequenceAt", inputs=(0,))(sequence_at)
    target.rule("SequenceInsert", inputs=(0, 1))(sequence_insert)
    target.rule("SequenceErase", inputs=(0,))(sequence_erase)
    target.rule("SplitToSequence", inputs=(0,))(split_to_sequence)
    target.rule("ConcatFromSequence", inputs=(0,))(concat_from_sequence)
    target.rule("Optional", inputs=(0,))(optional)
    return target


register_sequence_rules(registry)
