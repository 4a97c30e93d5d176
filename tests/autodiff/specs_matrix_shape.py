"""Specs for the matrix products, shape/data-movement and sequence operators (rules/matrix.py, shape.py, indexing.py,
resize.py, spectral.py, sequence.py).

See specs.py for the format. Index, shape and axes inputs are :class:`Extra` inputs,
drawn in range (negative values included where the operator allows them) and given
as initializers or, when ``fed``, as graph inputs whose values the rules cannot see
while building.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import helper, numpy_helper

from tests.autodiff.specs import Arg, Case, Extra, Spec, _fixed, cases

Shape = tuple[int, ...]
_F32 = np.float32


def _nested(array: np.ndarray) -> Any:
    """A hashable (nested tuple) form of an integer array, for :class:`Extra`."""
    return array.item() if array.ndim == 0 else tuple(_nested(a) for a in array)


def _shape(min_dims: int = 1, max_dims: int = 3, min_side: int = 1, max_side: int = 4) -> st.SearchStrategy[Shape]:
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def _maybe_negative(draw: st.DrawFn, axis: int, rank: int) -> int:
    return axis - rank if draw(st.booleans()) else axis


def _rng(draw: st.DrawFn) -> np.random.Generator:
    return np.random.default_rng(draw(st.integers(0, 2**16)))


# ------------------------------------------------------------------ matrix products


@st.composite
def matmul_cases(draw: st.DrawFn, batched_by_matrix: bool = False) -> Case:
    """A @ B with 1-D operands, batch axes and broadcast batch axes."""
    m, k, n = (draw(st.integers(1, 3)) for _ in range(3))
    if batched_by_matrix:
        return Case(((*draw(_shape(1, 2, 1, 3)), m, k), (k, n)))
    batch = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=2, max_side=3))
    a_batch, b_batch = batch.input_shapes
    a = (k,) if draw(st.integers(0, 4)) == 0 else (*a_batch, m, k)
    b = (k,) if draw(st.integers(0, 4)) == 0 else (*b_batch, k, n)
    return Case((a, b))


@st.composite
def square_cases(draw: st.DrawFn) -> Case:
    n = draw(st.integers(1, 3))
    return Case(((*draw(_shape(0, 2, 1, 3)), n, n),))


@st.composite
def gemm_cases(draw: st.DrawFn, with_c: bool) -> Case:
    m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
    trans_a, trans_b = draw(st.integers(0, 1)), draw(st.integers(0, 1))
    attrs: dict[str, Any] = {}
    if trans_a or draw(st.booleans()):
        attrs["transA"] = trans_a
    if trans_b or draw(st.booleans()):
        attrs["transB"] = trans_b
    if draw(st.booleans()):
        attrs["alpha"] = draw(st.sampled_from([0.5, -1.5]))
    if with_c and draw(st.booleans()):
        attrs["beta"] = draw(st.sampled_from([0.0, 2.0]))
    shapes: list[Shape] = [(k, m) if trans_a else (m, k), (n, k) if trans_b else (k, n)]
    if with_c:
        shapes.append(draw(st.sampled_from([(), (n,), (1, n), (m, 1), (m, n), (1, 1)])))
    return Case(tuple(shapes), _fixed(attrs))


#: Einsum equations by number of operands: products, contractions, diagonals,
#: letters summed inside one operand, implicit outputs, and "..." with broadcasting.
_EINSUM = {
    1: ["ij->ji", "ijk->kj", "ij->", "ii->i", "ii", "iij->ji", "abc->b", "ij", "...ij->...ji", "i...->..."],
    2: [
        "ij,jk->ik",
        "ij,jk",
        "bij,bjk->bik",
        "ij,ij->",
        "i,j->ij",
        "ij,kj->ik",
        "bhqd,bhkd->bhqk",
        "abc,c->ab",
        "iij,jk->ik",
        "ij,j->i",
        "ijk,jl->li",
        "...ij,...jk->...ik",
        "...i,...i->...",
        "ij...,j->i...",
    ],
    3: ["ij,jk,kl->il", "i,i,i->", "bi,bj,bk->bijk"],
}


@st.composite
def einsum_cases(draw: st.DrawFn, n_operands: int) -> Case:
    """An equation and operand shapes: one size per letter, broadcastable shapes for '...'."""
    equation = draw(st.sampled_from(_EINSUM[n_operands]))
    terms = equation.split("->")[0].split(",")
    sizes = {c: draw(st.integers(1, 3)) for c in sorted(set(equation) - set(".,->"))}
    with_ellipsis = [term for term in terms if "..." in term]
    ellipses = iter(())
    if with_ellipsis:
        drawn = draw(
            hnp.mutually_broadcastable_shapes(num_shapes=len(with_ellipsis), min_dims=0, max_dims=2, max_side=3)
        )
        # onnx's shape inference wants '...' of equal ranks, and takes a size 1 of an operand for the
        # output's size when a later operand has a symbolic size there: the first operand has them all.
        width = len(drawn.result_shape)
        padded = [(1,) * (width - len(shape)) + tuple(shape) for shape in drawn.input_shapes]
        ellipses = iter([tuple(drawn.result_shape), *padded[1:]])
    shapes = []
    for term in terms:
        head, dots, tail = term.partition("...")
        middle = next(ellipses) if dots else ()
        shapes.append((*(sizes[c] for c in head), *middle, *(sizes[c] for c in tail)))
    return Case(tuple(shapes), _fixed({"equation": equation}))


# ------------------------------------------------------------------ reshapes


@st.composite
def reshape_cases(draw: st.DrawFn) -> Case:
    """A target shape from x's dims permuted and merged, with 1s, a -1 and 0 (copy) entries."""
    shape = draw(_shape(0, 3))
    dims = list(draw(st.permutations(list(shape))))
    target: list[int] = []
    for d in dims:
        if target and draw(st.booleans()):
            target[-1] *= d
        else:
            target.append(d)
    if draw(st.booleans()):
        target.insert(draw(st.integers(0, len(target))), 1)
    if target and draw(st.booleans()):
        target[draw(st.integers(0, len(target) - 1))] = -1
    if draw(st.booleans()):
        target = [0 if k < len(shape) and t == shape[k] else t for k, t in enumerate(target)]
    return Case((shape,), extras=(Extra(1, tuple(target), fed=draw(st.booleans())),))


