"""Shape and data-movement operators: reshapes, slicing, gathering, scattering, padding, resizing.

Notation: ``x`` is the data input, ``y`` the output and ``g`` its gradient.
Index, shape, axes and size inputs are integer tensors and carry no gradient.

Most rules are the transpose of a data movement: a reshape goes back with
``Reshape``, a permutation with the inverse permutation, a gather with a
scatter that *adds* (indices may repeat). ``ScatterND``/``ScatterElements``
add only from opset 16 (``reduction="add"``); below that, the updates of
each distinct index are added up first (sorted by index with ``TopK``, a
running ``CumSum`` in float64, and its differences at the ends of the runs of
equal indices: memory linear in the number of indices), and the sums
scattered without a reduction.

Where a movement is easiest to describe by where each output element comes
from (``Slice`` with any steps, ``Pad`` in edge/reflect/wrap mode), the rule
applies the very same operator to the *flat positions* of ``x``
(``Reshape(Range(0, size(x)), shape(x))``) and scatters ``g`` back to them.

Resize in nearest and linear mode is separable: along each resized axis
``a``, ``y = W_a x`` for an (out x in) interpolation matrix ``W_a``. The rule
rebuilds each ``W_a`` from the coordinate transformation, in float32 and in
the order of operations onnxruntime uses (so that nearest-neighbour choices
agree), and returns ``dx = W_a^T g`` along every such axis in one ``Einsum``. In cubic mode each row of
``W_a`` holds Keys' four weights (``cubic_coeff_a``) at the taps around the source coordinate, clamped to
the edges or, with ``exclude_outside``, dropped and the rest renormalized. Antialiasing and
``keep_aspect_ratio_policy`` other than ``stretch`` are refused with an error.

DFT and STFT are linear, ``y = W x``: the gradient is the adjoint ``W^H g``,
itself a DFT (``L`` times the inverse DFT of ``g``, or the forward DFT over
``L`` for an inverse transform), with a one-sided ``g`` zero-padded to all
``L`` bins first and ``x``'s cut or padding to ``dft_length`` undone after.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx

from onnxtrain.autodiff import sized
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.rules._builtin import REGISTRY as registry

Grads = Sequence["str | None"]
Result = list["str | None"]

#: Only the data input (0) is differentiable.
_DATA = (0,)

#: The opset from which ScatterND and ScatterElements take ``reduction="add"``.
_SCATTER_ADD_SINCE = 16


def _data(ctx: RuleContext, dx: str | None) -> Result:
    """``dx`` for the data input, nothing for the others."""
    return [dx] + [None] * (len(ctx.inputs) - 1)


def _i64(ctx: RuleContext, value: Any) -> str:
    """An int64 constant (a scalar for a scalar ``value``)."""
    return ctx.const(np.asarray(value, dtype=np.int64), ctx.int64s([0]))


def _dim(ctx: RuleContext, x: str, axis: int) -> str:
    """Dimension ``axis`` of ``x`` as an int64 scalar (a constant when known)."""
    dims = ctx.shape(x)
    if dims is not None and isinstance(dims[axis], int):
        return _i64(ctx, dims[axis])
    return ctx.op("Gather", ctx.op("Shape", x), _i64(ctx, axis))


def _numel(ctx: RuleContext, x: str) -> str:
    """The number of elements of ``x`` as an int64 scalar."""
    static = ctx.static_shape(x)
    if static is not None:
        return _i64(ctx, int(np.prod(static, dtype=np.int64)))
    return ctx.op("Size", x)


def _range(ctx: RuleContext, n: str) -> str:
    """``[0, 1, ..., n - 1]`` (int64)."""
    return ctx.op("Range", _i64(ctx, 0), n, _i64(ctx, 1))


def _positions(ctx: RuleContext, x: str) -> str:
    """The flat position of each element of ``x``, shaped like ``x`` (int64)."""
    return ctx.op("Reshape", _range(ctx, _numel(ctx, x)), ctx.shape_of(x))


def _one_hot(ctx: RuleContext, indices: str, n: str, like: str) -> str:
    """``indices.shape + [n]``: 1 where the last index equals ``indices`` (in ``[0, n)``), else 0."""
    hit = ctx.op("Equal", ctx.op("Unsqueeze", indices, ctx.int64s([-1])), _range(ctx, n))
    return ctx.cast_like(hit, like)


def _wrap(ctx: RuleContext, indices: str, n: str) -> str:
    """Indices in ``[-n, n)`` mapped to ``[0, n)`` (no node when they are known to be non-negative)."""
    value = ctx.constant_value(indices)
    if value is not None and np.all(value >= 0):
        return indices
    return ctx.op("Mod", indices, n)


def _letters(n: int, skip: str = "") -> list[str]:
    return [c for c in "abcdefghijklmnopqrstuvwxyz" if c not in skip][:n]


def _sums_by_key(ctx: RuleContext, keys: str, values: str) -> tuple[str, str]:
    """``(distinct, sums)``: the distinct values of the 1-D int64 ``keys`` (``Unique``, sorted), and for each the
    sum of the rows of ``values`` (``[len(keys), ...]``) whose key it is.

    The rows sorted by key (``TopK``), their running sums (``CumSum``, inclusive and exclusive, in float64 so
    that the differences keep their precision), and for each run of equal keys the inclusive sum at its last
    row minus the exclusive sum at its first (``CumSum(counts)``): memory linear in ``values``, time
    ``T log T`` for ``T`` keys.
    """
    distinct, _, _, counts = ctx.op_n("Unique", 4, keys, sorted=1)
    count = ctx.op("Reshape", ctx.op("Size", keys), ctx.int64s([1]))
    _, order = ctx.op_n("TopK", 2, keys, count, axis=0, largest=0, sorted=1)
    ordered = ctx.cast(ctx.op("Gather", values, order, axis=0), onnx.TensorProto.DOUBLE)
    zero = _i64(ctx, 0)
    through = ctx.op(
        "Gather", ctx.op("CumSum", ordered, zero), ctx.op("Sub", ctx.op("CumSum", counts, zero), _i64(ctx, 1))
    )
    before = ctx.op("Gather", ctx.op("CumSum", ordered, zero, exclusive=1), ctx.op("CumSum", counts, zero, exclusive=1))
    return distinct, ctx.cast_like(ctx.op("Sub", through, before), values)


def scatter_add_flat(ctx: RuleContext, positions: str, updates: str, like: str) -> str:
    """``dx`` shaped like ``like`` with ``dx.flat[k] = sum(updates.flat[j] for positions.flat[j] == k)``."""
    flat_pos = ctx.op("Reshape", positions, ctx.int64s([-1]))
    flat_upd = ctx.op("Reshape", updates, ctx.int64s([-1]))
    if ctx.onnx_opset >= _SCATTER_ADD_SINCE:
        flat = ctx.op("ScatterElements", ctx.flat_zeros_like(like), flat_pos, flat_upd, axis=0, reduction="add")
    else:  # no adding scatter: add up per position first, then scatter the sums, each to a position of its own
        distinct, sums = _sums_by_key(ctx, flat_pos, flat_upd)
        flat = ctx.op("ScatterElements", ctx.flat_zeros_like(like), distinct, sums, axis=0)
    return ctx.op("Reshape", flat, ctx.shape_of(like))


def scatter_add_rows(ctx: RuleContext, rows: str, updates: str, n_rows: str, like: str) -> str:
    """``D[r, ...] = sum(updates[s, ...] for rows[s] == r)``, of shape ``[n_rows] + updates.shape[q:]``.

    ``rows`` (values in ``[0, n_rows)``, rank ``q``) indexes the leading ``q`` axes of ``updates``;
    ``like`` has as many elements as ``D``.
    """
    q = ctx.known_rank(rows)
    static = ctx.static_shape(updates)

    def rest() -> str:
        """``updates.shape[q:]``, 1-D."""
        if static is not None:
            return ctx.int64s(list(static[q:]))
        return ctx.op("Slice", ctx.op("Shape", updates), ctx.int64s([q]), ctx.int64s([1 << 62]))

    n_static = ctx.constant_value(n_rows)
    if static is not None and n_static is not None:
        shape = ctx.int64s([int(n_static), *static[q:]])
    else:
        shape = ctx.op("Concat", ctx.op("Reshape", n_rows, ctx.int64s([1])), rest(), axis=0)
    zeros = ctx.zeros_shaped(shape, updates, like)
    if ctx.onnx_opset >= _SCATTER_ADD_SINCE:
        return ctx.op("ScatterND", zeros, ctx.op("Unsqueeze", rows, ctx.int64s([-1])), updates, reduction="add")
    # no adding scatter: add up the updates of each distinct row first, then scatter the sums, one per row
    flat_rows = ctx.op("Reshape", rows, ctx.int64s([-1]))
    flat_updates = ctx.op("Reshape", updates, ctx.op("Concat", ctx.int64s([-1]), rest(), axis=0))
    distinct, sums = _sums_by_key(ctx, flat_rows, flat_updates)
    return ctx.op("ScatterND", zeros, ctx.op("Unsqueeze", distinct, ctx.int64s([-1])), sums)


def _inverse(perm: Sequence[int]) -> list[int]:
    inverse = [0] * len(perm)
    for k, p in enumerate(perm):
        inverse[p] = k
    return inverse


# ------------------------------------------------------------ reshapes


def _reshape_back(ctx: RuleContext, grads: Grads) -> Result:
    """dx = reshape(g, shape(x))"""
    return _data(ctx, ctx.op("Reshape", grads[0], ctx.shape_of(ctx.inputs[0])))


for _op in ("Reshape", "Squeeze", "Unsqueeze", "Flatten"):
    registry.rule(_op, inputs=_DATA)(_reshape_back)


@registry.rule("Transpose", inputs=_DATA)
def transpose(ctx: RuleContext, grads: Grads) -> Result:
    """dx = transpose(g, inverse(perm))"""
    perm = ctx.attr("perm")
    if perm is None:  # the default reverses the axes, its own inverse
        return [ctx.op("Transpose", grads[0])]
    return [ctx.op("Transpose", grads[0], perm=_inverse([int(p) for p in perm]))]


@registry.rule("DepthToSpace", inputs=_DATA)
def depth_to_space(ctx: RuleContext, grads: Grads) -> Result:
    """DCR: dx = SpaceToDepth(g); CRD: the same with channels regrouped from (block, c) to (c, block)"""
    bs = int(ctx.attr("blocksize"))
    dx = ctx.op("SpaceToDepth", grads[0], blocksize=bs)
    if ctx.attr("mode", "DCR") == "CRD":
        x_shape = ctx.shape_of(ctx.inputs[0])
        static = ctx.static_shape(ctx.inputs[0])
        if static is not None:
            n, c, h, w = static
            grouped_shape = ctx.int64s([n, bs * bs, c // (bs * bs), h, w])
        else:
            dx_shape = ctx.op("Shape", dx)
            grouped_shape = ctx.op(
                "Concat",
                ctx.op("Slice", dx_shape, ctx.int64s([0]), ctx.int64s([1])),
                ctx.int64s([bs * bs, -1]),
                ctx.op("Slice", dx_shape, ctx.int64s([2]), ctx.int64s([4])),
                axis=0,
            )
        grouped = ctx.op("Reshape", dx, grouped_shape)
        swapped = ctx.op("Transpose", grouped, perm=[0, 2, 1, 3, 4])
        dx = ctx.op("Reshape", swapped, x_shape)
    return [dx]


@registry.rule("SpaceToDepth", inputs=_DATA)
def space_to_depth(ctx: RuleContext, grads: Grads) -> Result:
    """dx = DepthToSpace(g, mode=DCR)"""
    return [ctx.op("DepthToSpace", grads[0], blocksize=int(ctx.attr("blocksize")), mode="DCR")]


# ------------------------------------------------------------ joining and splitting


@registry.rule("Split", inputs=_DATA)
def split(ctx: RuleContext, grads: Grads) -> Result:
    """dx = concat(g_1, ..., g_n, axis)  (zeros for outputs without a gradient)"""
    parts = [g if g is not None else ctx.zeros_like(y) for g, y in zip(grads, ctx.outputs, strict=True)]
    return [ctx.op("Concat", *parts, axis=ctx.attr("axis", 0))] + [None] * (len(ctx.inputs) - 1)


@registry.rule("Concat")
def concat(ctx: RuleContext, grads: Grads) -> Result:
    """dx_i = split(g, [size_i along axis])_i"""
    (g,) = grads
    axis = int(ctx.attr("axis"))
    if len(ctx.inputs) == 1:
        return [g]
    sizes: list[str] = []
    static: list[int] = []
    for x in ctx.inputs:
        dims = ctx.shape(x)
        if dims is not None and isinstance(dims[axis], int):
            static.append(int(dims[axis]))  # type: ignore[arg-type]
            sizes.append(ctx.int64s([dims[axis]]))  # type: ignore[list-item]
        else:
            sizes.append(ctx.op("Gather", ctx.op("Shape", x), ctx.int64s([axis])))
    split_sizes = ctx.int64s(static) if len(static) == len(sizes) else ctx.op("Concat", *sizes, axis=0)
    return list(ctx.op_n("Split", len(ctx.inputs), g, split_sizes, axis=axis))


# ------------------------------------------------------------ slicing and padding


def _slice_as_pad(ctx: RuleContext, g: str) -> str | None:
    """dx of a unit-step Slice with constant parameters and known sliced dims: ``Pad`` with zeros."""
    x = ctx.inputs[0]
    values = [ctx.constant_value(ctx.inputs[k]) if ctx.has_input(k) else None for k in range(1, 5)]
    starts, ends, axes, steps = values
    if starts is None or ends is None or (ctx.has_input(3) and axes is None) or (ctx.has_input(4) and steps is None):
        return None
    dims = ctx.shape(x)
    if dims is None:
        return None
    rank = len(dims)
    axes_list = [int(a) % rank for a in (axes if axes is not None else range(len(starts)))]
    steps_list = [int(s) for s in steps] if steps is not None else [1] * len(axes_list)
    if any(s != 1 for s in steps_list):
        return None
    pads = [0] * (2 * rank)
    for a, start, end in zip(axes_list, starts, ends, strict=True):
        dim = dims[a]
        if not isinstance(dim, int):
            return None
        lo, hi, _ = slice(int(start), int(end), 1).indices(dim)
        length = max(0, hi - lo)
        pads[a] = lo
        pads[rank + a] = dim - lo - length
    return ctx.op("Pad", g, ctx.int64s(pads), mode="constant")


@registry.rule("Slice", inputs=_DATA)
def slice_(ctx: RuleContext, grads: Grads) -> Result:
    """dx = zeros(x) with g written where the slice read (Pad for unit steps, else ScatterElements)"""
    (g,) = grads
    dx = _slice_as_pad(ctx, g)
    if dx is None:
        x = ctx.inputs[0]
        read = ctx.op("Slice", _positions(ctx, x), *ctx.inputs[1:])
        zeros = ctx.flat_zeros_like(x)
        flat = ctx.op(
            "ScatterElements",
            zeros,
            ctx.op("Reshape", read, ctx.int64s([-1])),
            ctx.op("Reshape", g, ctx.int64s([-1])),
            axis=0,
        )
        dx = ctx.op("Reshape", flat, ctx.shape_of(x))
    return _data(ctx, dx)


@registry.rule("Pad", inputs=(0, 2))
def pad(ctx: RuleContext, grads: Grads) -> Result:
    """constant: dx = Pad(g, -pads) (a crop), dc = sum(g) - sum(dx); edge/reflect/wrap: g added back to its sources"""
    (g,) = grads
    x = ctx.inputs[0]
    mode = ctx.attr("mode", "constant")
    axes = [ctx.inputs[3]] if ctx.has_input(3) else []
    dx = dc = None
    if mode == "constant":
        pads = ctx.constant_value(ctx.inputs[1])
        negated = ctx.int64s([-int(p) for p in pads]) if pads is not None else ctx.op("Neg", ctx.inputs[1])
        dx = ctx.op("Pad", g, negated, *(["", *axes] if axes else []), mode="constant")
        if ctx.has_input(2) and ctx.needs(2):
            c = ctx.inputs[2]
            total = ctx.op("ReduceSum", g, keepdims=0)
            inside = ctx.op("ReduceSum", dx, keepdims=0)
            dc = ctx.op("Reshape", ctx.sub(total, inside), ctx.shape_of(c))
    else:
        sources = ctx.op("Pad", _positions(ctx, x), ctx.inputs[1], *(["", *axes] if axes else []), mode=mode)
        dx = scatter_add_flat(ctx, sources, g, x)
    return [dx, None, dc, None][: len(ctx.inputs)]


# ------------------------------------------------------------ broadcasting and tiling


@registry.rule("Expand", inputs=_DATA, broadcasting=True)
def expand(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g summed over the broadcast axes (by the engine)"""
    return [grads[0], None]


