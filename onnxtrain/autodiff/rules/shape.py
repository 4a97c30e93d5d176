"""Shape and data-movement operators: reshapes, transposes, joining and splitting, slicing, padding,
tiling, triangles, running sums and products, constants.

Notation: ``x`` is the data input, ``y`` the output and ``g`` its gradient.
Shape, axes, repeat and size inputs are integer tensors and carry no gradient.

Most rules are the transpose of a data movement, registered with
``registry.linear``: a reshape goes back with ``Reshape``, a permutation with
the inverse permutation, a crop with a pad.

Where a movement is easiest to describe by where each output element comes
from (``Slice`` with any steps, ``Pad`` in edge/reflect/wrap mode), the rule
applies the very same operator to the *flat positions* of ``x``
(``Reshape(Range(0, size(x)), shape(x))``) and scatters ``g`` back to them.
"""

from __future__ import annotations

from collections.abc import Sequence

from onnxtrain.autodiff import dims
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.registry import Grads, Result
from onnxtrain.autodiff.rules._builtin import registry
from onnxtrain.autodiff.rules.backward_helpers import data_only, scatter_add_flat

#: Only the data input (0) is differentiable.
_DATA = (0,)


def _inverse(perm: Sequence[int]) -> list[int]:
    inverse = [0] * len(perm)
    for k, p in enumerate(perm):
        inverse[p] = k
    return inverse


# ------------------------------------------------------------ reshapes


def _reshape_back(ctx: RuleContext, g: str) -> str:
    """``g`` in the shape of the node's data input."""
    return ctx.op("Reshape", g, ctx.shape_of(ctx.inputs[0]))


def _transpose_back(ctx: RuleContext, g: str) -> str:
    """``g`` transposed by the inverse of the node's ``perm`` (the default reverses the axes, its own inverse)."""
    perm = ctx.attr("perm")
    if perm is None:
        return ctx.op("Transpose", g)
    return ctx.op("Transpose", g, perm=_inverse([int(p) for p in perm]))


registry.linear("Reshape", "dx = reshape(g, shape(x))", _reshape_back)
registry.linear("Squeeze", "dx = reshape(g, shape(x))", _reshape_back)
registry.linear("Unsqueeze", "dx = reshape(g, shape(x))", _reshape_back)
registry.linear("Flatten", "dx = reshape(g, shape(x))", _reshape_back)
registry.linear("Transpose", "dx = transpose(g, inverse(perm))", _transpose_back)


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


registry.linear(
    "SpaceToDepth",
    "dx = DepthToSpace(g, mode=DCR)",
    lambda ctx, g: ctx.op("DepthToSpace", g, blocksize=int(ctx.attr("blocksize")), mode="DCR"),
)


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
        x_dims = ctx.shape(x)
        if x_dims is not None and isinstance(x_dims[axis], int):
            static.append(int(x_dims[axis]))  # type: ignore[arg-type]
            sizes.append(ctx.int64s([x_dims[axis]]))  # type: ignore[list-item]
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
    x_dims = ctx.shape(x)
    if x_dims is None:
        return None
    rank = len(x_dims)
    axes_list = [int(a) % rank for a in (axes if axes is not None else range(len(starts)))]
    steps_list = [int(s) for s in steps] if steps is not None else [1] * len(axes_list)
    if any(s != 1 for s in steps_list):
        return None
    pads = [0] * (2 * rank)
    for a, start, end in zip(axes_list, starts, ends, strict=True):
        dim = x_dims[a]
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
        read = ctx.op("Slice", dims.flat_positions(ctx, x), *ctx.inputs[1:])
        zeros = ctx.flat_zeros_like(x, after=g)
        flat = ctx.op(
            "ScatterElements",
            zeros,
            ctx.op("Reshape", read, ctx.int64s([-1])),
            ctx.op("Reshape", g, ctx.int64s([-1])),
            axis=0,
        )
        dx = ctx.op("Reshape", flat, ctx.shape_of(x))
    return data_only(ctx, dx)


@registry.rule("Pad", inputs=(0, 2))
def pad(ctx: RuleContext, grads: Grads) -> Result:
    """constant: dx = Pad(g, -pads) (a crop; g for pads of 0), dc = sum(g) - sum(dx); else g added to its sources"""
    (g,) = grads
    x = ctx.inputs[0]
    mode = ctx.attr("mode", "constant")
    axes = [ctx.inputs[3]] if ctx.has_input(3) else []
    dx = dc = None
    if mode == "constant":
        pads = ctx.constant_value(ctx.inputs[1])
        if pads is not None and not pads.any():  # no pad (torch's F.pad before a 1x1 convolution): dx = g
            dx = g
        else:
            negated = ctx.int64s([-int(p) for p in pads]) if pads is not None else ctx.op("Neg", ctx.inputs[1])
            dx = ctx.op("Pad", g, negated, *(["", *axes] if axes else []), mode="constant")
        if ctx.has_input(2) and ctx.needs(2):
            c = ctx.inputs[2]
            total = ctx.op("ReduceSum", g, keepdims=0)
            inside = ctx.op("ReduceSum", dx, keepdims=0)
            dc = ctx.op("Reshape", ctx.sub(total, inside), ctx.shape_of(c))
    else:
        sources = ctx.op("Pad", dims.flat_positions(ctx, x), ctx.inputs[1], *(["", *axes] if axes else []), mode=mode)
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


# ------------------------------------------------------------ triangles and running sums


registry.linear(
    "Trilu",
    "dx = trilu(g, k, upper)",
    lambda ctx, g: ctx.op("Trilu", g, *(ctx.inputs[1:2] if ctx.has_input(1) else []), upper=int(ctx.attr("upper", 1))),
)
registry.linear(
    "CumSum",
    "dx = cumsum(g, axis, exclusive, reverse = not reverse)",
    lambda ctx, g: ctx.op(
        "CumSum", g, ctx.inputs[1], exclusive=int(ctx.attr("exclusive", 0)), reverse=1 - int(ctx.attr("reverse", 0))
    ),
)


# ------------------------------------------------------------ constants


@registry.rule("Constant", inputs=())
def constant(ctx: RuleContext, grads: Grads) -> Result:
    """no inputs: nothing to differentiate"""
    return []


@registry.rule("ConstantOfShape", inputs=())
def constant_of_shape(ctx: RuleContext, grads: Grads) -> Result:
    """the only input is an integer shape: no gradient"""
    return [None]


# ------------------------------------------------------------ reversing and centring


registry.linear(
    "ReverseSequence",
    "dx = ReverseSequence(g, sequence_lens)  (reversing the first lens[b] steps is its own inverse)",
    lambda ctx, g: ctx.op(
        "ReverseSequence",
        g,
        ctx.inputs[1],
        batch_axis=int(ctx.attr("batch_axis", 1)),
        time_axis=int(ctx.attr("time_axis", 0)),
    ),
)


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
