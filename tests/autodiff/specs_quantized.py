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
from hypothesis import strategies as st

from tests.autodiff.specs import Arg, Case, Extra, Spec

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


SPECS: list[Spec] = [
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