@registry.rule("Tile", inputs=_DATA)
def tile(ctx: RuleContext, grads: Grads) -> Result:
    """dx = sum over the copies: reshape g to [r_0, d_0, r_1, d_1, ...], ReduceSum over the r axes"""
    (g,) = grads
    x, repeats = ctx.inputs
    rank = ctx.known_rank(x)
    if rank == 0:
        return [g, None]
    reps = ctx.constant_value(repeats)
    static = ctx.static_shape(x)
    if reps is not None and static is not None:
        shape = ctx.int64s([v for r, d in zip(reps.tolist(), static, strict=True) for v in (r, d)])
    else:
        pairs = ctx.op(
            "Concat",
            ctx.op("Unsqueeze", repeats, ctx.int64s([1])),
            ctx.op("Unsqueeze", ctx.shape_of(x), ctx.int64s([1])),
            axis=1,
        )
        shape = ctx.op("Reshape", pairs, ctx.int64s([-1]))
    split = ctx.op("Reshape", g, shape)
    return [ctx.op("ReduceSum", split, ctx.int64s(range(0, 2 * rank, 2)), keepdims=0), None]


# ------------------------------------------------------------ gathering and scattering


@registry.rule("Gather", inputs=_DATA)
def gather(ctx: RuleContext, grads: Grads) -> Result:
    """dx[.., j, ..] = sum of g[.., i, ..] over the indices i with idx[i] == j  (scatter-add along axis)"""
    (g,) = grads
    x, indices = ctx.inputs
    if int(ctx.attr("axis", 0)) == 0:  # no axis to move: x's rank may stay unknown
        n = _dim(ctx, x, 0)
        return [scatter_add_rows(ctx, _wrap(ctx, indices, n), g, n, x), None]
    rank = ctx.known_rank(x)
    q = ctx.known_rank(indices)
    axis = int(ctx.attr("axis", 0)) % rank
    n = _dim(ctx, x, axis)
    rows = _wrap(ctx, indices, n)
    # g is x[:axis] + idx.shape + x[axis+1:]: bring the index axes to the front
    front = list(range(axis, axis + q)) + list(range(axis)) + list(range(axis + q, rank + q - 1))
    moved = ctx.op("Transpose", g, perm=front) if axis and q else g
    summed = scatter_add_rows(ctx, rows, moved, n, x)  # [n] + x[:axis] + x[axis+1:]
    back = [*range(1, axis + 1), 0, *range(axis + 1, rank)]
    return [ctx.op("Transpose", summed, perm=back) if axis else summed, None]


