"""Specs for the neural-network operators (rules/losses.py, convolution.py, pooling.py, normalization.py, sampling.py,
region_pooling.py, attention.py, and Dropout in elementwise.py); see specs.py for the format.

onnxruntime's CPU provider has no double kernels for Conv, ConvTranspose,
AveragePool, GlobalAveragePool, GlobalMaxPool, InstanceNormalization, LpPool,
GlobalLpPool, LRN, MeanVarianceNormalization, MaxRoiPool, MaxUnpool, Col2Im and
RotaryEmbedding (whose schema has none): their specs (and those whose gradients
use them) run in float32 with the looser tolerance. :class:`NNSpec` adds two
settings: ``backend="onnx.reference"`` (:class:`ReferenceSpec`) for what
onnxruntime 1.31 cannot run as onnx defines it (each such spec says why), and
``dim_modes`` to keep to static shapes where onnx's shape inference is wrong.
Shapes stay small (sides up to 4 or 5) to keep each spec fast.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto

from tests.autodiff.specs import Arg, Case, Extra, Spec

_F32 = np.float32
_N_CLASSES = 3


def _attrs(attrs: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))


def _optional(draw: st.DrawFn, attrs: dict[str, Any], name: str, value: Any, default: Any) -> None:
    """Set ``attrs[name] = value``, or leave it out (half the time) when it is the default."""
    if value != default or draw(st.booleans()):
        attrs[name] = value


# ------------------------------------------------------------------------ softmax


@st.composite
def axis_cases(draw: st.DrawFn, max_dims: int = 3) -> Case:
    """A shape and an optional ``axis`` attribute (negative or not)."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=max_dims, min_side=1, max_side=4))
    attrs: dict[str, Any] = {}
    _optional(draw, attrs, "axis", draw(st.integers(-len(shape), len(shape) - 1)), -1)
    return Case((shape,), _attrs(attrs))


# ----------------------------------------------------------------- loss operators


@st.composite
def loss_cases(draw: st.DrawFn, ignore: Sequence[int | None], log_prob: bool) -> Case:
    """Scores ``[N, 3, *d]``, targets ``[N, *d]``, reduction, ignore_index; log_prob maybe in the loss."""
    n = draw(st.integers(1, 4))
    extra = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    attrs: dict[str, Any] = {}
    reduction = draw(st.sampled_from([None, "mean", "sum", "none"]))
    if reduction is not None:
        attrs["reduction"] = reduction
    ignore_index = draw(st.sampled_from(list(ignore)))
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    n_outputs, used = 1, (0,)
    if log_prob and draw(st.booleans()):
        n_outputs, used = 2, draw(st.sampled_from([(0,), (0, 1), (1,)]))
    return Case(((n, _N_CLASSES, *extra), (n, *extra)), _attrs(attrs), used_outputs=used, n_outputs=n_outputs)