@st.composite
def transpose_cases(draw: st.DrawFn) -> Case:
    shape = draw(_shape(0, 4, 1, 3))
    attrs = {"perm": tuple(draw(st.permutations(range(len(shape)))))} if shape and draw(st.booleans()) else {}
    return Case((shape,), _fixed(attrs))


@st.composite
def squeeze_cases(draw: st.DrawFn) -> Case:
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=3))
    ones = [k for k, d in enumerate(shape) if d == 1]
    if not ones or draw(st.integers(0, 3)) == 0:
        return Case((shape,))
    axes = draw(st.lists(st.sampled_from(ones), min_size=1, unique=True))
    axes = [_maybe_negative(draw, a, len(shape)) for a in axes]
    return Case((shape,), extras=(Extra(1, tuple(axes), fed=draw(st.booleans())),))


@st.composite
def unsqueeze_cases(draw: st.DrawFn) -> Case:
    shape = draw(_shape(0, 3))
    rank = len(shape) + draw(st.integers(1, 2))
    axes = draw(st.lists(st.integers(0, rank - 1), min_size=rank - len(shape), max_size=rank - len(shape), unique=True))
    axes = [_maybe_negative(draw, a, rank) for a in axes]
    return Case((shape,), extras=(Extra(1, tuple(axes), fed=draw(st.booleans())),))


@st.composite
def flatten_cases(draw: st.DrawFn) -> Case:
    shape = draw(_shape(1, 4, 1, 3))
    attrs = {"axis": draw(st.integers(-len(shape), len(shape)))} if draw(st.booleans()) else {}
    return Case((shape,), _fixed(attrs))


@st.composite
def depth_to_space_cases(draw: st.DrawFn) -> Case:
    bs = draw(st.integers(2, 3))
    n, c, h, w = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
    attrs = {"blocksize": bs, "mode": draw(st.sampled_from(["DCR", "CRD"]))}
    return Case(((n, c * bs * bs, h, w),), _fixed(attrs))


@st.composite
def space_to_depth_cases(draw: st.DrawFn) -> Case:
    bs = draw(st.integers(2, 3))
    n, c, h, w = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    return Case(((n, c, h * bs, w * bs),), _fixed({"blocksize": bs}))


# ------------------------------------------------------------------ joining


@st.composite
def concat_cases(draw: st.DrawFn, n: int) -> Case:
    shape = list(draw(_shape(1, 3)))
    axis = draw(st.integers(0, len(shape) - 1))
    shapes = []
    for _ in range(n):
        shape[axis] = draw(st.integers(1, 3))
        shapes.append(tuple(shape))
    return Case(tuple(shapes), _fixed({"axis": _maybe_negative(draw, axis, len(shape))}))


# ------------------------------------------------------------------ slicing and padding


@st.composite
def slice_cases(draw: st.DrawFn) -> Case:
    """starts/ends (out of range, negative, INT64 limits) and steps (negative too) on some axes."""
    shape = draw(_shape(1, 3, 1, 5))
    rank = len(shape)
    axes = draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
    big = 2**63 - 1
    steps = [draw(st.sampled_from([-3, -2, -1, 1, 1, 2, 3])) for _ in axes]
    starts = [draw(st.integers(-6, 6)) for _ in axes]
    # "to the end" as PyTorch writes it. (onnxruntime reads INT64_MAX with a negative step as "to the
    # beginning" where the ONNX spec and onnx's shape inference read an empty slice: not drawn.)
    ends = [draw(st.one_of(st.integers(-7, 7), st.just(big if step > 0 else -big - 1))) for step in steps]
    fed = draw(st.booleans())
    extras = [Extra(1, tuple(starts), fed), Extra(2, tuple(ends), fed)]
    in_order = axes == list(range(len(axes)))
    if not in_order or draw(st.booleans()):
        extras.append(Extra(3, tuple(_maybe_negative(draw, a, rank) for a in axes), draw(st.booleans())))
    if any(s != 1 for s in steps) or draw(st.booleans()):
        if len(extras) == 2:
            extras.append(Extra(3, tuple(axes)))
        extras.append(Extra(4, tuple(steps), draw(st.booleans())))
    return Case((shape,), extras=tuple(extras))


@st.composite
def pad_cases(draw: st.DrawFn, mode: str, opset: int) -> Case:
    """Pads per axis (negative ones crop in constant mode), maybe on some axes only (opset 18)."""
    shape = draw(_shape(1, 3, 1, 4))
    rank = len(shape)
    if mode == "reflect" or mode == "wrap":
        shape = tuple(max(d, 2) for d in shape)
    axes = list(range(rank))
    with_axes = opset >= 18 and draw(st.booleans())
    if with_axes:
        axes = draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))

    def amount(d: int) -> int:
        if mode == "constant":
            return draw(st.integers(-min(1, d - 1), 2))
        if mode == "edge":
            return draw(st.integers(0, 2))
        return draw(st.integers(0, d - 1))

    begins = [amount(shape[a]) for a in axes]
    ends = [amount(shape[a]) for a in axes]
    extras = [Extra(1, tuple(begins + ends), fed=draw(st.booleans()))]
    if with_axes:
        extras.append(Extra(3, tuple(_maybe_negative(draw, a, rank) for a in axes), fed=draw(st.booleans())))
    shapes: tuple[Shape, ...] = (shape, ()) if mode == "constant" else (shape,)
    return Case(shapes, _fixed({"mode": mode}), tuple(extras))


# ------------------------------------------------------------------ broadcasting and tiling


@st.composite
def expand_cases(draw: st.DrawFn) -> Case:
    x, target = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3)).input_shapes
    return Case((x,), extras=(Extra(1, tuple(target), fed=draw(st.booleans())),))


@st.composite
def tile_cases(draw: st.DrawFn) -> Case:
    shape = draw(_shape(1, 3, 1, 3))
    repeats = tuple(draw(st.integers(1, 3)) for _ in shape)
    return Case((shape,), extras=(Extra(1, repeats, fed=draw(st.booleans())),))