@registry.rule("GatherElements", inputs=_DATA)
def gather_elements(ctx: RuleContext, grads: Grads) -> Result:
    """dx = ScatterElements(zeros(x), idx, g, axis, reduction=add)  (below opset 16: sums per flat position first)"""
    (g,) = grads
    x, indices = ctx.inputs
    rank = ctx.known_rank(x)
    axis = int(ctx.attr("axis", 0)) % rank
    if ctx.opset >= _SCATTER_ADD_SINCE:
        dx = ctx.op("ScatterElements", ctx.zeros_like(x), indices, g, axis=axis, reduction="add")
        return [dx, None]
    # no adding scatter: the flat position in x of each gathered element, then the sums per position
    sources = ctx.op("GatherElements", _positions(ctx, x), indices, axis=axis)
    return [scatter_add_flat(ctx, sources, g, x), None]


def _strides(ctx: RuleContext, x: str, count: int) -> list[str]:
    """The row-major strides of the first ``count`` axes of ``x`` (within those axes), int64 scalars."""
    static = ctx.shape(x)
    result = []
    for j in range(count):
        tail = static[j + 1 : count] if static is not None else None
        if tail is not None and all(isinstance(d, int) for d in tail):
            result.append(_i64(ctx, int(np.prod(tail, dtype=np.int64))))
        else:
            dims = ctx.op("Slice", ctx.op("Shape", x), ctx.int64s([j + 1]), ctx.int64s([count]))
            result.append(ctx.op("ReduceProd", dims, keepdims=0))
    return result


