"""Fourier transforms: DFT and STFT (the window functions take only an integer size).

DFT and STFT are linear, ``y = W x``: the gradient is the adjoint ``W^H g``,
itself a DFT (``L`` times the inverse DFT of ``g``, or the forward DFT over
``L`` for an inverse transform), with a one-sided ``g`` zero-padded to all
``L`` bins first and ``x``'s cut or padding to ``dft_length`` undone after.
"""

from __future__ import annotations

import numpy as np

from onnxtrain.autodiff import dims
from onnxtrain.autodiff.context import RuleContext
from onnxtrain.autodiff.registry import Grads, Result
from onnxtrain.autodiff.rules._builtin import registry
from onnxtrain.autodiff.rules.backward_helpers import scatter_add_rows
from onnxtrain.graph import ops


def _fit_axis(ctx: RuleContext, h: str, axis: int, rank: int, length: str | int, target: str | int) -> str:
    """``h`` (of ``length`` along ``axis``) cut or zero-padded at the end to ``target`` along ``axis``."""
    if isinstance(length, int) and isinstance(target, int):
        if length > target:
            return ctx.op("Slice", h, ctx.int64s([0]), ctx.int64s([target]), ctx.int64s([axis]))
        return _pad_axis(ctx, h, axis, rank, target - length) if length < target else h
    cut = ctx.op(
        "Slice",
        h,
        ctx.int64s([0]),
        ctx.op("Reshape", dims.int64_scalar(ctx, target), ctx.int64s([1])),
        ctx.int64s([axis]),
    )
    missing = ctx.op(
        "Max", ctx.op("Sub", dims.int64_scalar(ctx, target), dims.int64_scalar(ctx, length)), dims.int64_scalar(ctx, 0)
    )
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
    shape = ctx.shape(value)
    if shape is not None and isinstance(shape[axis], int):
        return int(shape[axis])
    return dims.dim_tensor(ctx, value, axis)


def _scaled(ctx: RuleContext, h: str, length: str | int, power: int) -> str:
    """``h * length**power`` (``power`` is 1 or -1)."""
    if isinstance(length, int):
        return ctx.mul(h, float(length) ** power)
    factor = ctx.cast_like(length, h)
    return ctx.mul(h, factor) if power == 1 else ctx.div(h, factor)


def _transform(ctx: RuleContext, h: str, axis: int, inverse: int) -> str:
    """The (full, complex) DFT of ``h`` along ``axis``, or its inverse; in the opset's form."""
    if ops.dft_axis_as_input(ctx.opset):
        return ctx.op("DFT", h, "", dims.int64_scalar(ctx, axis), inverse=inverse)
    return ctx.op("DFT", h, inverse=inverse, axis=axis)


def _dft_axis(ctx: RuleContext, rank: int) -> int:
    """The DFT's axis in ``[0, rank - 2]``: the attribute (opset 17-19, default 1) or the constant input (-2)."""
    if not ops.dft_axis_as_input(ctx.opset):
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
                ctx.op("Reshape", dims.int64_scalar(ctx, n), ctx.int64s([1])),
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
    if isinstance(bins, int) and isinstance(length, int) and dims.is_small(bins):
        weights = [1.0 + float(0 < j <= length - bins) for j in range(bins)]
        return ctx.const(np.array(weights).reshape([bins, *tail]), like)
    j = dims.int64_range(ctx, dims.int64_scalar(ctx, bins))
    last = ctx.op("Sub", dims.int64_scalar(ctx, length), dims.int64_scalar(ctx, bins))
    mirrored = ctx.op("And", ctx.op("Greater", j, dims.int64_scalar(ctx, 0)), ctx.op("LessOrEqual", j, last))
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
        length = int(known) if known is not None else dims.int64_scalar(ctx, ctx.inputs[3])
    else:
        length = _axis_length(ctx, signal, 1)
    if int(ctx.attr("onesided", 1)):  # L // 2 + 1 bins (onnx's shape inference takes onesided=0 by default)
        bins = (
            length // 2 + 1
            if isinstance(length, int)
            else ctx.op("Add", ctx.op("Div", length, dims.int64_scalar(ctx, 2)), dims.int64_scalar(ctx, 1))
        )
        g = _fit_axis(ctx, g, 2, 4, bins, length)
    back = _transform(ctx, g, 2, inverse=1)
    channels = _axis_length(ctx, signal, 2)
    end = ctx.int64s([channels]) if isinstance(channels, int) else ctx.op("Reshape", channels, ctx.int64s([1]))
    spectrum = ctx.op("Slice", _scaled(ctx, back, length, 1), ctx.int64s([0]), end, ctx.int64s([3]))  # [B, F, L, C]
    frames = _axis_length(ctx, ctx.outputs[0], 1)
    starts = ctx.op("Mul", dims.int64_range(ctx, dims.int64_scalar(ctx, frames)), dims.int64_scalar(ctx, step))
    positions = ctx.op(
        "Add", ctx.op("Unsqueeze", starts, ctx.int64s([1])), dims.int64_range(ctx, dims.int64_scalar(ctx, length))
    )  # [F, L]
    dsignal = dwindow = None
    if ctx.needs(0):
        weighted = spectrum if window is None else ctx.mul(spectrum, ctx.op("Reshape", window, ctx.int64s([-1, 1])))
        moved = ctx.op("Transpose", weighted, perm=[1, 2, 0, 3])  # [F, L, B, C]
        samples = dims.dim_tensor(ctx, signal, 1)
        added = scatter_add_rows(ctx, positions, moved, samples, signal)  # [T, B, C], the frames overlapping
        dsignal = ctx.op("Transpose", added, perm=[1, 0, 2])
    if window is not None and ctx.needs(2):
        pieces = ctx.op("Gather", signal, positions, axis=1)  # [B, F, L, C]
        dwindow = ctx.op("ReduceSum", ctx.mul(pieces, spectrum), ctx.int64s([0, 1, 3]), keepdims=0)
    return [dsignal, None, dwindow, None][: len(ctx.inputs)]


# Window functions take only an integer size.
registry.non_differentiable("HannWindow", "HammingWindow", "BlackmanWindow")