# ------------------------------------------------------------------ gathering and scattering


@st.composite
def gather_cases(draw: st.DrawFn, leading: bool = False, index_dtype: Any = None) -> Case:
    """Indices of rank 0-2, repeated and negative ones included; along axis 0 when ``leading``; of
    ``index_dtype`` (int64 by default; int32 as TensorFlow's and Keras's exports write them)."""
    shape = draw(_shape(1, 3, 1, 4))
    axis = 0 if leading else draw(st.integers(0, len(shape) - 1))
    d = shape[axis]
    idx_shape = draw(_shape(0, 2, 1, 3))
    indices = _rng(draw).integers(-d, d, size=idx_shape)
    extras = (Extra(1, _nested(indices), fed=draw(st.booleans()), dtype=index_dtype),)
    attrs = {"axis": 0} if leading else {"axis": _maybe_negative(draw, axis, len(shape))}
    return Case((shape,), _fixed(attrs), extras)


def _rank_hidden(case: Case) -> list[onnx.NodeProto]:
    """``hidden``: ``x0`` reshaped to its own shape, cut from ``Shape(x0)`` at an end that onnx's shape inference
    cannot compute (a ``Mod`` of constants, as torch's exporter writes for ``unflatten``): its rank is unknown."""
    rank = len(case.shapes[0])

    def constant(name: str, value: int) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array([value]), name))

    return [
        constant("hide_rank", rank),
        constant("hide_modulus", rank + 1),
        constant("hide_start", 0),
        helper.make_node("Mod", ["hide_rank", "hide_modulus"], ["hide_end"]),
        helper.make_node("Shape", ["x0"], ["hide_shape"]),
        helper.make_node("Slice", ["hide_shape", "hide_start", "hide_end"], ["hide_dims"]),
        helper.make_node("Reshape", ["x0", "hide_dims"], ["hidden"]),
    ]


@st.composite
def gather_fed_cases(draw: st.DrawFn) -> Case:
    """x with at least 2 entries along the axis, and random indices in [-2, 1] fed as a graph input."""
    shape = list(draw(_shape(1, 3, 1, 3)))
    axis = draw(st.integers(0, len(shape) - 1))
    shape[axis] = max(shape[axis], 2)
    return Case((tuple(shape), draw(_shape(0, 2, 1, 3))), _fixed({"axis": axis}))


@st.composite
def gather_elements_cases(draw: st.DrawFn, index_dtype: Any = None) -> Case:
    """Indices no larger than x along the other axes (and any length along the axis), of ``index_dtype``."""
    shape = draw(_shape(1, 3, 1, 4))
    rank = len(shape)
    axis = draw(st.integers(0, rank - 1))
    idx_shape = tuple(draw(st.integers(1, 4)) if k == axis else draw(st.integers(1, d)) for k, d in enumerate(shape))
    indices = _rng(draw).integers(-shape[axis], shape[axis], size=idx_shape)
    extras = (Extra(1, _nested(indices), fed=draw(st.booleans()), dtype=index_dtype),)
    return Case((shape,), _fixed({"axis": _maybe_negative(draw, axis, rank)}), extras)


@st.composite
def gather_nd_cases(draw: st.DrawFn, unknown_depth: bool = False) -> Case:
    """batch_dims 0 or 1; index depth 1 to rank - batch_dims; repeated and negative indices. ``unknown_depth``:
    the indices fed, their last dimension not declared."""
    shape = draw(_shape(1, 4, 1, 3))
    rank = len(shape)
    batch = draw(st.integers(0, min(1, rank - 1)))
    depth = draw(st.integers(1, rank - batch))
    inner = draw(_shape(0, 2, 1, 3))
    rng = _rng(draw)
    idx_shape = (*shape[:batch], *inner)
    coords = [rng.integers(-shape[batch + i], shape[batch + i], size=idx_shape) for i in range(depth)]
    indices = np.stack(coords, axis=-1)
    attrs = {"batch_dims": batch} if batch or draw(st.booleans()) else {}
    fed = unknown_depth or draw(st.booleans())
    return Case((shape,), _fixed(attrs), (Extra(1, _nested(indices), fed=fed, unknown=(-1,) * unknown_depth),))


@st.composite
def scatter_nd_cases(draw: st.DrawFn, reductions: Sequence[str], unknown_depth: bool = False) -> Case:
    """Distinct index tuples (for reduction 'none'), possibly negative; updates shaped to match.
    ``unknown_depth``: the indices fed, their last dimension not declared."""
    data = draw(_shape(1, 3, 1, 4))
    rank = len(data)
    depth = draw(st.integers(1, rank))
    rng = _rng(draw)
    reduction = draw(st.sampled_from(list(reductions)))
    n_cells = int(np.prod(data[:depth]))
    inner = draw(_shape(0, 2, 1, 3).filter(lambda s: int(np.prod(s)) <= n_cells))
    count = int(np.prod(inner))
    distinct = reduction == "none"
    cells = rng.permutation(n_cells)[:count] if distinct else rng.integers(0, n_cells, size=count)
    coords = np.stack(np.unravel_index(cells, data[:depth]), axis=-1).reshape(*inner, depth)
    coords = coords - np.asarray(data[:depth]) * (rng.random(coords.shape) < 0.3)
    updates = (*inner, *data[depth:])
    attrs = {"reduction": reduction} if reduction != "none" or (len(reductions) > 1 and draw(st.booleans())) else {}
    fed = unknown_depth or draw(st.booleans())
    extra = Extra(1, _nested(coords), fed=fed, unknown=(-1,) * unknown_depth)
    return Case((data, updates), _fixed(attrs), (extra,))