@registry.rule("GatherND", inputs=_DATA)
def gather_nd(ctx: RuleContext, grads: Grads) -> Result:
    """dx = ScatterND(zeros(x), idx, g, reduction=add)  (batch_dims as leading index coordinates)"""
    (g,) = grads
    x, indices = ctx.inputs
    batch = int(ctx.attr("batch_dims", 0))
    if batch == 0 and ctx.opset >= _SCATTER_ADD_SINCE:
        return [ctx.op("ScatterND", ctx.zeros_like(x), indices, g, reduction="add"), None]
    idx_dims = ctx.shape(indices)
    if idx_dims is None or not isinstance(idx_dims[-1], int):
        raise ValueError(
            f"the gradient of GatherND node {ctx.node.name!r} needs the last dimension of its indices "
            f"{indices!r} (the index depth), which is unknown; give the indices a known last dimension"
        )
    depth = int(idx_dims[-1])
    q = len(idx_dims)
    count = batch + depth
    strides = _strides(ctx, x, count)
    # the flat position, within x's first batch + depth axes, of each gathered slice
    terms = []
    for j in range(batch):
        coord = ctx.op("Reshape", _range(ctx, _dim(ctx, x, j)), ctx.int64s([1] * j + [-1] + [1] * (q - 2 - j)))
        terms.append(ctx.op("Mul", coord, strides[j]))
    for i in range(depth):
        j = batch + i
        coord = _wrap(ctx, ctx.op("Gather", indices, _i64(ctx, i), axis=-1), _dim(ctx, x, j))
        terms.append(ctx.op("Mul", coord, strides[j]))
    flat = terms[0]
    for term in terms[1:]:
        flat = ctx.op("Add", flat, term)
    n_rows = ctx.op("Mul", _dim(ctx, x, 0), strides[0])
    summed = scatter_add_rows(ctx, flat, g, n_rows, x)
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

    def scatter(data: str, updates: str, reduction: str) -> str:
        extra = {} if reduction == "none" else {"reduction": reduction}
        return ctx.op("ScatterND", data, indices, updates, **extra)

    return _scatter_grads(ctx, g, scatter, lambda t: ctx.op("GatherND", t, indices))


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
    dx = ctx.op("ScatterElements", ctx.zeros_like(x), ctx.outputs[1], g, axis=int(ctx.attr("axis", -1)))
    return [dx, None]


# ------------------------------------------------------------ triangles and running sums


@registry.rule("Trilu", inputs=_DATA)
def trilu(ctx: RuleContext, grads: Grads) -> Result:
    """dx = trilu(g, k, upper)"""
    k = ctx.inputs[1:2] if ctx.has_input(1) else []
    return _data(ctx, ctx.op("Trilu", grads[0], *k, upper=int(ctx.attr("upper", 1))))


@registry.rule("CumSum", inputs=_DATA)
def cum_sum(ctx: RuleContext, grads: Grads) -> Result:
    """dx = cumsum(g, axis, exclusive, reverse = not reverse)"""
    dx = ctx.op(
        "CumSum",
        grads[0],
        ctx.inputs[1],
        exclusive=int(ctx.attr("exclusive", 0)),
        reverse=1 - int(ctx.attr("reverse", 0)),
    )
    return [dx, None]


# ------------------------------------------------------------ constants


@registry.rule("Constant", inputs=())
def constant(ctx: RuleContext, grads: Grads) -> Result:
    """no inputs: nothing to differentiate"""
    return []


@registry.rule("ConstantOfShape", inputs=())
def constant_of_shape(ctx: RuleContext, grads: Grads) -> Result:
    """the only input is an integer shape: no gradient"""
    return [None]


# ------------------------------------------------------------ resizing


def _resize_axes(ctx: RuleContext, rank: int) -> list[tuple[int, int]]:
    """``(axis, k)`` for each axis Resize may change, ``k`` its position in scales/sizes/roi."""
    given = ctx.attr("axes")
    axes = [int(a) % rank for a in given] if given is not None else list(range(rank))
    x, y = ctx.inputs[0], ctx.outputs[0]
    x_dims, y_dims = ctx.shape(x), ctx.shape(y)
    sizes = ctx.constant_value(ctx.inputs[3]) if ctx.has_input(3) else None
    scales = ctx.constant_value(ctx.inputs[2]) if ctx.has_input(2) and not ctx.has_input(3) else None
    result = []
    for k, axis in enumerate(axes):
        if scales is not None and scales.size and float(scales.reshape(-1)[k]) == 1.0:
            continue
        if sizes is not None and x_dims is not None and int(sizes.reshape(-1)[k]) == x_dims[axis]:
            continue
        if x_dims is not None and y_dims is not None and x_dims[axis] == y_dims[axis] == 1:
            continue
        result.append((axis, k))
    return result


def _source_coordinate(ctx: RuleContext, out: str, n_in: str, n_out: str, scale: str, k: int, rank: int) -> str:
    """Where output coordinates ``out`` (float32) come from in the input, as onnxruntime computes it."""
    mode = ctx.attr("coordinate_transformation_mode", "half_pixel")
    half = ctx.add(out, 0.5)
    if mode == "asymmetric":
        return ctx.div(out, scale)
    if mode == "tf_half_pixel_for_nn":
        return ctx.div(half, scale)
    if mode == "pytorch_half_pixel":
        return ctx.where(ctx.compare("Greater", n_out, 1.0), ctx.sub(ctx.div(half, scale), 0.5), 0.0)
    if mode == "align_corners":
        stretched = ctx.div(ctx.mul(out, ctx.sub(n_in, 1.0)), ctx.sub(n_out, 1.0))
        return ctx.where(ctx.compare("Equal", n_out, 1.0), 0.0, stretched)
    if mode == "tf_crop_and_resize":
        roi = ctx.cast_like(ctx.inputs[1], out)
        n_axes = len(ctx.attr("axes")) if ctx.attr("axes") is not None else rank
        start = ctx.op("Gather", roi, _i64(ctx, k))
        end = ctx.op("Gather", roi, _i64(ctx, n_axes + k))
        last = ctx.sub(n_in, 1.0)
        inside = ctx.add(
            ctx.mul(start, last), ctx.div(ctx.mul(ctx.mul(out, ctx.sub(end, start)), last), ctx.sub(n_out, 1.0))
        )
        middle = ctx.mul(ctx.mul(ctx.add(start, end), 0.5), last)
        return ctx.where(ctx.compare("Greater", n_out, 1.0), inside, middle)
    if mode == "half_pixel_symmetric":  # float32 offset, the rest in float64 (as onnxruntime does)
        adjustment = ctx.div(n_out, ctx.mul(scale, n_in))
        offset = ctx.mul(ctx.div(n_in, 2.0), ctx.sub(1.0, adjustment))
        f64 = onnx.TensorProto.DOUBLE
        shifted = ctx.div(ctx.add(ctx.cast(out, f64), 0.5), ctx.cast(scale, f64))
        return ctx.cast(ctx.sub(ctx.add(ctx.cast(offset, f64), shifted), 0.5), onnx.TensorProto.FLOAT)
    if mode != "half_pixel":
        raise ValueError(f"Resize node {ctx.node.name!r}: unknown coordinate_transformation_mode {mode!r}")
    return ctx.sub(ctx.div(half, scale), 0.5)


