"""Gathering and scattering: Gather, GatherElements, GatherND, ScatterND, ScatterElements, TopK, Compress,
Unique and TensorScatter.

Notation: ``x`` is the data input, ``y`` the output and ``g`` its gradient.
Index inputs are integer tensors (int64, or int32 where ONNX allows it: Gather's, GatherElements' and
ScatterElements') and carry no gradient; Gather's are cast to int64 where the rule computes with them.

A gather's gradient is a scatter that *adds* (indices may repeat), and a
scatter's gradient gathers (see
:func:`~onnxtrain.autodiff.rules.backward_helpers.scatter_add_rows`).
``ScatterND``/``ScatterElements`` add only from opset 16 (``reduction="add"``),
and the gradients scatter with ``ScatterElements`` over rows, ScatterND's own
included, or element by element where GatherND's or ScatterND's index depth is
not known: onnxruntime's CPU threads lose the additions, products, maxima and
minima of ``ScatterND`` into a row that two of them share. No gradient
scatters with a reducing ``ScatterND``. Below
opset 16, the updates of each distinct index are added up first (sorted by
index with ``TopK``, a running ``CumSum`` in float64, and its differences at
the ends of the runs of equal indices: memory linear in the number of
indices), and the sums scattered without a reduction. Selections of distinct
positions (TopK, Compress, Unique) write ``g`` back with a plain scatter.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from onnxtrain.autodiff import dims
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.registry import Grads, Result
from onnxtrain.autodiff.rules._builtin import registry
from onnxtrain.autodiff.rules.backward_helpers import scatter_add_flat, scatter_add_rows, scatter_rows
from onnxtrain.graph import ops
from onnxtrain.graph.embeddings import embedding_rule

#: Only the data input (0) is differentiable.
_DATA = (0,)


def _wrap(ctx: RuleContext, indices: str, n: str) -> str:
    """Indices in ``[-n, n)`` mapped to ``[0, n)``, int64: ``Mod(Cast(indices, int64), n)`` (no ``Cast`` for int64
    indices, no ``Mod`` when they are known to be non-negative). Gather's int32 indices (TensorFlow's and Keras's
    exports) are cast once here: ``n`` and every scatter after it take int64."""
    value = ctx.constant_value(indices)
    indices = ctx.cast(indices, onnx.TensorProto.INT64)
    if value is not None and np.all(value >= 0):
        return indices
    return ctx.op("Mod", indices, n)


@registry.rule("Gather", inputs=_DATA)
def gather(ctx: RuleContext, grads: Grads) -> Result:
    """dx[.., j, ..] = sum of g[.., i, ..] over the indices i with idx[i] == j  (scatter-add along axis)

    A lookup with torch's ``nn.Embedding`` rules (:mod:`onnxtrain.graph.embeddings`) changes ``g`` before the
    scatter: ``g[i] /= count(idx == idx[i])`` with ``scale_grad_by_freq``, then ``g[i] = 0 where idx[i] == p``
    with ``padding_idx=p``."""
    (g,) = grads
    x, indices = ctx.inputs
    if int(ctx.attr("axis", 0)) == 0:  # no axis to move: x's rank may stay unknown
        n = dims.dim_tensor(ctx, x, 0)
        rows = _wrap(ctx, indices, n)
        rule = embedding_rule(ctx.node)
        if rule.scale_grad_by_freq:
            g = _by_frequency(ctx, g, rows, n, x)
        if rule.padding_idx is not None:
            g = _without_row(ctx, g, rows, rule.padding_idx, x)
        return [scatter_add_rows(ctx, rows, g, n, x), None]
    rank = ctx.known_rank(x)
    q = ctx.known_rank(indices)
    axis = int(ctx.attr("axis", 0)) % rank
    n = dims.dim_tensor(ctx, x, axis)
    rows = _wrap(ctx, indices, n)
    # g is x[:axis] + idx.shape + x[axis+1:]: bring the index axes to the front
    front = list(range(axis, axis + q)) + list(range(axis)) + list(range(axis + q, rank + q - 1))
    moved = ctx.op("Transpose", g, perm=front) if axis and q else g
    summed = scatter_add_rows(ctx, rows, moved, n, x)  # [n] + x[:axis] + x[axis+1:]
    back = [*range(1, axis + 1), 0, *range(axis + 1, rank)]
    return [ctx.op("Transpose", summed, perm=back) if axis else summed, None]


def _per_position(ctx: RuleContext, value: str, rows: str, x: str) -> str:
    """``value`` (of ``rows``' shape) with an axis of 1 for each of ``x.shape[1:]``, to broadcast over ``g``."""
    first = ctx.known_rank(rows)
    trailing = list(range(first, first + ctx.known_rank(x) - 1))
    return ops.unsqueeze(ctx.builder, value, trailing, hint="per_position") if trailing else value


def _without_row(ctx: RuleContext, g: str, rows: str, row: int, x: str) -> str:
    """``g`` (``rows.shape + x.shape[1:]``) with the positions whose row is ``row`` zeroed:
    ``Where(Unsqueeze(rows == row), 0, g)``."""
    return ctx.where(_per_position(ctx, ctx.compare("Equal", rows, row), rows, x), 0.0, g)


def _by_frequency(ctx: RuleContext, g: str, rows: str, n: str, x: str) -> str:
    """``g`` with each position's slice divided by the number of positions of its row:
    ``counts = scatter-add of ones over rows`` (float32, ``[n, 1]``), ``g / Unsqueeze(Gather(counts, rows))``."""
    float32 = onnx.TensorProto.FLOAT
    ones_shape = ctx.op("Concat", ctx.op("Shape", rows), ctx.int64s([1]), axis=0)
    ones = ctx.op("ConstantOfShape", ones_shape, value=onnx.helper.make_tensor("value", float32, [1], [1.0]))
    # n elements, as scatter_add_rows's sum has: what sizes its zeros (pruned where they are folded instead)
    per_row = ctx.op(
        "ConstantOfShape",
        ctx.op("Reshape", n, ctx.int64s([1])),
        value=onnx.helper.make_tensor("value", float32, [1], [0.0]),
    )
    counts = ctx.op("Reshape", scatter_add_rows(ctx, rows, ones, n, per_row), ctx.int64s([-1]))
    count = ctx.cast_like(ctx.op("Gather", counts, rows), g)
    return ctx.div(g, _per_position(ctx, count, rows, x))


@registry.rule("GatherElements", inputs=_DATA)
def gather_elements(ctx: RuleContext, grads: Grads) -> Result:
    """dx = ScatterElements(zeros(x), idx, g, axis, reduction=add)  (below opset 16: sums per flat position first)"""
    (g,) = grads
    x, indices = ctx.inputs
    rank = ctx.known_rank(x)
    axis = int(ctx.attr("axis", 0)) % rank
    if ops.scatter_can_add(ctx.opset):
        dx = ctx.op("ScatterElements", ctx.zeros_like(x, after=g), indices, g, axis=axis, reduction="add")
        return [dx, None]
    # no adding scatter: the flat position in x of each gathered element, then the sums per position
    sources = ctx.op("GatherElements", dims.flat_positions(ctx, x), indices, axis=axis)
    return [scatter_add_flat(ctx, sources, g, x), None]


def _strides(ctx: RuleContext, x: str, count: int) -> list[str]:
    """The row-major strides of the first ``count`` axes of ``x`` (within those axes), int64 scalars."""
    return [dims.dims_product(ctx, x, j + 1, count) for j in range(count)]


def _slice_positions(ctx: RuleContext, x: str, indices: str, batch: int, depth: int) -> str:
    """The flat position, within ``x``'s first ``batch + depth`` axes, of each slice that ``indices`` (GatherND's
    and ScatterND's, last axis of length ``depth``) selects: ``sum_j coord_j * stride_j``, negative
    coordinates wrapped; of shape ``indices.shape[:-1]``."""
    q = ctx.known_rank(indices)
    strides = _strides(ctx, x, batch + depth)
    terms = []
    for j in range(batch):
        coord = ctx.op(
            "Reshape", dims.int64_range(ctx, dims.dim_tensor(ctx, x, j)), ctx.int64s([1] * j + [-1] + [1] * (q - 2 - j))
        )
        terms.append(ctx.op("Mul", coord, strides[j]))
    for i in range(depth):
        j = batch + i
        coord = _wrap(ctx, ctx.op("Gather", indices, dims.int64_scalar(ctx, i), axis=-1), dims.dim_tensor(ctx, x, j))
        terms.append(ctx.op("Mul", coord, strides[j]))
    flat = terms[0]
    for term in terms[1:]:
        flat = ctx.op("Add", flat, term)
    return flat


def _index_depth(ctx: RuleContext, indices: str) -> int | None:
    """The last dimension of GatherND's or ScatterND's ``indices`` where it is known."""
    idx_dims = ctx.shape(indices)
    if idx_dims is None or not isinstance(idx_dims[-1], int):
        return None
    return int(idx_dims[-1])


@registry.rule("GatherND", inputs=_DATA)
def gather_nd(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g added into zeros(x) at idx, by rows of x  (batch_dims as leading index coordinates)

    Where the index depth (``indices``' last dimension) is unknown, each gathered element's flat position in
    ``x`` is gathered the same way from the positions themselves, ``GatherND(arange(size(x)), idx)``, and ``g``
    added at them element by element (an int64 tensor of ``x``'s size more; no ``ScatterND``, whose CPU
    threads lose additions into a shared row).
    """
    (g,) = grads
    x, indices = ctx.inputs
    batch = int(ctx.attr("batch_dims", 0))
    depth = _index_depth(ctx, indices)
    if depth is None:
        sources = ctx.op("GatherND", dims.flat_positions(ctx, x), indices, batch_dims=batch)
        return [scatter_add_flat(ctx, sources, g, x), None]
    count = batch + depth
    flat = _slice_positions(ctx, x, indices, batch, depth)
    summed = scatter_add_rows(ctx, flat, g, dims.dims_product(ctx, x, 0, count), x)
    return [ctx.op("Reshape", summed, ctx.shape_of(x)), None]


def _check_reduction(ctx: RuleContext) -> str:
    reduction = ctx.attr("reduction", "none")
    if reduction not in ("none", "add", "mul", "max", "min"):
        raise ValueError(
            f"{ctx.node.op_type} node {ctx.node.name!r} has reduction={reduction!r}; onnx defines 'none', 'add', "
            "'mul', 'max' and 'min': fix the model's attribute"
        )
    return reduction


#: ``scatter(data, updates, reduction)`` and ``gather(t)`` at the node's indices (ScatterND or ScatterElements).
Scatter = Callable[[str, str, str], str]
Gather = Callable[[str], str]


def _scatter_grads(ctx: RuleContext, g: str, scatter: Scatter, gather: Gather) -> Result:
    """``[ddata, None, dupdates]`` of ``y = scatter(data, updates, reduction)`` (see :func:`scatter_nd`)."""
    data, _, updates = ctx.inputs
    reduction = _check_reduction(ctx)
    ddata = dupd = None
    if reduction in ("none", "add"):
        if ctx.needs(0):
            ddata = g if reduction == "add" else scatter(g, ctx.zeros_like(updates), "none")
        if ctx.needs(2):
            dupd = gather(g)
    elif reduction == "mul":  # y = data * prod(u), each product kept apart from the zero updates
        is_zero = ctx.compare("Equal", updates, 0.0)
        ones = ctx.expand_to(ctx.const(1.0, data), data)
        if ctx.needs(0):
            ddata = ctx.mul(g, scatter(ones, updates, "mul"))
        if ctx.needs(2):
            zeros = gather(scatter(ctx.zeros_like(data), ctx.cast_like(is_zero, updates), "add"))
            nonzero = gather(scatter(ones, ctx.where(is_zero, 1.0, updates), "mul"))
            others = ctx.where(
                is_zero,
                ctx.where(ctx.compare("Equal", zeros, 1.0), nonzero, 0.0),
                ctx.where(ctx.compare("Equal", zeros, 0.0), ctx.div(nonzero, ctx.where(is_zero, 1.0, updates)), 0.0),
            )
            dupd = ctx.mul(gather(ctx.mul(g, data)), others)
    else:  # max, min: the winners share g equally (torch's scatter_reduce amax/amin)
        y = ctx.outputs[0]
        data_wins = ctx.compare("Equal", data, y)
        update_wins = ctx.compare("Equal", updates, gather(y))
        count = scatter(ctx.cast_like(data_wins, data), ctx.cast_like(update_wins, updates), "add")
        share = ctx.div(g, count)
        if ctx.needs(0):
            ddata = ctx.where(data_wins, share, 0.0)
        if ctx.needs(2):
            dupd = ctx.where(update_wins, gather(share), 0.0)
    return [ddata, None, dupd]


@registry.rule("ScatterND", inputs=(0, 2))
def scatter_nd(ctx: RuleContext, grads: Grads) -> Result:
    """none: ddata = g masked, du = GatherND(g); add: g, GatherND(g); mul: g P, GatherND(g x) P/u; max/min: g to winners

    "g masked": g with the written slices zeroed. P is the product of the updates at a position
    (P / u: the product of the others, zeros counted apart, so a zero update divides nothing).
    max/min: the winners of a position are data and the updates equal to y there; they share g
    equally, as torch's ``scatter_reduce`` with amax/amin does (onnxruntime keeps the tied value,
    whichever won).
    """
    (g,) = grads
    indices = ctx.inputs[1]
    depth = _index_depth(ctx, indices)
    if depth is None:  # element by element, at the flat positions the indices select (see gather_nd)
        data = ctx.inputs[0]
        flat = ctx.op("Reshape", ctx.op("GatherND", dims.flat_positions(ctx, data), indices), ctx.int64s([-1]))

        def scatter(data: str, updates: str, reduction: str) -> str:
            extra = {} if reduction == "none" else {"reduction": reduction}
            column = ctx.int64s([-1])
            scattered = ctx.op(
                "ScatterElements", ctx.op("Reshape", data, column), flat, ctx.op("Reshape", updates, column),
                axis=0, **extra,
            )  # fmt: skip
            return ctx.op("Reshape", scattered, ctx.shape_of(data))

    else:
        rows = _slice_positions(ctx, ctx.inputs[0], indices, 0, depth)
        lead = ctx.known_rank(indices) - 1

        def scatter(data: str, updates: str, reduction: str) -> str:
            return _scatter_slices(ctx, data, rows, depth, lead, updates, reduction)

    return _scatter_grads(ctx, g, scatter, lambda t: ctx.op("GatherND", t, indices))


def _scatter_slices(ctx: RuleContext, data: str, rows: str, depth: int, lead: int, updates: str, reduction: str) -> str:
    """``ScatterND(data, indices, updates, reduction)`` as ``ScatterElements`` along the rows of ``data`` as
    ``[n, S]`` (``Flatten`` at ``depth``), ``updates`` as ``[M, S]`` (``Flatten`` at ``lead``, the rank of
    ``rows``) and each slice's flat position ``rows`` repeated over its ``S`` elements (:func:`scatter_rows`:
    onnxruntime's CPU ``ScatterND`` loses the sums, products, maxima and minima two threads write into one
    slice); reshaped back."""
    scattered = scatter_rows(
        ctx, ctx.op("Flatten", data, axis=depth), rows, ctx.op("Flatten", updates, axis=lead), reduction
    )
    return ctx.op("Reshape", scattered, ctx.shape_of(data))


@registry.rule("ScatterElements", inputs=(0, 2))
def scatter_elements(ctx: RuleContext, grads: Grads) -> Result:
    """As ScatterND with GatherElements: mul: ddata = g P, du = GatherElements(g x) P/u; max/min: g to winners

    none: ddata = g with the written elements zeroed, du = GatherElements(g, idx); add: ddata = g. P is the
    product of the updates at an element; max/min: the winners (data and the updates equal to y there)
    share g equally, as in torch's ``scatter_reduce`` with amax/amin.
    """
    (g,) = grads
    indices = ctx.inputs[1]
    axis = int(ctx.attr("axis", 0))

    def scatter(data: str, updates: str, reduction: str) -> str:
        extra = {} if reduction == "none" else {"reduction": reduction}
        return ctx.op("ScatterElements", data, indices, updates, axis=axis, **extra)

    return _scatter_grads(ctx, g, scatter, lambda t: ctx.op("GatherElements", t, indices, axis=axis))


@registry.rule("TopK", inputs=_DATA)
def top_k(ctx: RuleContext, grads: Grads) -> Result:
    """dx = ScatterElements(zeros(x), indices, g_values, axis)  (the k indices are distinct)"""
    g = grads[0]
    if g is None:
        return [None, None]
    x = ctx.inputs[0]
    dx = ctx.op("ScatterElements", ctx.zeros_like(x, after=g), ctx.outputs[1], g, axis=int(ctx.attr("axis", -1)))
    return [dx, None]


# ------------------------------------------------------------ selecting


def _scatter_selected(ctx: RuleContext, g: str, x: str, indices: str, axis: int | None) -> str:
    """dx for ``y = Gather(x, indices, axis)`` with distinct 1-D ``indices`` (``x`` flattened when ``axis`` is None)."""
    if axis is None:
        flat_g = ctx.op("Reshape", g, ctx.int64s([-1]))
        flat = ctx.op("ScatterElements", ctx.flat_zeros_like(x, after=g), indices, flat_g, axis=0)
        return ctx.op("Reshape", flat, ctx.shape_of(x))
    rank = ctx.known_rank(x)
    axis %= rank
    along = ctx.op("Reshape", indices, ctx.int64s([1] * axis + [-1] + [1] * (rank - axis - 1)))
    spread = ctx.op("Expand", along, ctx.shape_of(g))
    return ctx.op("ScatterElements", ctx.zeros_like(x, after=g), spread, g, axis=axis)


@registry.rule("Compress", inputs=_DATA)
def compress(ctx: RuleContext, grads: Grads) -> Result:
    """dx = zeros(x) with g written back at the selected positions NonZero(condition) (along axis, or flat)"""
    x, condition = ctx.inputs
    known = ctx.constant_value(condition)
    if known is not None:
        indices = ctx.int64s(np.flatnonzero(known).tolist())
    else:
        indices = ctx.op("Reshape", ctx.op("NonZero", condition), ctx.int64s([-1]))
    axis = ctx.attr("axis")
    return [_scatter_selected(ctx, grads[0], x, indices, None if axis is None else int(axis)), None]


@registry.rule("Unique", inputs=_DATA)
def unique(ctx: RuleContext, grads: Grads) -> Result:
    """Y = Gather(x, indices, axis) (x flattened without axis): dx = g written back at the first occurrences"""
    g = grads[0]
    if g is None:  # only the integer outputs are used
        return [None]
    axis = ctx.attr("axis")
    indices = ctx.ensure_output(1, "unique_indices")
    return [_scatter_selected(ctx, g, ctx.inputs[0], indices, None if axis is None else int(axis))]


@registry.rule("TensorScatter", opsets=(24, None), inputs=(0, 1))
def tensor_scatter(ctx: RuleContext, grads: Grads) -> Result:
    """dpast = g with the written entries zeroed; dupdate[.., j, ..] = g[.., w[b] + j (mod max_len if circular), ..]"""
    (g,) = grads
    past, update = ctx.inputs[:2]
    indices = ctx.inputs[2:3] if ctx.has_input(2) else []
    mode = ctx.attr("mode", "linear")
    given_axis = int(ctx.attr("axis", -2))
    dpast = dupdate = None
    if ctx.needs(0):
        dpast = ctx.op("TensorScatter", g, ctx.zeros_like(update), *indices, axis=given_axis, mode=mode)
    if ctx.needs(1):
        rank = ctx.known_rank(update)
        axis = given_axis % rank
        steps = dims.int64_range(ctx, dims.dim_tensor(ctx, update, axis))
        tail = [1] * (rank - axis - 1)
        if indices:  # [batch, steps]: 0 keeps the batch size, -1 takes the steps
            positions = ctx.op("Add", ctx.op("Unsqueeze", indices[0], ctx.int64s([1])), steps)
            if mode == "circular":
                positions = ctx.op("Mod", positions, dims.dim_tensor(ctx, past, axis))
            positions = ctx.op("Reshape", positions, ctx.int64s([0] + [1] * (axis - 1) + [-1] + tail))
        else:
            positions = ctx.op("Reshape", steps, ctx.int64s([1] * axis + [-1] + tail))
        spread = ctx.op("Expand", positions, ctx.shape_of(update))
        dupdate = ctx.op("GatherElements", g, spread, axis=axis)
    return [dpast, dupdate, None][: len(ctx.inputs)]