def _some_target_counts(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
    """A mean over targets that are all ignored is 0 / 0."""
    if attrs.get("reduction", "mean") != "mean" or "ignore_index" not in attrs:
        return True
    return bool(np.any(arrays[1] != attrs["ignore_index"]))


def loss_specs(op_type: str, log_prob: bool) -> list[Spec]:
    scores = Arg("real")
    target = Arg((0, _N_CLASSES - 1), diff=False, dtype=np.int64)
    weight = Arg((0.5, 2.0), diff=False, shape=(_N_CLASSES,))
    valid = _some_target_counts
    return [
        Spec(op_type, (scores, target), loss_cases((None, 0, 1), log_prob), 13, valid=valid),
        Spec(op_type, (scores, target, weight), loss_cases((None, 2), log_prob), 13, valid=valid, variant="weight"),
        Spec(
            op_type,
            (scores, Arg((-1, _N_CLASSES - 1), diff=False, dtype=np.int32), weight),
            loss_cases((-1,), log_prob),
            13,
            valid=valid,
            variant="negative-ignore-index-int32",
        ),
    ]


# -------------------------------------------------------------------- convolution


@st.composite
def conv_cases(draw: st.DrawFn, bias: bool) -> Case:
    """Conv in 1-D or 2-D: groups (depthwise too), kernel, strides, dilations, pads or auto_pad."""
    n = draw(st.integers(1, 2))
    batch = draw(st.integers(1, 2))
    grouping = draw(st.sampled_from(["one", "two", "depthwise"]))
    group = {"one": 1, "two": 2, "depthwise": draw(st.integers(2, 3))}[grouping]
    cg = 1 if grouping == "depthwise" else draw(st.integers(1, 2))
    mg = draw(st.integers(1, 2))
    kernel = [draw(st.integers(1, 3)) for _ in range(n)]
    strides = [draw(st.integers(1, 2)) for _ in range(n)]
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    same = auto_pad.startswith("SAME")  # onnxruntime: "Dilation not supported for AutoPadType::SAME_*"
    dilations = [1 if same else draw(st.integers(1, 2)) for _ in range(n)]
    pads = [draw(st.integers(0, k - 1)) for k in kernel * 2] if auto_pad == "NOTSET" else [0] * 2 * n
    ext = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    sizes = [draw(st.integers(max(1, e - pads[i] - pads[n + i]), e + 2)) for i, e in enumerate(ext)]
    attrs: dict[str, Any] = {}
    _optional(draw, attrs, "strides", strides, [1] * n)
    _optional(draw, attrs, "dilations", dilations, [1] * n)
    _optional(draw, attrs, "group", group, 1)
    if auto_pad == "NOTSET":
        _optional(draw, attrs, "pads", pads, [0] * 2 * n)
    else:
        attrs["auto_pad"] = auto_pad
    if draw(st.booleans()):
        attrs["kernel_shape"] = kernel
    shapes = [(batch, group * cg, *sizes), (group * mg, cg, *kernel)]
    if bias:
        shapes.append((group * mg,))
    return Case(tuple(shapes), _attrs(attrs))


@st.composite
def conv_transpose_cases(draw: st.DrawFn, bias: bool) -> Case:
    """ConvTranspose in 1-D or 2-D: groups, strides, dilations, output_padding, pads or auto_pad.

    ``output_shape`` is checked in test_nn.py: onnx infers a wrong output shape for it.
    """
    n = draw(st.integers(1, 2))
    batch = draw(st.integers(1, 2))
    group = draw(st.sampled_from([1, 1, 2]))
    cg, mg = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    kernel = [draw(st.integers(1, 3)) for _ in range(n)]
    strides = [draw(st.integers(1, 3)) for _ in range(n)]
    dilations = [draw(st.integers(1, 2)) for _ in range(n)]
    sizes = [draw(st.integers(1, 3)) for _ in range(n)]
    extra = [draw(st.integers(0, s - 1)) for s in strides]
    full = [(s - 1) * st_ + (k - 1) * d + 1 for s, st_, k, d in zip(sizes, strides, kernel, dilations, strict=True)]
    mode = draw(st.sampled_from(["pads", "pads", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    if mode.startswith("SAME"):  # onnx and onnxruntime disagree on the output size with output_padding
        dilations, extra = [1] * n, [0] * n
    attrs: dict[str, Any] = {}
    if mode == "pads":
        begin = [draw(st.integers(0, min(k - 1, f + e - 1))) for k, f, e in zip(kernel, full, extra, strict=True)]
        end = [
            draw(st.integers(0, min(k - 1, f + e - 1 - b)))
            for k, f, e, b in zip(kernel, full, extra, begin, strict=True)
        ]
        _optional(draw, attrs, "pads", begin + end, [0] * 2 * n)
    else:
        attrs["auto_pad"] = mode
    _optional(draw, attrs, "strides", strides, [1] * n)
    _optional(draw, attrs, "dilations", dilations, [1] * n)
    _optional(draw, attrs, "output_padding", extra, [0] * n)
    _optional(draw, attrs, "group", group, 1)
    if draw(st.booleans()):
        attrs["kernel_shape"] = kernel
    shapes = [(batch, group * cg, *sizes), (group * cg, mg, *kernel)]
    if bias:
        shapes.append((group * mg,))
    return Case(tuple(shapes), _attrs(attrs))


# ------------------------------------------------------------------------ pooling


def _windows_hold_data(size: int, kernel: int, stride: int, dilation: int, begin: int, end: int, ceil: bool) -> bool:
    """Whether every window (ceil_mode's last one too) covers at least one element of the input."""
    span = size + begin + end - ((kernel - 1) * dilation + 1)
    if span < 0:
        return False
    count = (-(-span // stride) if ceil else span // stride) + 1
    return all(any(0 <= o * stride - begin + j * dilation < size for j in range(kernel)) for o in range(count))


@st.composite
def pool_cases(draw: st.DrawFn, op_type: str, opset: int) -> Case:
    """MaxPool / AveragePool / LpPool in 1-D or 2-D: kernel, strides, dilations, pads or auto_pad, ceil_mode."""
    n = draw(st.integers(1, 2))
    batch, channels = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    kernel = [draw(st.integers(1, 3)) for _ in range(n)]
    strides = [draw(st.integers(1, 3)) for _ in range(n)]
    # LpPool has dilations and ceil_mode from opset 18 on
    dilated = op_type == "MaxPool" or opset >= (18 if op_type == "LpPool" else 19)
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    same = auto_pad.startswith("SAME")
    # onnxruntime: MaxPool's Indices output has the wrong shape for SAME with dilations
    dilations = [draw(st.integers(1, 2)) if dilated and not same else 1 for _ in range(n)]
    pads = [draw(st.integers(0, k - 1)) for k in kernel * 2] if auto_pad == "NOTSET" else [0] * 2 * n
    ceil = auto_pad == "NOTSET" and (op_type != "LpPool" or opset >= 18) and draw(st.booleans())
    ext = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    sizes = [draw(st.integers(max(1, e - pads[i] - pads[n + i]), e + 3)) for i, e in enumerate(ext)]
    if same:  # onnxruntime rejects a negative total padding ((ceil(S / s) - 1) * s + ext < S)
        strides = [min(s_, e) for s_, e in zip(strides, ext, strict=True)]
    if auto_pad == "NOTSET":
        for i in range(n):
            args = (sizes[i], kernel[i], strides[i], dilations[i], pads[i], pads[n + i], ceil)
            if not _windows_hold_data(*args):
                pads[i] = pads[n + i] = 0
                sizes[i] = max(sizes[i], ext[i])
        windows = zip(sizes, kernel, strides, dilations, pads[:n], pads[n:], [ceil] * n, strict=True)
        if not all(_windows_hold_data(*w) for w in windows):
            ceil = False
    attrs: dict[str, Any] = {"kernel_shape": kernel}
    _optional(draw, attrs, "strides", strides, [1] * n)
    if dilated:
        _optional(draw, attrs, "dilations", dilations, [1] * n)
    if auto_pad == "NOTSET":
        _optional(draw, attrs, "pads", pads, [0] * 2 * n)
        if op_type != "LpPool" or opset >= 18:
            _optional(draw, attrs, "ceil_mode", int(ceil), 0)
    else:
        attrs["auto_pad"] = auto_pad
    n_outputs = 1
    if op_type == "MaxPool":
        _optional(draw, attrs, "storage_order", draw(st.integers(0, 1)), 0)
        n_outputs = draw(st.integers(1, 2))
    elif op_type == "LpPool":
        _optional(draw, attrs, "p", draw(st.sampled_from([1, 2, 3])), 2)
    else:
        _optional(draw, attrs, "count_include_pad", draw(st.integers(0, 1)), 0)
    return Case(((batch, channels, *sizes),), _attrs(attrs), n_outputs=n_outputs)


@st.composite
def oversized_pool_cases(draw: st.DrawFn, op_type: str, opset: int) -> Case:
    """AveragePool / LpPool with ``ceil_mode`` and a kernel larger than the padded input, one window per axis
    (strides of the kernel's size): a pool over the whole input as transformers' EfficientNet writes it (a 640 x
    640 kernel over 3 x 3)."""
    n = draw(st.integers(1, 2))
    batch, channels = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    sizes = [draw(st.integers(1, 4)) for _ in range(n)]
    pads = [draw(st.integers(0, 1)) for _ in range(2 * n)]
    kernel = [s + pads[i] + pads[n + i] + draw(st.integers(1, 6)) for i, s in enumerate(sizes)]
    attrs: dict[str, Any] = {"kernel_shape": kernel, "strides": kernel, "ceil_mode": 1}
    _optional(draw, attrs, "pads", pads, [0] * 2 * n)
    if op_type == "LpPool":
        _optional(draw, attrs, "p", draw(st.sampled_from([1, 2, 3])), 2)
    else:
        _optional(draw, attrs, "count_include_pad", draw(st.integers(0, 1)), 0)
    return Case(((batch, channels, *sizes),), _attrs(attrs))


def _no_ties(gap: float):
    """A ``valid`` check: the values of x differ pairwise by more than ``gap`` (finite differences
    must not cross from one maximum to another)."""

    def valid(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
        values = np.sort(arrays[0].reshape(-1))
        return bool(np.all(np.diff(values) > gap)) if values.size > 1 else True

    return valid


def _distinct_maxima(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
    """Each channel's maximum beats its runner-up by more than float32 finite differences move them."""
    x = arrays[0].astype(np.float64)
    flat = np.sort(x.reshape(x.shape[0], x.shape[1], -1), axis=-1)
    return flat.shape[-1] < 2 or bool(np.all(flat[..., -1] - flat[..., -2] > 0.1))


def spatial_shapes(min_dims: int = 3, max_dims: int = 4, max_side: int = 4) -> st.SearchStrategy[Case]:
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=1, max_side=max_side).map(
        lambda s: Case((s,))
    )


# ----------------------------------------------------------------- normalizations


def _spread(axes: Sequence[int] | None, minimum: float = 0.05):
    """A ``valid`` check: the variance of x over ``axes`` (None: spatial axes) is at least ``minimum``.

    Near-constant groups make the standardization so curved that float32 finite
    differences are meaningless.
    """

    def valid(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
        x = arrays[0].astype(np.float64)
        over = tuple(range(2, x.ndim)) if axes is None else tuple(a % x.ndim for a in axes)
        if math.prod(x.shape[a] for a in over) <= 1:
            return True  # a group of one element standardizes to exactly 0
        return bool(np.all(x.var(axis=over) >= minimum))

    return valid


@st.composite
def batch_norm_cases(draw: st.DrawFn, opset: int, training: bool) -> Case:
    """``[N, C, *S]`` (rank 2 to 4) with per-channel parameters; epsilon, momentum, training mode."""
    shape = draw(hnp.array_shapes(min_dims=2, max_dims=4, min_side=1, max_side=3))
    channels = shape[1]
    attrs: dict[str, Any] = {}
    _optional(draw, attrs, "epsilon", draw(st.sampled_from([1e-5, 1e-2])), 1e-5)
    if training:
        _optional(draw, attrs, "momentum", draw(st.sampled_from([0.9, 0.5])), 0.9)
    n_outputs = 1
    if opset >= 14:
        _optional(draw, attrs, "training_mode", int(training), 0)
        if training:
            n_outputs = 3
    elif training:
        n_outputs = 5
    return Case((shape, *[(channels,)] * 4), _attrs(attrs), n_outputs=n_outputs)


def batch_norm_spec(opset: int, training: bool) -> Spec:
    args = (Arg(), Arg(), Arg(), Arg(), Arg((0.5, 2.0)))
    mode = "training" if training else "inference"
    return Spec("BatchNormalization", args, batch_norm_cases(opset, training), opset, variant=f"{mode}-opset{opset}")


@st.composite
def layer_norm_cases(draw: st.DrawFn, bias: bool, outputs: Sequence[tuple[int, ...]]) -> Case:
    """A shape, an axis, scale (and bias) of the normalized shape; which outputs enter the loss."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    attrs: dict[str, Any] = {}
    _optional(draw, attrs, "axis", axis, -1)
    _optional(draw, attrs, "epsilon", draw(st.sampled_from([1e-5, 1e-2])), 1e-5)
    normalized = shape[axis % len(shape) :]
    used = draw(st.sampled_from(list(outputs)))
    n_outputs = 3 if max(used) > 0 or draw(st.booleans()) else 1
    shapes = (shape, normalized, normalized) if bias else (shape, normalized)
    return Case(shapes, _attrs(attrs), used_outputs=used, n_outputs=n_outputs)


@st.composite
def instance_norm_cases(draw: st.DrawFn) -> Case:
    """``[N, C, *S]`` with at least 2 elements per instance (onnxruntime's float32 statistics of
    one element are not exactly constant)."""
    shape = draw(hnp.array_shapes(min_dims=3, max_dims=4, min_side=1, max_side=4))
    if math.prod(shape[2:]) < 2:
        shape = (*shape[:2], 2, *shape[3:])
    attrs: dict[str, Any] = {}
    _optional(draw, attrs, "epsilon", draw(st.sampled_from([1e-5, 1e-2])), 1e-5)
    return Case((shape, (shape[1],), (shape[1],)), _attrs(attrs))


@st.composite
def group_norm_cases(draw: st.DrawFn, opset: int) -> Case:
    """``[N, G * Cg, *S]``; scale and bias per group (opset 18) or per channel (21)."""
    groups, per_group = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    spatial = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    shape = (draw(st.integers(1, 2)), groups * per_group, *spatial)
    if groups * per_group * max(1, int(np.prod(spatial))) < 2:
        shape = (shape[0], shape[1], *spatial, 2)
    attrs: dict[str, Any] = {"num_groups": groups}
    _optional(draw, attrs, "epsilon", draw(st.sampled_from([1e-5, 1e-2])), 1e-5)
    params = (groups,) if opset < 21 else (shape[1],)
    return Case((shape, params, params), _attrs(attrs))


def _layer_spread(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
    x = arrays[0]
    return _spread(tuple(range(attrs.get("axis", -1) % x.ndim, x.ndim)))(arrays, attrs)


def _group_spread(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
    x = arrays[0].astype(np.float64)
    grouped = x.reshape(x.shape[0], attrs["num_groups"], -1)
    return grouped.shape[-1] <= 1 or bool(np.all(grouped.var(axis=-1) >= 0.05))


@st.composite
def lp_cases(draw: st.DrawFn) -> Case:
    case = draw(axis_cases())
    attrs = dict(case.attrs)
    _optional(draw, attrs, "p", draw(st.sampled_from([1, 2])), 2)
    return Case(case.shapes, _attrs(attrs))


# ------------------------------------------------------------------------ dropout


def dropout_cases(extras: tuple[Extra, ...] = (), outputs: Sequence[int] = (1, 2)) -> st.SearchStrategy[Case]:
    return st.builds(
        lambda shape, n: Case((shape,), (), extras, n_outputs=n),
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4),
        st.sampled_from(list(outputs)),
    )


_RATIO_0 = Arg((0.0, 0.0), diff=False, shape=())
_TRUE = Arg((1, 1), diff=False, shape=(), dtype=np.bool_)
_FALSE = Arg((0, 0), diff=False, shape=(), dtype=np.bool_)

# ---------------------------------------------------------------- more operators


@dataclass(frozen=True)
class NNSpec(Spec):
    """A :class:`Spec` with two more settings, read by gradcheck.py and test_rules.py:

    ``backend``: ``"onnx.reference"`` runs the model in onnx's reference evaluator, for what
    onnxruntime cannot run (no kernel at the opset or for the type, a known bug);
    ``dim_modes``: the ways the input dimensions may be declared (see ``gradcheck.DIM_MODES``).
    """

    backend: str = "onnxruntime"
    dim_modes: tuple[str, ...] = ("static", "named", "unknown")


@dataclass(frozen=True)
class ReferenceSpec(NNSpec):
    """An :class:`NNSpec` checked in ``onnx.reference``."""

    backend: str = "onnx.reference"


@st.composite
def global_lp_cases(draw: st.DrawFn) -> Case:
    """``[N, C, *S]`` and p (1, 2, 3, or the default)."""
    shape = draw(hnp.array_shapes(min_dims=3, max_dims=4, min_side=1, max_side=3))
    attrs: dict[str, Any] = {}
    _optional(draw, attrs, "p", draw(st.sampled_from([1, 2, 3])), 2)
    return Case((shape,), _attrs(attrs))


@st.composite
def mvn_cases(draw: st.DrawFn) -> Case:
    """Rank 3 or 4 with drawn axes, or rank 4 with the default axes [0, 2, 3]."""
    if draw(st.booleans()):
        shape = draw(hnp.array_shapes(min_dims=4, max_dims=4, min_side=1, max_side=3))
        return Case((shape,))
    shape = draw(hnp.array_shapes(min_dims=3, max_dims=4, min_side=1, max_side=3))
    axes = draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape), unique=True))
    return Case((shape,), _attrs({"axes": sorted(axes)}))


def _mvn_spread(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
    """At least 2 elements and a variance of 0.05 over the axes (a one-element group is constant)."""
    x = arrays[0]
    axes = tuple(attrs.get("axes", (0, 2, 3)))
    return math.prod(x.shape[a] for a in axes) >= 2 and _spread(axes)(arrays, attrs)


@st.composite
def lrn_cases(draw: st.DrawFn) -> Case:
    """``[N, C, *S]`` with size, alpha, beta and bias (some at their defaults)."""
    shape = draw(hnp.array_shapes(min_dims=4, max_dims=4, min_side=1, max_side=4))
    attrs: dict[str, Any] = {"size": draw(st.sampled_from([1, 3, 5]))}  # onnxruntime: odd sizes only
    _optional(draw, attrs, "alpha", draw(st.sampled_from([1e-4, 0.5])), 1e-4)
    _optional(draw, attrs, "beta", draw(st.sampled_from([0.75, 0.5, 1.3])), 0.75)
    _optional(draw, attrs, "bias", draw(st.sampled_from([1.0, 2.0])), 1.0)
    return Case((shape,), _attrs(attrs))


@st.composite
def rms_norm_cases(draw: st.DrawFn, stash: int | None) -> Case:
    """A shape, an axis, and a scale broadcasting to the normalized shape."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    normalized = shape[axis % len(shape) :]
    tail = draw(st.integers(1, len(normalized)))
    scale = tuple(d if draw(st.booleans()) else 1 for d in normalized[len(normalized) - tail :])
    attrs: dict[str, Any] = {}
    _optional(draw, attrs, "axis", axis, -1)
    _optional(draw, attrs, "epsilon", draw(st.sampled_from([1e-5, 1e-2])), 1e-5)
    if stash is not None:
        attrs["stash_type"] = stash
    return Case((shape, scale), _attrs(attrs))


def _rms_spread(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
    """A mean square of at least 0.1 over the normalized axes: near 0 the float32 curvature is too high."""
    x = arrays[0].astype(np.float64)
    axes = tuple(range(attrs.get("axis", -1) % x.ndim, x.ndim))
    return bool(np.all(np.mean(x**2, axis=axes) >= 0.1))


@st.composite
def max_unpool_cases(draw: st.DrawFn) -> Case:
    """``[N, C, *S]`` scattered into an output of ``(S - 1) * stride - pads + kernel`` (or a drawn
    larger output_shape) at distinct indices (as MaxPool's), given as an initializer or a graph input."""
    n = draw(st.integers(1, 2))
    batch, channels = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    sizes = [draw(st.integers(1, 3)) for _ in range(n)]
    kernel = [draw(st.integers(1, 3)) for _ in range(n)]
    strides = [draw(st.integers(1, 2)) for _ in range(n)]
    pads = [draw(st.integers(0, k - 1)) for k in kernel * 2]
    for i in range(n):  # room for every input element: no pads ((S - 1) * stride + kernel >= S)
        if (sizes[i] - 1) * strides[i] + kernel[i] - pads[i] - pads[n + i] < sizes[i]:
            pads[i] = pads[n + i] = 0
    out = [(s - 1) * t - a - b + k for s, t, a, b, k in zip(sizes, strides, pads[:n], pads[n:], kernel, strict=True)]
    attrs: dict[str, Any] = {"kernel_shape": kernel}
    _optional(draw, attrs, "strides", strides, [1] * n)
    _optional(draw, attrs, "pads", pads, [0] * 2 * n)
    extras: list[Extra] = []
    if draw(st.booleans()):
        out = [o + draw(st.integers(0, 1)) for o in out]
        extras.append(Extra(2, (batch, channels, *out)))
    per_image = math.prod(out)
    count = math.prod(sizes)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    index = np.stack(
        [
            (b * channels + c) * per_image + rng.permutation(per_image)[:count]
            for b in range(batch)
            for c in range(channels)
        ]
    ).reshape(batch, channels, *sizes)
    extras.insert(0, Extra(1, _nested(index), fed=draw(st.booleans())))
    return Case(((batch, channels, *sizes),), _attrs(attrs), tuple(extras))


def _nested(array: np.ndarray) -> Any:
    """An array as nested tuples (the hashable form an ``Extra`` holds)."""
    return tuple(_nested(a) for a in array) if array.ndim else array.item()


@st.composite
def col2im_cases(draw: st.DrawFn, ort_only: bool) -> Case:
    """Columns ``[N, C * prod(block), L]`` of a 1-D or 2-D image: dilations, pads, strides; the
    block shape as an initializer (folded kernel) or a graph input (run-time kernel)."""
    n = draw(st.integers(1, 2))
    batch, channels = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    block = [draw(st.integers(1, 3)) for _ in range(n)]
    # onnxruntime's Col2Im is wrong for 1-D images with dilations (the reference spec checks them)
    dilations = [draw(st.integers(1, 2)) if n == 2 or not ort_only else 1 for _ in range(n)]
    strides = [draw(st.integers(1, 2)) for _ in range(n)]
    pads = [draw(st.integers(0, 1)) for _ in range(2 * n)]
    ext = [(k - 1) * d + 1 for k, d in zip(block, dilations, strict=True)]
    image = [draw(st.integers(max(1, e - pads[i] - pads[n + i]), e + 3)) for i, e in enumerate(ext)]
    blocks = [(s + a + b - e) // t + 1 for s, a, b, e, t in zip(image, pads[:n], pads[n:], ext, strides, strict=True)]
    attrs: dict[str, Any] = {}
    _optional(draw, attrs, "dilations", dilations, [1] * n)
    _optional(draw, attrs, "pads", pads, [0] * 2 * n)
    _optional(draw, attrs, "strides", strides, [1] * n)
    extras = (Extra(1, tuple(image), fed=draw(st.booleans())), Extra(2, tuple(block), fed=draw(st.booleans())))
    return Case(((batch, channels * math.prod(block), math.prod(blocks)),), _attrs(attrs), extras)


@st.composite
def rotary_cases(draw: st.DrawFn) -> Case:
    """RotaryEmbedding on ``[B, H, S, D]`` or ``[B, S, H * D]`` (num_heads): a full or partial
    rotary dimension, interleaved or not, caches indexed by position_ids or per token."""
    batch, heads, seq = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 3))
    head = 2 * draw(st.integers(1, 3))
    rotary = 2 * draw(st.integers(1, head // 2))
    attrs: dict[str, Any] = {}
    _optional(draw, attrs, "interleaved", draw(st.integers(0, 1)), 0)
    if rotary != head or draw(st.booleans()):
        attrs["rotary_embedding_dim"] = rotary
    x: tuple[int, ...] = (batch, heads, seq, head)
    if draw(st.booleans()):
        x = (batch, seq, heads * head)
        attrs["num_heads"] = heads
    extras: tuple[Extra, ...] = ()
    if draw(st.booleans()):
        positions = draw(st.integers(seq, seq + 2))
        cache: tuple[int, ...] = (positions, rotary // 2)
        ids = tuple(tuple(draw(st.integers(0, positions - 1)) for _ in range(seq)) for _ in range(batch))
        extras = (Extra(3, ids, fed=draw(st.booleans())),)
    else:
        cache = (batch, seq, rotary // 2)
    return Case((x, cache, cache), _attrs(attrs), extras)


@st.composite
def affine_grid_cases(draw: st.DrawFn) -> Case:
    """theta ``[N, 2, 3]`` or ``[N, 3, 4]``, the output size as an initializer or a graph input."""
    k = draw(st.integers(2, 3))
    batch = draw(st.integers(1, 2))
    align = draw(st.integers(0, 1))
    spatial = tuple(draw(st.integers(1 + align, 4)) for _ in range(k))
    attrs: dict[str, Any] = {}
    _optional(draw, attrs, "align_corners", align, 0)
    size = Extra(1, (batch, draw(st.integers(1, 2)), *spatial), fed=draw(st.booleans()))
    return Case(((batch, k, k + 1),), _attrs(attrs), (size,))


def _pixel(u: np.ndarray, size: int, align: int) -> np.ndarray:
    """GridSample's pixel coordinate of the normalized ``u`` along an axis of ``size``."""
    return (u + 1) / 2 * (size - 1) if align else ((u + 1) * size - 1) / 2


@st.composite
def grid_sample_cases(
    draw: st.DrawFn, modes: Sequence[str], paddings: Sequence[str], dims: Sequence[int], size: int | None
) -> Case:
    """X ``[N, C, *S]`` (2 or 3 spatial axes, each of ``size`` or drawn) and a grid ``[N, *O, n]``;
    mode, padding_mode, align_corners."""
    n = draw(st.sampled_from(list(dims)))
    batch, channels = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    spatial = tuple(size if size is not None else draw(st.integers(1, 4)) for _ in range(n))
    out = tuple(draw(st.integers(1, 3)) for _ in range(n))
    attrs: dict[str, Any] = {}
    default = "bilinear" if {"bilinear", "bicubic"} & set(modes) else "linear"  # opsets 16-19 name it bilinear
    _optional(draw, attrs, "mode", draw(st.sampled_from(list(modes))), default)
    _optional(draw, attrs, "padding_mode", draw(st.sampled_from(list(paddings))), "zeros")
    _optional(draw, attrs, "align_corners", draw(st.integers(0, 1)), 0)
    return Case(((batch, channels, *spatial), (batch, *out, n)), _attrs(attrs))


def _grid_off_kinks(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
    """Every pixel coordinate is 1e-4 away from a multiple of 0.5, where floor, round, the clamps
    and the reflections bend the function (float64 finite differences step 1e-6)."""
    x, grid = arrays[:2]
    for k in range(grid.shape[-1]):  # component k indexes axis -1 - k of x
        c = _pixel(grid[..., k].astype(np.float64), x.shape[-1 - k], attrs.get("align_corners", 0))
        if np.any(np.abs(2 * c - np.round(2 * c)) < 2e-4):
            return False
    return True


def _reflectable(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
    """No spatial axis of size 1 under reflection with align_corners (its border range is empty)."""
    reflecting = attrs.get("padding_mode") == "reflection" and attrs.get("align_corners", 0)
    return not reflecting or min(arrays[0].shape[2:]) > 1


def _grid_kinks(size: int, reach: float = 3.0):
    """The normalized coordinates of the kinks (pixel coordinates at multiples of 0.5) for spatial
    axes all of ``size`` and grid values in ``[-reach, reach]``: float32 specs stay away from them."""

    def kinks(attrs: Mapping[str, Any]) -> tuple[float, ...]:
        align = attrs.get("align_corners", 0)
        span = math.ceil(reach * size) + 1
        pixels = np.arange(-2 * span, 2 * span + 1) / 2
        u = 2 * pixels / (size - 1) - 1 if align else (2 * pixels + 1) / size - 1
        return tuple(float(v) for v in u if abs(v) <= reach)

    return kinks


@st.composite
def roi_align_cases(draw: st.DrawFn, opset: int, dtype: Any) -> Case:
    """X ``[N, C, H, W]``, RoIs ``[R, 4]`` (partly outside the image, some degenerate) and their
    batch indices (initializers or graph inputs); mode, output size, sampling_ratio, spatial_scale
    and (from opset 16) coordinate_transformation_mode."""
    batch, channels = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    height, width = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    count = draw(st.integers(1, 3))
    scale = draw(st.sampled_from([1.0, 0.5]))
    coordinate = st.floats(-1.5, 5.0).map(lambda v: round(v, 2))
    rois = []
    for _ in range(count):
        x1, y1 = draw(coordinate), draw(coordinate)
        w, h = draw(st.floats(0.0, 4.0)), draw(st.floats(0.0, 4.0))
        rois.append(tuple(round(v / scale, 2) for v in (x1, y1, x1 + w, y1 + h)))
    attrs: dict[str, Any] = {}
    _optional(draw, attrs, "mode", draw(st.sampled_from(["avg", "max"])), "avg")
    _optional(draw, attrs, "output_height", draw(st.integers(1, 3)), 1)
    _optional(draw, attrs, "output_width", draw(st.integers(1, 3)), 1)
    _optional(draw, attrs, "sampling_ratio", draw(st.integers(0, 2)), 0)
    _optional(draw, attrs, "spatial_scale", scale, 1.0)
    if opset >= 16:
        modes = ["half_pixel", "output_half_pixel"]
        _optional(draw, attrs, "coordinate_transformation_mode", draw(st.sampled_from(modes)), "half_pixel")
    indices = tuple(draw(st.integers(0, batch - 1)) for _ in range(count))
    extras = (
        Extra(1, tuple(rois), fed=draw(st.booleans()), dtype=dtype),
        Extra(2, indices, fed=draw(st.booleans())),
    )
    return Case(((batch, channels, height, width),), _attrs(attrs), extras)


@st.composite
def max_roi_pool_cases(draw: st.DrawFn) -> Case:
    """X ``[N, C, H, W]`` and RoIs ``[R, 5]`` (batch index, x1, y1, x2, y2; partly outside the
    image, some smaller than a bin) as an initializer or a graph input; pooled_shape, spatial_scale."""
    batch, channels = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    height, width = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    scale = draw(st.sampled_from([1.0, 0.5]))
    rois = []
    for _ in range(draw(st.integers(1, 3))):
        x1, y1 = draw(st.integers(-1, width)), draw(st.integers(-1, height))
        x2, y2 = x1 + draw(st.integers(-1, width)), y1 + draw(st.integers(-1, height))
        rois.append((float(draw(st.integers(0, batch - 1))), *(v / scale + 0.2 for v in (x1, y1, x2, y2))))
    attrs: dict[str, Any] = {"pooled_shape": [draw(st.integers(1, 3)), draw(st.integers(1, 3))]}
    _optional(draw, attrs, "spatial_scale", scale, 1.0)
    extras = (Extra(1, tuple(rois), fed=draw(st.booleans()), dtype=np.float32),)
    return Case(((batch, channels, height, width),), _attrs(attrs), extras)


def _no_ties_per_image(gap: float):
    """A ``valid`` check: within each image ``x[n, c]``, values differ pairwise by more than ``gap``."""

    def valid(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
        x = arrays[0].astype(np.float64)
        values = np.sort(x.reshape(x.shape[0] * x.shape[1], -1), axis=-1)
        return bool(np.all(np.diff(values, axis=-1) > gap))

    return valid


@st.composite
def attention_cases(
    draw: st.DrawFn,
    rank: int,
    mask: str | None = None,
    past: bool = False,
    opset: int = 23,
    nonpad: str | None = None,
) -> Case:
    """Q, K, V as ``[B, H, S, D]`` (rank 4) or ``[B, S, H * D]`` (rank 3, q_num_heads / kv_num_heads),
    grouped query heads, cross attention, a bool or float mask broadcasting to ``[B, Hq, Sq, Sk]``
    (from opset 24 maybe shorter than Sk), a KV cache (past_key / past_value; the present outputs
    in the loss or not); is_causal, scale, softcap; nonpad_kv_seqlen (opset 24, never leaving a
    query without keys; ``nonpad="onnxruntime"`` keeps to what onnxruntime computes as onnx does),
    sliding windows (opset 25)."""
    batch, kv_heads, group = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    heads = kv_heads * group
    sq, sk = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    depth, v_depth = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    n_past = draw(st.integers(1, 2)) if past else 0
    attrs: dict[str, Any] = {}
    _optional(draw, attrs, "is_causal", draw(st.integers(0, 1)), 0)
    if draw(st.booleans()):
        attrs["scale"] = draw(st.sampled_from([0.3, 1.0]))
    if draw(st.booleans()):
        attrs["softcap"] = draw(st.sampled_from([0.5, 2.0]))
    if rank == 3:
        attrs["q_num_heads"], attrs["kv_num_heads"] = heads, kv_heads
        shapes = [(batch, sq, heads * depth), (batch, sk, kv_heads * depth), (batch, sk, kv_heads * v_depth)]
    else:
        shapes = [(batch, heads, sq, depth), (batch, kv_heads, sk, depth), (batch, kv_heads, sk, v_depth)]
    total = sk + n_past
    if mask is not None:
        full = (batch, heads, sq, total)
        # the query axis in full: onnxruntime does not broadcast it, onnx.reference mis-aligns is_causal
        keep = [draw(st.booleans()), draw(st.booleans()), True, draw(st.booleans())]
        shape = tuple(d if k else 1 for d, k in zip(full, keep, strict=True))[draw(st.integers(0, 2)) :]
        shorter = opset >= 24 and total > 1 and draw(st.booleans())  # -inf (False) beyond the mask
        shapes.append((*shape[:-1], total - 1 if shorter else total))
    extras: tuple[Extra, ...] = ()
    if past:
        shapes += [(batch, kv_heads, n_past, depth), (batch, kv_heads, n_past, v_depth)]
    if nonpad:  # causal rows see keys j <= i + length - Sq: every row keeps one when length >= Sq
        low = sq if attrs.get("is_causal") else 1
        if low > sk:
            attrs.pop("is_causal")
            low = 1
        # onnxruntime 1.31 aligns causal masks top-left (offset 0) whatever the lengths
        high = low if attrs.get("is_causal") and nonpad == "onnxruntime" else sk
        lengths = tuple(draw(st.integers(low, high)) for _ in range(batch))
        extras = (Extra(6, lengths, fed=draw(st.booleans())),)
    if opset >= 25:
        _optional(draw, attrs, "left_window_size", draw(st.integers(-1, 2)), -1)
        _optional(draw, attrs, "right_window_size", draw(st.integers(-1, 2)), -1)
    n_outputs, used = 1, (0,)
    if past:
        n_outputs = 3
        used = draw(st.sampled_from([(0,), (0, 1, 2), (0, 2), (1,)]))
    return Case(tuple(shapes), _attrs(attrs), extras, used_outputs=used, n_outputs=n_outputs)


def _every_query_attends(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
    """A ``valid`` check: the bool mask (input 3) and is_causal leave every query a key.

    onnxruntime 1.31 returns NaN for a fully masked row, where onnx (and the rule) give zeros.
    """
    mask = np.asarray(arrays[3], dtype=bool)
    sq, total = arrays[0].shape[-2], arrays[1].shape[-2]  # rank 4: [B, H, S, D]
    mask = np.concatenate([mask, np.zeros((*mask.shape[:-1], total - mask.shape[-1]), bool)], axis=-1)
    if attrs.get("is_causal", 0):
        mask = mask & np.tri(sq, total, dtype=bool)
    return bool(np.all(np.any(mask, axis=-1)))


_QKV = (Arg(), Arg(), Arg())
_BOOL = Arg("bool", diff=False, dtype=np.bool_)


# ---------------------------------------------------------------------- the table

SPECS: list[Spec] = [
    # softmax
    Spec("Softmax", (Arg("real2"),), axis_cases(), 13, variant="opset13"),
    Spec("Softmax", (Arg("real2"),), axis_cases()),
    Spec("LogSoftmax", (Arg("real2"),), axis_cases()),
    # loss operators
    *loss_specs("SoftmaxCrossEntropyLoss", log_prob=True),
    *loss_specs("NegativeLogLikelihoodLoss", log_prob=False),
    # convolutions
    Spec("Conv", (Arg(), Arg(), Arg()), conv_cases(bias=True), dtype=_F32),
    Spec("Conv", (Arg(), Arg()), conv_cases(bias=False), dtype=_F32, variant="no-bias"),
    Spec("ConvTranspose", (Arg(), Arg(), Arg()), conv_transpose_cases(bias=True), dtype=_F32),
    Spec("ConvTranspose", (Arg(), Arg()), conv_transpose_cases(bias=False), dtype=_F32, variant="no-bias"),
    # pooling
    Spec("MaxPool", (Arg(),), pool_cases("MaxPool", 17), valid=_no_ties(1e-5)),
    Spec("MaxPool", (Arg(),), pool_cases("MaxPool", 13), 13, valid=_no_ties(1e-5), variant="opset13"),
    Spec("AveragePool", (Arg(),), pool_cases("AveragePool", 17), dtype=_F32),
    Spec("AveragePool", (Arg(),), pool_cases("AveragePool", 19), 19, dtype=_F32, variant="opset19-dilations"),
    Spec("AveragePool", (Arg(),), oversized_pool_cases("AveragePool", 17), dtype=_F32, variant="kernel-past-input"),
    Spec("GlobalAveragePool", (Arg(),), spatial_shapes(), dtype=_F32),
    Spec("GlobalMaxPool", (Arg("real2"),), spatial_shapes(), dtype=_F32, valid=_distinct_maxima),
    # normalizations
    *(batch_norm_spec(opset, training) for opset in (13, 15) for training in (False, True)),
    Spec("LayerNormalization", (Arg(), Arg(), Arg()), layer_norm_cases(True, [(0,)])),
    Spec("LayerNormalization", (Arg(), Arg()), layer_norm_cases(False, [(0,)]), variant="no-bias"),
    Spec(
        "LayerNormalization",
        (Arg(), Arg(), Arg()),
        layer_norm_cases(True, [(0, 1, 2), (1,), (2,), (0, 2)]),
        dtype=_F32,
        valid=_layer_spread,
        variant="mean-invstddev-outputs",
    ),
    Spec("InstanceNormalization", (Arg(), Arg(), Arg()), instance_norm_cases(), dtype=_F32, valid=_spread(None)),
    # onnxruntime computes GroupNormalization in float32 even for double inputs; the onnx
    # checker rejects opset 18's (deprecated) form: it is checked in test_nn.py
    Spec("GroupNormalization", (Arg(), Arg(), Arg()), group_norm_cases(21), 21, dtype=_F32, valid=_group_spread),
    Spec("LpNormalization", (Arg("nonzero"),), lp_cases(), kinks=lambda attrs: (0.0,)),
    # dropout: finite differences hold only with the mask all true (ratio 0) or in inference mode
    Spec("Dropout", (Arg(), _RATIO_0, _TRUE), dropout_cases(), variant="training-ratio0"),
    Spec(
        "Dropout",
        (Arg(),),
        dropout_cases((Extra(1, 0.0, dtype=np.float64), Extra(2, True, dtype=np.bool_))),
        variant="training-constant",
    ),
    Spec("Dropout", (Arg(), Arg((0.1, 0.9), diff=False, shape=()), _FALSE), dropout_cases(), variant="inference"),
    Spec("Dropout", (Arg(), Arg((0.1, 0.9), diff=False, shape=())), dropout_cases(), variant="no-training-mode"),
    Spec("Dropout", (Arg(),), dropout_cases(), variant="data-only"),
]


def _lp_pool_spec(cases: st.SearchStrategy[Case], opset: int, variant: str = "") -> Spec:
    """LpPool in float32, its input away from 0 (|x|^p's kink)."""
    return Spec("LpPool", (Arg("nonzero"),), cases, opset, dtype=_F32, kinks=lambda attrs: (0.0,), variant=variant)


# -- more operators: onnxruntime runs LpPool, GlobalLpPool, LRN, MeanVarianceNormalization,
# MaxUnpool, Col2Im and RotaryEmbedding in float32 only, GlobalLpPool only up to opset 21
SPECS += [
    Spec("GlobalLpPool", (Arg("nonzero"),), global_lp_cases(), 21, dtype=_F32, kinks=lambda attrs: (0.0,)),
    _lp_pool_spec(pool_cases("LpPool", 22), 22),
    _lp_pool_spec(oversized_pool_cases("LpPool", 22), 22, variant="kernel-past-input"),
    _lp_pool_spec(pool_cases("LpPool", 13), 13, variant="opset13"),
    Spec("MeanVarianceNormalization", (Arg(),), mvn_cases(), 13, dtype=_F32, valid=_mvn_spread, variant="opset13"),
    Spec("MeanVarianceNormalization", (Arg(),), mvn_cases(), 18, dtype=_F32, valid=_mvn_spread, variant="opset18"),
    Spec("LRN", (Arg("real2"),), lrn_cases(), 13, dtype=_F32),
    Spec("RMSNormalization", (Arg(), Arg()), rms_norm_cases(TensorProto.DOUBLE), 23, variant="double-stash"),
    Spec("RMSNormalization", (Arg(), Arg()), rms_norm_cases(None), 23, dtype=_F32, valid=_rms_spread, variant="float"),
    Spec("MaxUnpool", (Arg(),), max_unpool_cases(), 22, dtype=_F32),
    Spec("MaxUnpool", (Arg(),), max_unpool_cases(), 13, dtype=_F32, variant="opset13"),
    Spec("Col2Im", (Arg(),), col2im_cases(ort_only=True), 18, dtype=_F32),
    ReferenceSpec("Col2Im", (Arg(),), col2im_cases(ort_only=False), 18, variant="double-reference"),
    Spec("RotaryEmbedding", (Arg(), Arg(diff=False), Arg(diff=False)), rotary_cases(), 23, dtype=_F32),
    Spec("AffineGrid", (Arg(),), affine_grid_cases(), 20),
    # GridSample: float64 from opset 20. onnxruntime reflects coordinates in float32, so the
    # reflection specs run in float32, with spatial sizes of 3 so that the kinks are known.
    Spec(
        "GridSample",
        (Arg(), Arg((-1.3, 1.3))),
        grid_sample_cases(["linear", "nearest"], ["zeros", "border"], (2, 3), None),
        22,
        valid=_grid_off_kinks,
    ),
    Spec(
        "GridSample",
        (Arg(), Arg((-2.5, 2.5))),
        grid_sample_cases(["linear", "nearest"], ["reflection"], (2, 3), 3),
        22,
        dtype=_F32,
        kinks=_grid_kinks(3, 2.5),
        variant="reflection",
    ),
    Spec(
        "GridSample",
        (Arg(), Arg((-1.8, 1.8))),
        grid_sample_cases(["bilinear", "nearest"], ["zeros", "border", "reflection"], (2,), 3),
        16,
        dtype=_F32,
        kinks=_grid_kinks(3, 1.8),
        variant="opset16",
    ),
    # bicubic (4-D only in onnxruntime): C1 in the grid, so float64 needs no kinks avoided
    Spec(
        "GridSample",
        (Arg(), Arg((-1.5, 1.5))),
        grid_sample_cases(["cubic"], ["zeros", "border", "reflection"], (2,), None),
        22,
        valid=_reflectable,
        variant="cubic",
    ),
    Spec(
        "GridSample",
        (Arg(), Arg((-1.5, 1.5))),
        grid_sample_cases(["bicubic"], ["zeros", "border", "reflection"], (2,), 3),
        16,
        dtype=_F32,  # no double kernel before opset 20
        kinks=_grid_kinks(3, 1.5),
        variant="bicubic-opset16",
    ),
    # RoiAlign: the gradient for X (rois and batch_indices are drawn constants or graph inputs)
    Spec("RoiAlign", (Arg(),), roi_align_cases(21, np.float64), 21),
    Spec("RoiAlign", (Arg(),), roi_align_cases(13, np.float64), 13, variant="opset13"),
    # MaxRoiPool: float32 only, up to opset 21; ScatterElements with reduction from opset 16
    *(
        Spec(
            "MaxRoiPool",
            (Arg((-8.0, 8.0)),),
            max_roi_pool_cases(),
            opset,
            dtype=_F32,
            valid=_no_ties_per_image(0.05),
            variant=f"opset{opset}",
        )
        for opset in (13, 21)
    ),
    # Attention. onnxruntime 1.31: NaN rows where every key is masked (onnx: zeros); no double
    # kernel for a float mask with is_causal; no sliding windows (opset 25). onnx infers a 3-D
    # output's last dimension as 0 when V's is symbolic: 3-D specs declare static shapes.
    NNSpec("Attention", _QKV, attention_cases(4), 23, variant="4d"),
    NNSpec("Attention", _QKV, attention_cases(3), 23, variant="3d", dim_modes=("static",)),
    NNSpec(
        "Attention", (*_QKV, _BOOL), attention_cases(4, "bool"), 23, valid=_every_query_attends, variant="bool-mask"
    ),
    NNSpec("Attention", (*_QKV, Arg()), attention_cases(4, "float"), 23, dtype=_F32, variant="float-mask"),
    NNSpec(
        "Attention",
        (*_QKV, Arg(), Arg()),
        attention_cases(4, past=True),
        23,
        wiring=(0, 1, 2, None, 3, 4),
        variant="past",
    ),
    NNSpec(
        "Attention",
        (*_QKV, Arg(), Arg()),
        attention_cases(3, past=True),
        23,
        wiring=(0, 1, 2, None, 3, 4),
        variant="3d-past",
        dim_modes=("static",),
    ),
    NNSpec("Attention", _QKV, attention_cases(4, opset=24, nonpad="onnxruntime"), 24, variant="opset24-nonpad"),
    ReferenceSpec(
        "Attention",
        (*_QKV, Arg(), Arg(), Arg()),
        attention_cases(3, "float", past=True),
        23,
        variant="3d-float-mask-past-reference",
        dim_modes=("static",),
    ),
    ReferenceSpec(
        "Attention",
        (*_QKV, _BOOL),
        attention_cases(4, "bool", opset=24, nonpad="any"),
        24,
        variant="bool-mask-reference",
    ),
    ReferenceSpec("Attention", _QKV, attention_cases(4, opset=25), 25, variant="opset25-windows-reference"),
    ReferenceSpec("RoiAlign", (Arg(),), roi_align_cases(22, np.float64), 22, variant="opset22-reference"),
]

#: The pytest ids of the specs above, which must be unique.
IDS = [spec.id for spec in SPECS]
assert len(IDS) == len(set(IDS)), [i for i in IDS if IDS.count(i) > 1]