def _interpolation_matrix(ctx: RuleContext, axis: int, k: int, rank: int, same: str | None) -> str:
    """``W`` (out x in, x's element type) with ``y = W x`` along ``axis``, computed in float32.

    ``same``: a bool scalar, whether x and y have the same shape (onnxruntime then copies x).
    """
    x, y = ctx.inputs[0], ctx.outputs[0]
    n_in_int, n_out_int = _dim(ctx, x, axis), _dim(ctx, y, axis)
    f32 = onnx.TensorProto.FLOAT
    n_in, n_out = ctx.cast(n_in_int, f32), ctx.cast(n_out_int, f32)
    given = None if ctx.has_input(3) else ctx.cast(ctx.op("Gather", ctx.inputs[2], _i64(ctx, k)), f32)
    scale = given if given is not None else ctx.div(n_out, n_in)  # with sizes, the scale is out / in
    out = ctx.cast(_range(ctx, n_out_int), f32)
    source = _source_coordinate(ctx, out, n_in, n_out, scale, k, rank)
    # onnxruntime copies an axis whose scale is 1, and the whole tensor when the shape does not change,
    # whatever the coordinate mode (the ONNX reference would shift or crop in some modes)
    copied = ctx.compare("Equal", scale, 1.0)
    if same is not None:
        copied = ctx.op("Or", copied, same)
    source = ctx.where(copied, out, source)
    last = ctx.sub(n_in, 1.0)
    if ctx.attr("mode", "nearest") == "nearest":
        rounding = ctx.attr("nearest_mode", "round_prefer_floor")
        if rounding == "round_prefer_floor":
            nearest = ctx.op("Ceil", ctx.sub(source, 0.5))
        elif rounding == "round_prefer_ceil":
            nearest = ctx.op("Floor", ctx.add(source, 0.5))
        elif rounding in ("floor", "ceil"):
            nearest = ctx.op(rounding.capitalize(), source)
        else:
            raise ValueError(f"Resize node {ctx.node.name!r}: unknown nearest_mode {rounding!r}")
        clamped = ctx.op("Min", ctx.op("Max", nearest, ctx.const(0.0, nearest)), last)
        weights = _one_hot(ctx, ctx.cast(clamped, onnx.TensorProto.INT64), n_in_int, out)
    elif ctx.attr("mode") == "linear":
        clamped = ctx.op("Min", ctx.op("Max", source, ctx.const(0.0, source)), last)
        low = ctx.op("Floor", clamped)
        high = ctx.op("Min", ctx.add(low, 1.0), last)
        frac = ctx.op("Unsqueeze", ctx.sub(clamped, low), ctx.int64s([1]))
        int64 = onnx.TensorProto.INT64
        hot_low = _one_hot(ctx, ctx.cast(low, int64), n_in_int, out)
        hot_high = _one_hot(ctx, ctx.cast(high, int64), n_in_int, out)
        weights = ctx.add(ctx.mul(hot_low, ctx.sub(1.0, frac)), ctx.mul(hot_high, frac))
    else:
        weights = _cubic_weights(ctx, source, n_in_int, last)
    if ctx.attr("coordinate_transformation_mode") == "tf_crop_and_resize":  # outside the roi: extrapolated
        inside = ctx.op("And", ctx.compare("GreaterOrEqual", source, 0.0), ctx.compare("LessOrEqual", source, last))
        weights = ctx.mul(weights, ctx.op("Unsqueeze", ctx.cast_like(inside, weights), ctx.int64s([1])))
    return ctx.cast_like(weights, x)


def cubic_weights(ctx: RuleContext, t: str, a: float) -> list[str]:
    """Keys' cubic convolution weights of the taps at offsets -1, 0, 1, 2 from ``floor(s)``, ``t = s - floor(s)``.

    ``k(t + 1), k(t), k(1 - t), k(2 - t)`` with ``k(d) = (a + 2)|d|^3 - (a + 3)|d|^2 + 1`` for ``|d| <= 1`` and
    ``a|d|^3 - 5a|d|^2 + 8a|d| - 4a`` for ``1 < |d| < 2``.
    """

    def near(d: str) -> str:
        return ctx.add(ctx.mul(ctx.square(d), ctx.sub(ctx.mul(d, a + 2.0), a + 3.0)), 1.0)

    def far(d: str) -> str:
        return ctx.sub(ctx.mul(ctx.add(ctx.mul(ctx.sub(ctx.mul(d, a), 5.0 * a), d), 8.0 * a), d), 4.0 * a)

    return [far(ctx.add(t, 1.0)), near(t), near(ctx.sub(1.0, t)), far(ctx.sub(2.0, t))]


def cubic_slopes(ctx: RuleContext, t: str, a: float) -> list[str]:
    """``d/dt`` of :func:`cubic_weights`: ``k'(t + 1), k'(t), -k'(1 - t), -k'(2 - t)``."""

    def near(d: str) -> str:  # 3(a + 2) d^2 - 2(a + 3) d
        return ctx.mul(d, ctx.sub(ctx.mul(d, 3.0 * (a + 2.0)), 2.0 * (a + 3.0)))

    def far(d: str) -> str:  # 3a d^2 - 10a d + 8a
        return ctx.add(ctx.mul(d, ctx.sub(ctx.mul(d, 3.0 * a), 10.0 * a)), 8.0 * a)

    return [far(ctx.add(t, 1.0)), near(t), ctx.neg(near(ctx.sub(1.0, t))), ctx.neg(far(ctx.sub(2.0, t)))]