@st.composite
def scatter_elements_cases(draw: st.DrawFn, reductions: Sequence[str], index_dtype: Any = None) -> Case:
    """Indices distinct along the axis (for reduction 'none'), no larger than data along the other axes; of
    ``index_dtype``."""
    data = draw(_shape(1, 3, 1, 4))
    rank = len(data)
    axis = draw(st.integers(0, rank - 1))
    idx_shape = tuple(draw(st.integers(1, d)) for d in data)
    reduction = draw(st.sampled_from(list(reductions)))
    rng = _rng(draw)
    d = data[axis]
    if reduction == "none":
        moved = np.moveaxis(np.zeros(idx_shape, dtype=np.int64), axis, -1)
        for pos in np.ndindex(*moved.shape[:-1]):
            moved[pos] = rng.permutation(d)[: moved.shape[-1]]
        indices = np.moveaxis(moved, -1, axis)
    else:
        indices = rng.integers(0, d, size=idx_shape)
    indices = indices - d * (rng.random(idx_shape) < 0.3)
    attrs: dict[str, Any] = {"axis": _maybe_negative(draw, axis, rank)}
    if reduction != "none":
        attrs["reduction"] = reduction
    extra = Extra(1, _nested(indices), fed=draw(st.booleans()), dtype=index_dtype)
    return Case((data, idx_shape), _fixed(attrs), (extra,))


@st.composite
def top_k_cases(draw: st.DrawFn) -> Case:
    shape = draw(_shape(1, 3, 1, 4))
    axis = draw(st.integers(0, len(shape) - 1))
    attrs: dict[str, Any] = {"axis": _maybe_negative(draw, axis, len(shape))}
    if draw(st.booleans()):
        attrs["largest"] = draw(st.integers(0, 1))
    if draw(st.booleans()):
        attrs["sorted"] = draw(st.integers(0, 1))
    k = draw(st.integers(1, shape[axis]))
    return Case((shape,), _fixed(attrs), (Extra(1, (k,), fed=draw(st.booleans())),), used_outputs=(0,), n_outputs=2)


def _no_close_values(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
    """No two values of data and updates within 5e-5 (the max/min winners stay under the finite differences)."""
    values = np.sort(np.concatenate([a.reshape(-1) for a in arrays if a.dtype.kind == "f"]))
    return bool(np.all(np.diff(values) > 5e-5))


def _distinct(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
    """No two entries of the data input closer than 1e-2 (TopK's choice is stable under the finite differences)."""
    values = np.sort(arrays[0].reshape(-1))
    return bool(np.all(np.diff(values) > 1e-2))


# ------------------------------------------------------------------ triangles and running sums


@st.composite
def trilu_cases(draw: st.DrawFn) -> Case:
    shape = draw(_shape(2, 3, 1, 4))
    attrs = {"upper": draw(st.integers(0, 1))} if draw(st.booleans()) else {}
    extras = (Extra(1, draw(st.integers(-3, 3)), fed=draw(st.booleans())),) if draw(st.booleans()) else ()
    return Case((shape,), _fixed(attrs), extras)


@st.composite
def cumsum_cases(draw: st.DrawFn) -> Case:
    shape = draw(_shape(1, 3))
    axis = _maybe_negative(draw, draw(st.integers(0, len(shape) - 1)), len(shape))
    attrs = {name: draw(st.integers(0, 1)) for name in ("exclusive", "reverse") if draw(st.booleans())}
    return Case((shape,), _fixed(attrs), (Extra(1, axis, fed=draw(st.booleans())),))


# ------------------------------------------------------------------ resizing

_COORDINATE_MODES = ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel")


@st.composite
def resize_cases(draw: st.DrawFn, opset: int, modes: Sequence[str] = ("nearest", "linear")) -> Case:
    """Scales (float) or sizes (int) for the last two axes of a 2-D or NCHW input (nearest: or 1-D)."""
    mode = draw(st.sampled_from(list(modes)))
    four_d = draw(st.booleans())
    spatial = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 2)), *spatial) if four_d else spatial
    if mode == "nearest" and not four_d and draw(st.booleans()):
        shape = spatial[:1]
    rank = len(shape)
    n_resized = min(rank, 2)
    lead = rank - n_resized
    coordinate_modes = _COORDINATE_MODES + (("half_pixel_symmetric",) if opset >= 19 else ())
    if mode == "cubic":
        coordinate_modes += ("tf_half_pixel_for_nn",)
    coordinate = draw(st.sampled_from((*coordinate_modes, "tf_crop_and_resize")))
    attrs: dict[str, Any] = {"mode": mode}
    if coordinate != "half_pixel" or draw(st.booleans()):
        attrs["coordinate_transformation_mode"] = coordinate
    if mode == "nearest" and draw(st.booleans()):
        attrs["nearest_mode"] = draw(st.sampled_from(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]))
    if mode == "cubic":
        if draw(st.booleans()):
            attrs["cubic_coeff_a"] = draw(st.sampled_from([-0.75, -0.5]))
        if draw(st.booleans()):
            attrs["exclude_outside"] = draw(st.integers(0, 1))
    use_axes = opset >= 18 and four_d and draw(st.booleans())
    n = 2 if use_axes else rank
    if use_axes:
        attrs["axes"] = (2, 3)
    extras = []
    if coordinate == "tf_crop_and_resize":
        starts = [draw(st.sampled_from([0.0, 0.2])) for _ in range(n)]
        ends = [draw(st.sampled_from([1.0, 0.7])) for _ in range(n)]
        roi = tuple(0.0 if k < lead and not use_axes else s for k, s in enumerate(starts))
        roi += tuple(1.0 if k < lead and not use_axes else e for k, e in enumerate(ends))
        extras.append(Extra(1, roi, fed=draw(st.booleans()), dtype=_F32))
    fed = draw(st.booleans())
    if draw(st.booleans()):
        scales = tuple(draw(st.sampled_from([0.5, 0.75, 1.0, 1.2, 1.5, 2.0, 3.0])) for _ in range(n_resized))
        if not use_axes:
            scales = (1.0,) * lead + scales
        extras.append(Extra(2, scales, fed=fed, dtype=_F32))
    else:
        sizes = tuple(draw(st.integers(1, 6)) for _ in range(n_resized))
        if not use_axes:
            sizes = shape[:lead] + sizes
        extras.append(Extra(3, sizes, fed=fed))
    return Case((shape,), _fixed(attrs), tuple(extras))


