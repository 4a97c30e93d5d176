"""Finite-difference specs of the rules in ``onnxtrain/autodiff/rules/quantized.py`` (see ``specs.py``).

``MatMulNBits``' quantized weight, scales and zero points are constant
initializers (:class:`Extra`) drawn per case: random codes packed low bits
first, positive and negative scales, zero points omitted, packed in uint8 or
given as floats (not for 8 bits, which onnxruntime's CPU kernel refuses), the
deprecated ``g_idx`` (with no or float zero points), and
``K`` not always a multiple of the block size (a padded last block). float32:
onnxruntime's kernel is float32 (and float16). onnxruntime 1.23 has no 2-bit
kernel: that spec skips there, saying so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import helper
from onnx.reference.op_run import OpRun

from tests.autodiff.specs import Arg, Case, Extra, Spec, cases

_MS = "com.microsoft"


def nested(array: np.ndarray) -> Any:
    """``array`` as nested tuples (hashable, for :class:`Extra`)."""
    if array.ndim == 0:
        return array.item()
    return tuple(nested(row) for row in array)


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes ``[..., m]`` (``m`` a multiple of ``8 / bits``) packed into uint8 ``[..., m * bits / 8]``, low first."""
    per_byte = 8 // bits
    grouped = codes.astype(np.uint16).reshape(*codes.shape[:-1], -1, per_byte)
    shifts = np.arange(per_byte, dtype=np.uint16) * bits
    return np.sum(grouped << shifts, axis=-1).astype(np.uint8)