def _cubic_weights(ctx: RuleContext, source: str, n_in: str, last: str) -> str:
    """The (out x in) cubic interpolation weights at the source coordinates ``source`` (float32).

    :func:`cubic_weights` (``a = cubic_coeff_a``) at the taps ``floor(s) - 1 + i``; taps outside the input
    read its edge, or with ``exclude_outside`` weigh 0, the others renormalized to sum to 1 (as onnxruntime).
    """
    base = ctx.op("Floor", source)
    t = ctx.op("Unsqueeze", ctx.sub(source, base), ctx.int64s([1]))  # [out, 1]
    coefficients = cubic_weights(ctx, t, float(ctx.attr("cubic_coeff_a", -0.75)))
    weights: str | None = None
    total: str | None = None
    for i, coefficient in enumerate(coefficients):
        tap = ctx.op("Unsqueeze", ctx.add(base, float(i - 1)), ctx.int64s([1]))
        if ctx.attr("exclude_outside", 0):
            inside = ctx.op("And", ctx.compare("GreaterOrEqual", tap, 0.0), ctx.compare("LessOrEqual", tap, last))
            coefficient = ctx.mul(coefficient, ctx.cast_like(inside, coefficient))
            total = coefficient if total is None else ctx.add(total, coefficient)
        clamped = ctx.op("Min", ctx.op("Max", tap, ctx.const(0.0, tap)), last)
        hot = _one_hot(ctx, ctx.op("Squeeze", ctx.cast(clamped, onnx.TensorProto.INT64), ctx.int64s([1])), n_in, t)
        term = ctx.mul(hot, coefficient)
        weights = term if weights is None else ctx.add(weights, term)
    assert weights is not None
    return weights if total is None else ctx.div(weights, total)


@registry.rule("Resize", inputs=_DATA)
def resize(ctx: RuleContext, grads: Grads) -> Result:
    """dx = g contracted with W_a^T on each resized axis a, where y = x contracted with W_a (nearest/linear/cubic)"""
    (g,) = grads
    mode = ctx.attr("mode", "nearest")
    if (
        mode not in ("nearest", "linear", "cubic")
        or ctx.attr("antialias", 0)
        or (ctx.attr("keep_aspect_ratio_policy", "stretch") != "stretch")
    ):
        raise ValueError(
            f"Resize node {ctx.node.name!r}: onnxtrain differentiates mode 'nearest', 'linear' and 'cubic' without "
            f"antialias and with keep_aspect_ratio_policy='stretch', not mode={mode!r}, "
            f"antialias={ctx.attr('antialias', 0)}, keep_aspect_ratio_policy="
            f"{ctx.attr('keep_aspect_ratio_policy', 'stretch')!r}; use one of those, or keep its input out of wrt"
        )
    x, y = ctx.inputs[0], ctx.outputs[0]
    rank = ctx.known_rank(x)
    axes = _resize_axes(ctx, rank)
    x_static, y_static = ctx.static_shape(x), ctx.static_shape(y)
    if not axes or (x_static is not None and x_static == y_static):
        return _data(ctx, g)
    same = None
    if x_static is None or y_static is None:
        equal = ctx.cast(ctx.op("Equal", ctx.op("Shape", x), ctx.op("Shape", y)), onnx.TensorProto.INT64)
        same = ctx.cast(ctx.op("ReduceMin", equal, keepdims=0), onnx.TensorProto.BOOL)
    letters = _letters(rank)
    upper = [c.upper() for c in letters]
    out = list(letters)
    terms = ["".join(letters)]
    matrices = []
    # onnxruntime <= 1.23 crashes in an Einsum with an axis of size 0: where a resized axis of y may be empty,
    # g and W get one more row of zeros there (the sum is the same).
    y_dims = ctx.shape(y)
    padded = [axis for axis, _ in axes if y_dims is None or not (isinstance(y_dims[axis], int) and y_dims[axis] > 0)]
    if padded:
        g = ctx.op("Pad", g, ctx.int64s([0] * rank + [int(axis in padded) for axis in range(rank)]))
    for axis, k in axes:
        matrix = _interpolation_matrix(ctx, axis, k, rank, same)
        matrices.append(ctx.op("Pad", matrix, ctx.int64s([0, 0, 1, 0])) if axis in padded else matrix)
        terms.append(letters[axis] + upper[axis])
        out[axis] = upper[axis]
    dx = ctx.op("Einsum", g, *matrices, equation=",".join(terms) + "->" + "".join(out))
    return _data(ctx, dx)


# ------------------------------------------------------------ selecting


def _scatter_selected(ctx: RuleContext, g: str, x: str, indices: str, axis: int | None) -> str:
    """dx for ``y = Gather(x, indices, axis)`` with distinct 1-D ``indices`` (``x`` flattened when ``axis`` is None)."""
    if axis is None:
        flat_g = ctx.op("Reshape", g, ctx.int64s([-1]))
        flat = ctx.op("ScatterElements", ctx.flat_zeros_like(x), indices, flat_g, axis=0)
        return ctx.op("Reshape", flat, ctx.shape_of(x))
    rank = ctx.known_rank(x)
    axis %= rank
    along = ctx.op("Reshape", indices, ctx.int64s([1] * axis + [-1] + [1] * (rank - axis - 1)))
    spread = ctx.op("Expand", along, ctx.shape_of(g))
    return ctx.op("ScatterElements", ctx.zeros_like(x), spread, g, axis=axis)


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


@registry.rule("ReverseSequence", inputs=_DATA)
def reverse_sequence(ctx: RuleContext, grads: Grads) -> Result:
    """dx = ReverseSequence(g, sequence_lens)  (reversing the first lens[b] steps is its own inverse)"""
    dx = ctx.op(
        "ReverseSequence",
        grads[0],
        ctx.inputs[1],
        batch_axis=int(ctx.attr("batch_axis", 1)),
        time_axis=int(ctx.attr("time_axis", 0)),
    )
    return [dx, None]


@registry.rule("CenterCropPad", inputs=_DATA)
def center_crop_pad(ctx: RuleContext, grads: Grads) -> Result:
    """dx = CenterCropPad(g, shape(x)[axes], axes)  (a centred crop and a centred pad are each other's transpose)"""
    x = ctx.inputs[0]
    axes = ctx.attr("axes")
    extra = {"axes": [int(a) for a in axes]} if axes is not None else {}
    static = ctx.static_shape(x)
    if axes is None:
        shape = ctx.shape_of(x)
    elif static is not None:
        shape = ctx.int64s([static[int(a)] for a in axes])
    else:
        shape = ctx.op("Gather", ctx.op("Shape", x), ctx.int64s([int(a) for a in axes]))
    return [ctx.op("CenterCropPad", grads[0], shape, **extra), None]


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
        steps = _range(ctx, _dim(ctx, update, axis))
        tail = [1] * (rank - axis - 1)
        if indices:  # [batch, steps]: 0 keeps the batch size, -1 takes the steps
            positions = ctx.op("Add", ctx.op("Unsqueeze", indices[0], ctx.int64s([1])), steps)
            if mode == "circular":
                positions = ctx.op("Mod", positions, _dim(ctx, past, axis))
            positions = ctx.op("Reshape", positions, ctx.int64s([0] + [1] * (axis - 1) + [-1] + tail))
        else:
            positions = ctx.op("Reshape", steps, ctx.int64s([1] * axis + [-1] + tail))
        spread = ctx.op("Expand", positions, ctx.shape_of(update))
        dupdate = ctx.op("GatherElements", g, spread, axis=axis)
    return [dpast, dupdate, None][: len(ctx.inputs)]