# ------------------------------------------------------------------ constants


@st.composite
def constant_cases(draw: st.DrawFn) -> Case:
    """An unrelated differentiated input (gradient zero) beside the constant."""
    values = tuple(draw(st.lists(st.sampled_from([-1.0, 0.5, 2.0]), min_size=1, max_size=3)))
    return Case((draw(_shape(0, 2)),), _fixed({"value_floats": values}))


@st.composite
def constant_of_shape_cases(draw: st.DrawFn) -> Case:
    return Case((draw(_shape(0, 2)),), extras=(Extra(0, tuple(draw(_shape(0, 2))), fed=draw(st.booleans())),))


# ------------------------------------------------------------------ the table

_INDEX = Arg((-2, 1), diff=False, dtype=np.int64)
_INDEX32 = Arg((-2, 1), diff=False, dtype=np.int32)
_I32 = np.int32

SPECS: list[Spec] = [
    # matrix products
    Spec("MatMul", (Arg(), Arg()), matmul_cases()),
    Spec("MatMul", (Arg(), Arg()), matmul_cases(), opset=13, variant="opset13"),
    Spec("MatMul", (Arg(), Arg()), matmul_cases(batched_by_matrix=True), variant="batched-by-matrix"),
    Spec("MatMul", (Arg(diff=False), Arg()), matmul_cases(), variant="only-b"),
    Spec("MatMul", (Arg(),), square_cases(), wiring=(0, 0), variant="aliased"),
    Spec("Gemm", (Arg(), Arg(), Arg()), gemm_cases(with_c=True)),
    Spec("Gemm", (Arg(), Arg()), gemm_cases(with_c=False), opset=13, variant="no-C-opset13"),
    Spec("Einsum", (Arg(),), einsum_cases(1), variant="1-operand"),
    Spec("Einsum", (Arg(), Arg()), einsum_cases(2), variant="2-operands"),
    Spec("Einsum", (Arg(), Arg(), Arg()), einsum_cases(3), opset=13, variant="3-operands-opset13"),
    Spec("Einsum", (Arg(),), st.just(Case(((3,),), _fixed({"equation": "i,i->"}))), wiring=(0, 0), variant="aliased"),
    # reshapes
    Spec("Reshape", (Arg(),), reshape_cases()),
    Spec("Reshape", (Arg(),), reshape_cases(), opset=13, variant="opset13"),
    Spec("Transpose", (Arg(),), transpose_cases()),
    Spec("Squeeze", (Arg(),), squeeze_cases(), opset=13, variant="opset13"),
    Spec("Squeeze", (Arg(),), squeeze_cases(), opset=21, variant="opset21"),
    Spec("Unsqueeze", (Arg(),), unsqueeze_cases(), opset=13, variant="opset13"),
    Spec("Unsqueeze", (Arg(),), unsqueeze_cases(), opset=21, variant="opset21"),
    Spec("Flatten", (Arg(),), flatten_cases()),
    Spec("DepthToSpace", (Arg(),), depth_to_space_cases()),
    Spec("SpaceToDepth", (Arg(),), space_to_depth_cases()),
    # joining
    *(Spec("Concat", tuple(Arg() for _ in range(n)), concat_cases(n), variant=f"{n}-inputs") for n in (1, 2, 3)),
    Spec(
        "Concat", (Arg(),), concat_cases(1).map(lambda c: Case(c.shapes * 2, c.attrs)), wiring=(0, 0), variant="aliased"
    ),
    # slicing and padding
    Spec("Slice", (Arg(),), slice_cases()),
    Spec("Slice", (Arg(),), slice_cases(), opset=13, variant="opset13"),
    Spec("Pad", (Arg(), Arg()), pad_cases("constant", 13), opset=13, wiring=(0, None, 1), variant="constant-opset13"),
    Spec("Pad", (Arg(), Arg()), pad_cases("constant", 18), opset=18, wiring=(0, None, 1), variant="constant-opset18"),
    Spec("Pad", (Arg(),), pad_cases("edge", 13), opset=13, variant="edge-opset13"),
    Spec("Pad", (Arg(),), pad_cases("reflect", 18), opset=18, variant="reflect-opset18"),
    Spec("Pad", (Arg(),), pad_cases("wrap", 19), opset=19, variant="wrap-opset19"),
    # broadcasting and tiling
    Spec("Expand", (Arg(),), expand_cases()),
    Spec("Tile", (Arg(),), tile_cases()),
    # gathering and scattering
    Spec("Gather", (Arg(),), gather_cases(), opset=13, variant="opset13"),
    Spec("Gather", (Arg(),), gather_cases(), opset=18, variant="opset18"),
    Spec("Gather", (Arg(), _INDEX), gather_fed_cases(), opset=18, variant="random-indices"),
    # int32 indices (TensorFlow's and Keras's exports): the rules cast them to int64 where they compute with them
    Spec("Gather", (Arg(),), gather_cases(index_dtype=_I32), opset=13, variant="int32-opset13"),
    Spec("Gather", (Arg(),), gather_cases(index_dtype=_I32), opset=18, variant="int32-opset18"),
    Spec("Gather", (Arg(), _INDEX32), gather_fed_cases(), opset=18, variant="int32-random-indices"),
    Spec("Gather", (Arg(), _INDEX32), gather_fed_cases(), opset=13, variant="int32-random-indices-opset13"),
    Spec(
        "Gather",
        (Arg(),),
        gather_cases(leading=True),
        opset=18,
        wiring=("hidden",),
        before=_rank_hidden,
        variant="axis0-unknown-rank",
    ),
    Spec("GatherElements", (Arg(),), gather_elements_cases(), opset=13, variant="opset13"),
    Spec("GatherElements", (Arg(),), gather_elements_cases(), opset=18, variant="opset18"),
    Spec("GatherElements", (Arg(),), gather_elements_cases(_I32), opset=13, variant="int32-opset13"),
    Spec("GatherElements", (Arg(),), gather_elements_cases(_I32), opset=18, variant="int32-opset18"),
    Spec("GatherND", (Arg(),), gather_nd_cases(), opset=13, variant="opset13"),
    Spec("GatherND", (Arg(),), gather_nd_cases(), opset=18, variant="opset18"),
    # the index depth not declared: the gradients scatter element by element
    Spec("GatherND", (Arg(),), gather_nd_cases(unknown_depth=True), opset=13, variant="opset13-unknown-depth"),
    Spec("GatherND", (Arg(),), gather_nd_cases(unknown_depth=True), opset=18, variant="opset18-unknown-depth"),
    *(
        Spec(
            "ScatterND",
            (Arg(), Arg("sparse" if reductions == ["mul"] else "real")),
            scatter_nd_cases(reductions, unknown_depth=True),
            opset=18,
            wiring=(0, None, 1),
            valid=_no_close_values if reductions == ["max", "min"] else None,
            variant=f"{'-'.join(reductions)}-unknown-depth",
        )
        for reductions in (["none", "add"], ["mul"], ["max", "min"])
    ),
    Spec("ScatterND", (Arg(), Arg()), scatter_nd_cases(["none"]), opset=13, wiring=(0, None, 1), variant="opset13"),
    Spec(
        "ScatterND", (Arg(), Arg()), scatter_nd_cases(["none", "add"]), opset=18, wiring=(0, None, 1), variant="opset18"
    ),
    Spec(
        "ScatterElements",
        (Arg(), Arg()),
        scatter_elements_cases(["none"]),
        opset=13,
        wiring=(0, None, 1),
        variant="opset13",
    ),
    Spec(
        "ScatterElements",
        (Arg(), Arg()),
        scatter_elements_cases(["none", "add"]),
        opset=18,
        wiring=(0, None, 1),
        variant="opset18",
    ),
    Spec(
        "ScatterElements",
        (Arg(), Arg()),
        scatter_elements_cases(["none", "add"], _I32),
        opset=18,
        wiring=(0, None, 1),
        variant="int32-opset18",
    ),
    # reductions mul (updates with exact zeros), max and min (no ties)
    *(
        Spec(op, (Arg(), Arg("sparse")), cases_of(["mul"]), opset=18, wiring=(0, None, 1), variant="mul")
        for op, cases_of in (("ScatterND", scatter_nd_cases), ("ScatterElements", scatter_elements_cases))
    ),
    *(
        Spec(
            op,
            (Arg(), Arg()),
            cases_of(["max", "min"]),
            opset=18,
            wiring=(0, None, 1),
            valid=_no_close_values,
            variant="max-min",
        )
        for op, cases_of in (("ScatterND", scatter_nd_cases), ("ScatterElements", scatter_elements_cases))
    ),
    Spec("TopK", (Arg(),), top_k_cases(), valid=_distinct),
    # triangles and running sums
    Spec("Trilu", (Arg(),), trilu_cases()),
    Spec("CumSum", (Arg(),), cumsum_cases()),
    # resizing (onnxruntime has no double Resize kernel)
    Spec("Resize", (Arg(),), resize_cases(13), opset=13, dtype=_F32, variant="opset13"),
    Spec("Resize", (Arg(),), resize_cases(19), opset=19, dtype=_F32, variant="opset19"),
    Spec("Resize", (Arg(),), resize_cases(13, ("cubic",)), opset=13, dtype=_F32, variant="cubic-opset13"),
    Spec("Resize", (Arg(),), resize_cases(19, ("cubic",)), opset=19, dtype=_F32, variant="cubic-opset19"),
    # constants: no differentiable input; the graph around them still differentiates
    Spec("Constant", (Arg(),), constant_cases(), wiring=()),
    Spec("ConstantOfShape", (Arg(),), constant_of_shape_cases(), wiring=()),
]