@st.composite
def nbits_cases(draw: st.DrawFn, bits: int, with_bias: bool = False, with_g_idx: bool = False) -> Case:
    """``A: [..., K]`` and a drawn quantized ``[N, K]`` weight (inputs 1-3) for MatMulNBits."""
    block = draw(st.sampled_from([16, 32]))
    k = draw(st.integers(1, 2 * block + 3))
    n = draw(st.integers(1, 4))
    lead = draw(st.sampled_from([(2,), (1,), (2, 3)]))
    # onnxruntime's CPU kernel takes no float zero points for 8-bit weights; with g_idx it reads packed
    # zero points otherwise than the operator's documentation says (the rule refuses that combination)
    modes = ["none", "packed"] if bits == 8 else ["none", "float"] if with_g_idx else ["none", "packed", "float"]
    zero_mode = draw(st.sampled_from(modes))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    blocks = -(-k // block)
    codes = rng.integers(0, 1 << bits, size=(n, blocks * block))
    weight = pack(codes, bits).reshape(n, blocks, block * bits // 8)
    scales = (rng.choice([-1.0, 1.0], size=(n, blocks)) * rng.uniform(0.05, 0.3, size=(n, blocks))).astype(np.float32)
    extras = [Extra(1, nested(weight), dtype=np.uint8), Extra(2, nested(scales.reshape(-1)), dtype=np.float32)]
    if zero_mode == "packed":
        per_byte = 8 // bits
        zero = rng.integers(0, 1 << bits, size=(n, -(-blocks // per_byte) * per_byte))
        extras.append(Extra(3, nested(pack(zero, bits).reshape(-1)), dtype=np.uint8))
    elif zero_mode == "float":
        zero = rng.uniform(0, (1 << bits) - 1, size=(n, blocks)).astype(np.float32)
        extras.append(Extra(3, nested(zero.reshape(-1)), dtype=np.float32))
    if with_g_idx:  # the (deprecated) block of each row of K, in place of k // block_size
        extras.append(Extra(4, nested(rng.integers(0, blocks, size=k)), dtype=np.int32))
    attrs = (("K", k), ("N", n), ("bits", bits), ("block_size", block))
    shapes: tuple[tuple[int, ...], ...] = ((*lead, k),)
    if with_bias:
        shapes = (*shapes, (n,))
    return Case(shapes, attrs, tuple(extras))


@dataclass(frozen=True)
class KnownBiasSpec(Spec):
    """A spec with static input shapes only: onnxruntime checks that ``bias`` is ``[N]`` while loading."""

    dim_modes = ("static",)


def _nbits(bits: int) -> Spec:
    return Spec(
        "MatMulNBits",
        (Arg("real"),),
        nbits_cases(bits),
        opset=17,
        dtype=np.float32,
        domain=_MS,
        extra_opsets=((_MS, 1),),
        variant=f"{bits}-bits",
    )


class QuantizeLinear(OpRun):  # onnx.reference finds it by its class name
    """What the straight-through estimator differentiates in place of the rounding: the codes unrounded,
    ``x / s + z`` clipped to ``[qmin - 1/2, qmax + 1/2]`` (per tensor; the codes' range from the zero point's
    type). Paired with :class:`DequantizeLinear`: ``clip(x, (qmin - z - 1/2) s, (qmax - z + 1/2) s)``."""

    op_domain = ""

    def _run(self, x: np.ndarray, scale: np.ndarray, zero: np.ndarray, **_: Any) -> tuple[np.ndarray]:
        codes = np.iinfo(zero.dtype)
        return (np.clip(x / scale + zero.astype(x.dtype), codes.min - 0.5, codes.max + 0.5).astype(x.dtype),)


class DequantizeLinear(OpRun):
    """``(codes - z) * s``, of :class:`QuantizeLinear`'s unrounded codes."""

    op_domain = ""

    def _run(self, codes: np.ndarray, scale: np.ndarray, zero: np.ndarray, **_: Any) -> tuple[np.ndarray]:
        return ((codes - zero.astype(codes.dtype)) * scale,)


@dataclass(frozen=True)
class StraightThroughSpec(Spec):
    """``DequantizeLinear(QuantizeLinear(x, s, z), s, z)``, checked against the clip it rounds: run in
    ``onnx.reference`` with :class:`QuantizeLinear` and :class:`DequantizeLinear` unrounded (the rule's
    rounding decides the same codes in range away from the clip's bounds, :attr:`kinks`)."""

    backend = "onnx.reference"
    reference_ops = (QuantizeLinear, DequantizeLinear)


def _straight_through(scale: float, zero: int, dtype: Any, variant: str) -> Spec:
    codes = np.iinfo(dtype)
    bounds = ((codes.min - zero - 0.5) * scale, (codes.max - zero + 0.5) * scale)

    def before(case: Case) -> list[onnx.NodeProto]:
        return [helper.make_node("QuantizeLinear", ["x0", "extra1", "extra2"], ["codes"])]

    strategy = cases(1).map(
        lambda case: Case(case.shapes, case.attrs, (Extra(1, scale, dtype=np.float32), Extra(2, zero, dtype=dtype)))
    )
    return StraightThroughSpec(
        "DequantizeLinear",
        (Arg("real2"),),  # some of x beyond the range: the clipped codes get no gradient
        strategy,
        opset=19,
        dtype=np.float32,
        wiring=("codes",),
        kinks=lambda attrs: bounds,
        before=before,
        variant=variant,
    )


SPECS: list[Spec] = [
    _straight_through(0.02, 128, np.uint8, "straight-through-uint8"),
    _straight_through(0.015, -20, np.int8, "straight-through-int8"),
    _nbits(4),
    Spec(
        "MatMulNBits",
        (Arg("real"),),
        nbits_cases(4, with_g_idx=True),
        opset=17,
        dtype=np.float32,
        domain=_MS,
        extra_opsets=((_MS, 1),),
        variant="4-bits-g_idx",
    ),
    _nbits(8),
    _nbits(2),
    KnownBiasSpec(
        "MatMulNBits",
        (Arg("real"), Arg("real")),
        nbits_cases(4, with_bias=True),
        opset=17,
        dtype=np.float32,
        domain=_MS,
        wiring=(0, None, None, None, None, 1),
        extra_opsets=((_MS, 1),),
        variant="4-bits-bias",
    ),
]