# ------------------------------------------------------------ running products


@registry.rule("CumProd", opsets=(26, None), inputs=_DATA)
def cum_prod(ctx: RuleContext, grads: Grads) -> Result:
    """dx_j = sum(g_i y_i for i after j) / x_j; at the first zero z: sum(g_i y~_i for i after z), y~ with x_z = 1

    "After" is in scan order (reverse-aware; i = j included unless exclusive). Past the first zero of a
    slice every product holds it, so the gradient there is 0; at the first zero itself it is the
    cumulative product with that zero replaced by 1, so no division by zero happens anywhere.
    """
    (g,) = grads
    x, axis = ctx.inputs
    exclusive, reverse = int(ctx.attr("exclusive", 0)), int(ctx.attr("reverse", 0))

    def scan(op_type: str, value: str, backwards: int) -> str:
        return ctx.op(op_type, value, axis, exclusive=exclusive, reverse=backwards)

    zero = ctx.compare("Equal", x, 0.0)
    count = ctx.op("CumSum", ctx.cast_like(zero, x), axis, reverse=reverse)  # zeros so far, in scan order
    first = ctx.op("And", zero, ctx.compare("Equal", count, 1.0))
    after = scan("CumSum", ctx.mul(g, ctx.outputs[0]), 1 - reverse)
    regular = ctx.where(zero, 0.0, ctx.div(after, ctx.where(zero, 1.0, x)))
    without_first = scan("CumProd", ctx.where(first, 1.0, x), reverse)
    at_first = scan("CumSum", ctx.mul(g, without_first), 1 - reverse)
    return [ctx.where(first, at_first, regular), None]


# ------------------------------------------------------------ Fourier transforms


def _as_i64(ctx: RuleContext, value: str | int) -> str:
    """An int64 scalar: a constant for an int, ``value`` cast to int64 otherwise."""
    return (
        _i64(ctx, value)
        if isinstance(value, int)
        else ctx.cast(ctx.op("Reshape", value, ctx.int64s([])), onnx.TensorProto.INT64)
    )


def _fit_axis(ctx: RuleContext, h: str, axis: int, rank: int, length: str | int, target: str | int) -> str:
    """``h`` (of ``length`` along ``axis``) cut or zero-padded at the end to ``target`` along ``axis``."""
    if isinstance(length, int) and isinstance(target, int):
        if length > target:
            return ctx.op("Slice", h, ctx.int64s([0]), ctx.int64s([target]), ctx.int64s([axis]))
        return _pad_axis(ctx, h, axis, rank, target - length) if length < target else h
    cut = ctx.op(
        "Slice", h, ctx.int64s([0]), ctx.op("Reshape", _as_i64(ctx, target), ctx.int64s([1])), ctx.int64s([axis])
    )
    missing = ctx.op("Max", ctx.op("Sub", _as_i64(ctx, target), _as_i64(ctx, length)), _i64(ctx, 0))
    return _pad_axis(ctx, cut, axis, rank, missing)


def _pad_axis(ctx: RuleContext, h: str, axis: int, rank: int, end: str | int) -> str:
    """``h`` (of rank ``rank``) with ``end`` zeros at the end of ``axis`` (``end``: an int or an int64 scalar)."""
    if isinstance(end, int):
        pads = ctx.int64s([0] * (rank + axis) + [end] + [0] * (rank - axis - 1))
    else:
        end_1d = ctx.op("Reshape", end, ctx.int64s([1]))
        pads = ctx.op("Concat", ctx.int64s([0] * (rank + axis)), end_1d, ctx.int64s([0] * (rank - axis - 1)), axis=0)
    return ctx.op("Pad", h, pads, mode="constant")


def _axis_length(ctx: RuleContext, value: str, axis: int) -> str | int:
    """The size of ``value`` along ``axis``: an int when known, else an int64 scalar."""
    dims = ctx.shape(value)
    if dims is not None and isinstance(dims[axis], int):
        return int(dims[axis])
    return ctx.op("Gather", ctx.op("Shape", value), _i64(ctx, axis))


def _scaled(ctx: RuleContext, h: str, length: str | int, power: int) -> str:
    """``h * length**power`` (``power`` is 1 or -1)."""
    if isinstance(length, int):
        return ctx.mul(h, float(length) ** power)
    factor = ctx.cast_like(length, h)
    return ctx.mul(h, factor) if power == 1 else ctx.div(h, factor)


def _transform(ctx: RuleContext, h: str, axis: int, inverse: int) -> str:
    """The (full, complex) DFT of ``h`` along ``axis``, or its inverse; in the opset's form."""
    if ctx.opset >= 20:
        return ctx.op("DFT", h, "", _i64(ctx, axis), inverse=inverse)
    return ctx.op("DFT", h, inverse=inverse, axis=axis)


def _dft_axis(ctx: RuleContext, rank: int) -> int:
    """The DFT's axis in ``[0, rank - 2]``: the attribute (opset 17-19, default 1) or the constant input (-2)."""
    if ctx.opset < 20:
        return int(ctx.attr("axis", 1)) % rank
    given = ctx.constant_value(ctx.inputs[2]) if ctx.has_input(2) else np.array(-2)
    if given is None:
        raise ValueError(
            f"the gradient of DFT node {ctx.node.name!r} needs its axis {ctx.inputs[2]!r} as a constant "
            "(an initializer), not a value computed at run time"
        )
    return int(given) % rank