# ------------------------------------------------------------------ selecting, reversing, cropping


@st.composite
def compress_cases(draw: st.DrawFn) -> Case:
    """A condition (at least one True) no longer than x along the axis, or than x flattened without an axis."""
    shape = draw(_shape(1, 3, 1, 4))
    axis = draw(st.one_of(st.none(), st.integers(0, len(shape) - 1)))
    n = int(np.prod(shape)) if axis is None else shape[axis]
    condition = draw(st.lists(st.booleans(), min_size=1, max_size=n).filter(any))
    attrs = {} if axis is None else {"axis": _maybe_negative(draw, axis, len(shape))}
    return Case((shape,), _fixed(attrs), (Extra(1, tuple(condition), draw(st.booleans()), np.bool_),))


@st.composite
def unique_cases(draw: st.DrawFn) -> Case:
    """Distinct values (drawn later), flattened or along an axis, sorted or in order of appearance."""
    shape = draw(_shape(1, 3, 1, 4))
    attrs: dict[str, Any] = {}
    if draw(st.booleans()):
        attrs["axis"] = _maybe_negative(draw, draw(st.integers(0, len(shape) - 1)), len(shape))
    if draw(st.booleans()):
        attrs["sorted"] = draw(st.integers(0, 1))
    return Case((shape,), _fixed(attrs))


def _distinct_e3(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
    values = np.sort(arrays[0].reshape(-1))
    return bool(np.all(np.diff(values) > 1e-3))


@st.composite
def reverse_sequence_cases(draw: st.DrawFn) -> Case:
    """Time and batch axes 0 and 1 (either order), lengths 0 to the full time axis."""
    shape = draw(_shape(2, 3, 1, 4))
    time_axis = draw(st.integers(0, 1))
    batch_axis = 1 - time_axis
    lens = tuple(draw(st.integers(0, shape[time_axis])) for _ in range(shape[batch_axis]))
    attrs = {"time_axis": time_axis, "batch_axis": batch_axis}
    return Case((shape,), _fixed(attrs), (Extra(1, lens, draw(st.booleans())),))


@st.composite
def center_crop_pad_cases(draw: st.DrawFn) -> Case:
    """Target sizes smaller and larger than x (odd and even differences), on all axes or some."""
    shape = draw(_shape(1, 3, 1, 5))
    rank = len(shape)
    axes = list(range(rank))
    attrs: dict[str, Any] = {}
    if draw(st.booleans()):
        axes = draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
        attrs["axes"] = tuple(_maybe_negative(draw, a, rank) for a in axes)
    target = tuple(draw(st.integers(1, 6)) for _ in axes)
    return Case((shape,), _fixed(attrs), (Extra(1, target, draw(st.booleans())),))


@st.composite
def tensor_scatter_cases(draw: st.DrawFn) -> Case:
    """A cache of rank 3-4, an update shorter along the sequence axis, write indices in range (or none)."""
    rank = draw(st.integers(3, 4))
    axis = draw(st.integers(1, rank - 1))
    cache = list(draw(_shape(rank, rank, 1, 3)))
    cache[axis] = draw(st.integers(1, 5))
    steps = draw(st.integers(1, cache[axis]))
    update = list(cache)
    update[axis] = steps
    mode = draw(st.sampled_from(["linear", "circular"]))
    attrs: dict[str, Any] = {}
    if axis != rank - 2 or draw(st.booleans()):
        attrs["axis"] = _maybe_negative(draw, axis, rank)
    if mode != "linear" or draw(st.booleans()):
        attrs["mode"] = mode
    extras: tuple[Extra, ...] = ()
    if draw(st.booleans()):
        top = cache[axis] - steps if mode == "linear" else 2 * cache[axis]
        indices = tuple(draw(st.integers(0, top)) for _ in range(cache[0]))
        extras = (Extra(2, indices, draw(st.booleans())),)
    return Case((tuple(cache), tuple(update)), _fixed(attrs), extras)


# ------------------------------------------------------------------ Fourier transforms


@st.composite
def dft_cases(draw: st.DrawFn, opset: int) -> Case:
    """Forward/inverse, full/one-sided (real in for RFFT, complex in for IRFFT), any signal axis, dft_length
    shorter or longer than the signal (IRFFT: one of the two lengths its bins describe)."""
    inverse, onesided = draw(st.integers(0, 1)), draw(st.integers(0, 1))
    channels = (2 if inverse else 1) if onesided else draw(st.integers(1, 2))
    signal = draw(_shape(1, 3, 1, 5))
    rank = len(signal) + 1
    axis = draw(st.integers(0, rank - 2))
    attrs: dict[str, Any] = {}
    if inverse or draw(st.booleans()):
        attrs["inverse"] = inverse
    if onesided or draw(st.booleans()):
        attrs["onesided"] = onesided
    extras = []
    bins = signal[axis]
    if onesided and inverse:  # IRFFT: n input bins make a signal of length 2 (n - 1) (the default) or 2 n - 1
        length = draw(st.sampled_from([2 * bins - 1] + ([2 * bins - 2] if bins > 1 else [])))
        if length != 2 * bins - 2 or draw(st.booleans()):
            extras.append(Extra(1, length, draw(st.booleans())))
    elif draw(st.booleans()):
        extras.append(Extra(1, draw(st.integers(1, 8)), draw(st.booleans())))
    shown = _maybe_negative(draw, axis, rank) if axis or draw(st.booleans()) else axis
    if opset >= 20:
        if axis != rank - 2 or draw(st.booleans()):
            extras.append(Extra(2, shown))
    elif axis != 1 or draw(st.booleans()):
        attrs["axis"] = shown
    return Case(((*signal, channels),), _fixed(attrs), tuple(extras))


@st.composite
def stft_cases(draw: st.DrawFn, with_window: bool) -> Case:
    """A real or complex signal, frames of length 1 to the signal's with steps 1-3, one-sided or not."""
    batch, length, channels = draw(st.integers(1, 2)), draw(st.integers(1, 7)), draw(st.integers(1, 2))
    frame = draw(st.integers(1, length))
    attrs = {"onesided": draw(st.integers(0, 1))}  # always given: onnx's shape inference defaults it to 0, not 1
    extras = [Extra(1, draw(st.integers(1, 3)), draw(st.booleans()))]
    if not with_window or draw(st.booleans()):
        extras.append(Extra(3, frame, draw(st.booleans())))
    shapes = ((batch, length, channels), (frame,)) if with_window else ((batch, length, channels),)
    return Case(shapes, _fixed(attrs), tuple(extras))


SPECS += [
    Spec("Compress", (Arg(),), compress_cases()),
    Spec("Compress", (Arg(),), compress_cases(), opset=13, variant="opset13"),
    Spec("Unique", (Arg(),), unique_cases(), valid=_distinct_e3),
    Spec("ReverseSequence", (Arg(),), reverse_sequence_cases()),
    Spec("CenterCropPad", (Arg(),), center_crop_pad_cases(), opset=18),
    Spec("TensorScatter", (Arg(), Arg()), tensor_scatter_cases(), opset=24),
    Spec("DFT", (Arg(),), dft_cases(17), opset=17, variant="opset17"),
    Spec("DFT", (Arg(),), dft_cases(20), opset=20, variant="opset20"),
    Spec("CumProd", (Arg("sparse"),), cumsum_cases(), opset=26),  # exact zeros: the first-zero path
    Spec("STFT", (Arg(), Arg()), stft_cases(with_window=True), wiring=(0, None, 1), variant="window"),
    Spec("STFT", (Arg(),), stft_cases(with_window=False), opset=20, variant="frame-length-opset20"),
]


# ------------------------------------------------------------------ sequences and optionals
#
# A sequence cannot be a graph input that is differentiated, nor a projected output: these specs build it
# from tensors before the operator (``before``) and read its elements back after it (``after``), reading
# one element twice so that the sequence's gradient has two contributions to sum.


def _constant(name: str, value: int) -> Any:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, np.int64), name))


def _construct(*args: int) -> Any:
    """``before``: the sequence ``s`` of the graph inputs ``x<k>`` for ``k`` in ``args``."""
    return lambda case: (helper.make_node("SequenceConstruct", [f"x{k}" for k in args], ["s"]),)


def _read(count: Any) -> Any:
    """``after``: every element of the output sequence (``count(case)`` of them), and the first again."""

    def after(case: Case, outputs: Sequence[str]) -> tuple[list[Any], list[str]]:
        n = count(case)
        positions = [*range(n), -n] if n else []
        nodes = [_constant(f"at{i}", p) for i, p in enumerate(positions)]
        nodes += [helper.make_node("SequenceAt", [outputs[0], f"at{i}"], [f"read{i}"]) for i in range(len(positions))]
        return nodes, [f"read{i}" for i in range(len(positions))]

    return after