@registry.rule("DFT", opsets=(17, None), inputs=(0,))
def dft(ctx: RuleContext, grads: Grads) -> Result:
    """dx = W^H g for y = W x: L * IDFT(g) (inverse: DFT(g) / L), cut or padded to x's length; real x: the real part

    W is the DFT of length L along the axis, after x is cut or zero-padded to L (``dft_length``). One-sided
    (RFFT): W keeps its first L // 2 + 1 rows, so g is zero-padded to L rows first. Inverse one-sided (IRFFT):
    dX_j = m_j * DFT(g)_j / L, with m_j = 2 for the bins the conjugate-symmetric spectrum holds twice, else 1.
    """
    (g,) = grads
    x, y = ctx.inputs[0], ctx.outputs[0]
    rank = ctx.known_rank(x)
    axis = _dft_axis(ctx, rank)
    inverse, onesided = int(ctx.attr("inverse", 0)), int(ctx.attr("onesided", 0))

    n = _axis_length(ctx, x, axis)
    known = ctx.constant_value(ctx.inputs[1]) if ctx.has_input(1) else None
    given = int(known) if known is not None else ctx.inputs[1] if ctx.has_input(1) else None
    rest = [None] * (len(ctx.inputs) - 1)
    if onesided and inverse:  # IRFFT: y = Re(IDFT_L(X extended conjugate-symmetrically)), X of n = L // 2 + 1 bins
        length = _axis_length(ctx, y, axis)
        if isinstance(n, int) and isinstance(length, int) and n != length // 2 + 1:
            raise ValueError(
                f"the gradient of DFT node {ctx.node.name!r} (inverse, one-sided) needs dft_length // 2 + 1 input "
                f"bins, not {n} bins for dft_length {length} (onnxruntime reads other bin counts in its own way, "
                "which the ONNX specification does not define): give dft_length = 2 * (bins - 1) or 2 * bins - 1"
            )
        spectrum = _scaled(
            ctx,
            ctx.op(
                "Slice",
                _transform(ctx, g, axis, 0),
                ctx.int64s([0]),
                ctx.op("Reshape", _as_i64(ctx, n), ctx.int64s([1])),
                ctx.int64s([axis]),
            ),
            length,
            -1,
        )
        return [ctx.mul(spectrum, _irfft_weights(ctx, n, length, axis, rank, x)), *rest]
    if onesided:  # RFFT: the kept rows of W, zero rows for the others
        length = given if given is not None else n
        g = _fit_axis(ctx, g, axis, rank, _axis_length(ctx, g, axis), length)
    else:
        length = _axis_length(ctx, y, axis)
    back = (
        _scaled(ctx, _transform(ctx, g, axis, 0), length, -1)
        if inverse
        else _scaled(ctx, _transform(ctx, g, axis, 1), length, 1)
    )
    dx = _fit_axis(ctx, back, axis, rank, length, n)
    channels = _axis_length(ctx, x, rank - 1)
    if channels != 2:  # real x: the real part (a Slice to the size of x's last axis, 1 or 2)
        end = ctx.int64s([1]) if channels == 1 else ctx.op("Reshape", channels, ctx.int64s([1]))
        dx = ctx.op("Slice", dx, ctx.int64s([0]), end, ctx.int64s([rank - 1]))
    return [dx, *rest]


def _irfft_weights(ctx: RuleContext, bins: str | int, length: str | int, axis: int, rank: int, like: str) -> str:
    """``m_j = 1 + [0 < j <= L - bins]`` along ``axis``: 2 for the bins the conjugate-symmetric spectrum mirrors."""
    tail = [1] * (rank - axis - 1)
    if isinstance(bins, int) and isinstance(length, int) and sized.is_small(bins):
        weights = [1.0 + float(0 < j <= length - bins) for j in range(bins)]
        return ctx.const(np.array(weights).reshape([bins, *tail]), like)
    j = _range(ctx, _as_i64(ctx, bins))
    last = ctx.op("Sub", _as_i64(ctx, length), _as_i64(ctx, bins))
    mirrored = ctx.op("And", ctx.op("Greater", j, _i64(ctx, 0)), ctx.op("LessOrEqual", j, last))
    weights = ctx.add(ctx.cast_like(mirrored, like), 1.0)
    return ctx.op("Reshape", weights, ctx.int64s([-1, *tail]))


@registry.rule("STFT", opsets=(17, None), inputs=(0, 2))
def stft(ctx: RuleContext, grads: Grads) -> Result:
    """dsignal = overlap-add of window * H, dwindow = sum(frames * H); H = L * IDFT(g) (g zero-padded to L bins)

    H is the gradient of each windowed frame (the DFT's adjoint, as for DFT); a one-sided g is zero-padded to
    the frame length L first. Frame f starts at f * frame_step.
    """
    (g,) = grads
    signal, step = ctx.inputs[:2]
    window = ctx.inputs[2] if ctx.has_input(2) else None
    if window is not None:
        length = _axis_length(ctx, window, 0)
    elif ctx.has_input(3):
        known = ctx.constant_value(ctx.inputs[3])
        length = int(known) if known is not None else _as_i64(ctx, ctx.inputs[3])
    else:
        length = _axis_length(ctx, signal, 1)
    if int(ctx.attr("onesided", 1)):  # L // 2 + 1 bins (onnx's shape inference takes onesided=0 by default)
        bins = (
            length // 2 + 1
            if isinstance(length, int)
            else ctx.op("Add", ctx.op("Div", length, _i64(ctx, 2)), _i64(ctx, 1))
        )
        g = _fit_axis(ctx, g, 2, 4, bins, length)
    back = _transform(ctx, g, 2, inverse=1)
    channels = _axis_length(ctx, signal, 2)
    end = ctx.int64s([channels]) if isinstance(channels, int) else ctx.op("Reshape", channels, ctx.int64s([1]))
    spectrum = ctx.op("Slice", _scaled(ctx, back, length, 1), ctx.int64s([0]), end, ctx.int64s([3]))  # [B, F, L, C]
    frames = _axis_length(ctx, ctx.outputs[0], 1)
    starts = ctx.op("Mul", _range(ctx, _as_i64(ctx, frames)), _as_i64(ctx, step))
    positions = ctx.op("Add", ctx.op("Unsqueeze", starts, ctx.int64s([1])), _range(ctx, _as_i64(ctx, length)))  # [F, L]
    dsignal = dwindow = None
    if ctx.needs(0):
        weighted = spectrum if window is None else ctx.mul(spectrum, ctx.op("Reshape", window, ctx.int64s([-1, 1])))
        moved = ctx.op("Transpose", weighted, perm=[1, 2, 0, 3])  # [F, L, B, C]
        zeros = ctx.op("Transpose", ctx.zeros_like(signal), perm=[1, 0, 2])
        added = ctx.op("ScatterND", zeros, ctx.op("Unsqueeze", positions, ctx.int64s([2])), moved, reduction="add")
        dsignal = ctx.op("Transpose", added, perm=[1, 0, 2])
    if window is not None and ctx.needs(2):
        pieces = ctx.op("Gather", signal, positions, axis=1)  # [B, F, L, C]
        dwindow = ctx.op("ReduceSum", ctx.mul(pieces, spectrum), ctx.int64s([0, 1, 3]), keepdims=0)
    return [dsignal, None, dwindow, None][: len(ctx.inputs)]


# Window functions take only an integer size.
registry.non_differentiable("HannWindow", "HammingWindow", "BlackmanWindow")