def _independent(n: int, same: bool = False) -> st.SearchStrategy[tuple[Shape, ...]]:
    """``n`` shapes of rank 0-3, drawn independently (or all the same)."""
    if same:
        return _shape(0, 3).map(lambda shape: (shape,) * n)
    return st.tuples(*(_shape(0, 3) for _ in range(n)))


@st.composite
def sequence_cases(draw: st.DrawFn, n: int, position: tuple[int, int, int] | None = None) -> Case:
    """``n`` element shapes (all equal: static element type; or not), and maybe a position input in range."""
    shapes = draw(_independent(n, same=draw(st.booleans())))
    extras: tuple[Extra, ...] = ()
    if position is not None and draw(st.integers(0, 3)):
        index, low, high = position
        extras = (Extra(index, draw(st.integers(low, high)), draw(st.booleans())),)
    return Case(shapes, extras=extras)


def _split_count(case: Case) -> int:
    """How many pieces SplitToSequence makes for ``case``."""
    shape = case.shapes[0]
    length = shape[int(dict(case.attrs).get("axis", 0)) % len(shape)]
    split = next((e.value for e in case.extras if e.index == 1), None)
    if split is None:
        return length
    if isinstance(split, int):
        return -(-length // split)
    return len(split)


@st.composite
def split_to_sequence_cases(draw: st.DrawFn) -> Case:
    """No split (pieces of 1, keepdims or not), a scalar split (the last piece maybe shorter), or sizes."""
    shape = list(draw(_shape(1, 3, 1, 4)))
    rank = len(shape)
    axis = draw(st.integers(0, rank - 1))
    attrs: dict[str, Any] = {}
    if axis or draw(st.booleans()):
        attrs["axis"] = _maybe_negative(draw, axis, rank)
    kind = draw(st.sampled_from(["none", "scalar", "sizes"]))
    extras: tuple[Extra, ...] = ()
    if kind == "none":
        if draw(st.booleans()):
            attrs["keepdims"] = draw(st.integers(0, 1))
    elif kind == "scalar":
        extras = (Extra(1, draw(st.integers(1, shape[axis])), draw(st.booleans())),)
    else:
        sizes = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
        shape[axis] = sum(sizes)
        extras = (Extra(1, tuple(sizes), draw(st.booleans())),)
    return Case((tuple(shape),), _fixed(attrs), extras)


@st.composite
def concat_from_sequence_cases(draw: st.DrawFn) -> Case:
    """Three elements equal but along the axis (concatenated), or equal (stacked on a new axis)."""
    new_axis = draw(st.integers(0, 1))
    shape = list(draw(_shape(0 if new_axis else 1, 3)))
    rank = len(shape) + new_axis
    axis = draw(st.integers(0, rank - 1))
    shapes = []
    for _ in range(3):
        if not new_axis:
            shape[axis] = draw(st.integers(1, 3))
        shapes.append(tuple(shape))
    attrs: dict[str, Any] = {"axis": _maybe_negative(draw, axis, rank)}
    if new_axis or draw(st.booleans()):
        attrs["new_axis"] = new_axis
    return Case(tuple(shapes), _fixed(attrs))


def _get_element(case: Case, outputs: Sequence[str]) -> tuple[list[Any], list[str]]:
    return [helper.make_node("OptionalGetElement", [outputs[0]], ["element"])], ["element"]


def _three() -> tuple[Arg, Arg, Arg]:
    return (Arg(), Arg(), Arg())


SPECS += [Spec("OptionalGetElement", (Arg(),), cases(1), opset=18, variant="tensor")]

#: The rules of :func:`onnxtrain.autodiff.rules.sequence.register_sequence_rules`, checked (by
#: tests/autodiff/rules/test_sequence.py) with the engine change they need; they join SPECS with it.
SEQUENCE_SPECS: list[Spec] = [
    *(
        Spec(
            "SequenceConstruct",
            tuple(Arg() for _ in range(n)),
            sequence_cases(n),
            after=_read(lambda c, n=n: n),
            variant=f"{n}-inputs",
        )
        for n in (1, 3)
    ),
    *(
        Spec(
            "SequenceAt",
            _three(),
            sequence_cases(3, (1, -3, 2)).filter(lambda c: bool(c.extras)),
            opset=opset,
            wiring=("s",),
            before=_construct(0, 1, 2),
            variant=f"opset{opset}",
        )
        for opset in (13, 18)
    ),
    Spec(
        "SequenceInsert",
        _three(),
        sequence_cases(3, (2, -2, 2)),
        wiring=("s", 2),
        before=_construct(0, 1),
        after=_read(lambda c: 3),
    ),
    *(
        Spec(
            "SequenceErase",
            _three(),
            sequence_cases(3, (1, -3, 2)),
            opset=opset,
            wiring=("s",),
            before=_construct(0, 1, 2),
            after=_read(lambda c: 2),
            variant=f"opset{opset}",
        )
        for opset in (13, 18)
    ),
    *(
        Spec(
            "SplitToSequence",
            (Arg(),),
            split_to_sequence_cases(),
            opset=opset,
            after=_read(_split_count),
            variant=f"opset{opset}",
        )
        for opset in (13, 18)
    ),
    *(
        Spec(
            "ConcatFromSequence",
            _three(),
            concat_from_sequence_cases(),
            opset=opset,
            wiring=("s",),
            before=_construct(0, 1, 2),
            variant=f"opset{opset}",
        )
        for opset in (13, 18)
    ),
    Spec("Optional", (Arg(),), cases(1), opset=18, after=_get_element),
    Spec(
        "OptionalGetElement",
        (Arg(),),
        cases(1),
        opset=18,
        wiring=("o",),
        before=lambda case: (helper.make_node("Optional", ["x0"], ["o"]),),
        variant="optional",
    ),
]

SPECS += SEQUENCE_SPECS
