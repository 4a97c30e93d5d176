"""``ClipGradNorm`` of every ``norm_type`` and ``ClipGradValue``: on a list of gradients and on one sequence of
them, in float16, float32 and float64, against :mod:`onnxtrain.optim.reference`; refused by ONNX Runtime's
on-device interface, which clips the L2 norm only."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from onnxtrain.graph import empty_base, tensor_type
from onnxtrain.onnxblock import optim as ort_optim
from onnxtrain.optim import AdamW, ClipGradNorm, ClipGradValue, reference
from onnxtrain.optim.clip import GradientClipping
from onnxtrain.optim.ort_nodes import ort_node
from tests.optim.runner import Clipped, clipped_in_onnx

CLIPS = [
    ClipGradNorm(0.5),
    ClipGradNorm(0.5, norm_type=1.0),
    ClipGradNorm(0.5, norm_type=3.0),
    ClipGradNorm(0.5, norm_type=math.inf),
    ClipGradValue(0.2),
]
TOLERANCE = {np.float16: {"rtol": 2e-3, "atol": 1e-4}, np.float32: {"rtol": 1e-5, "atol": 1e-7},
             np.float64: {"rtol": 1e-12, "atol": 0}}  # fmt: skip


class _OnSequence(Clipped):
    """The clipping on one sequence of the gradients, unpacked again."""

    def build(self, names: list[str]) -> list[str]:
        packed = self.builder.add_node1("SequenceConstruct", names, hint="gradients")
        clipped = self.clip(packed)
        return [self.builder.add_node1("SequenceAt", [clipped, self.builder.add_initializer(np.array(i), "i")])
                for i in range(len(names))]  # fmt: skip


def _grads(dtype: type, seed: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {"w": (3, 4), "b": (5,), "empty": (0, 2), "s": ()}
    return {name: np.asarray(scale * rng.standard_normal(shape)).astype(dtype) for name, shape in shapes.items()}


def _reference(clip: GradientClipping, grads: list[np.ndarray]) -> list[np.ndarray]:
    if isinstance(clip, ClipGradNorm):
        return reference.clip_grad_norm(grads, clip.max_norm, clip.norm_type)
    return reference.clip_grad_value(grads, clip.clip_value)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("clip", CLIPS, ids=repr)
def test_each_clipping_on_a_list_and_on_a_sequence_is_the_reference(clip: GradientClipping, dtype: type) -> None:
    grads = _grads(dtype, seed=3)
    expected = _reference(clip, list(grads.values()))
    assert any(not np.array_equal(e, g) for e, g in zip(expected, grads.values(), strict=True))  # it clips
    for form in (Clipped, _OnSequence):
        got = clipped_in_onnx(form(clip), grads)
        for name, value, want in zip(grads, got, expected, strict=True):
            assert value.dtype == want.dtype and value.shape == want.shape
            np.testing.assert_allclose(value, want, **TOLERANCE[dtype], err_msg=f"{form.__name__} {name}")


@given(
    norm_type=st.sampled_from([1.0, 1.5, 2.0, 4.0, math.inf]),
    max_norm=st.floats(0.01, 100.0),
    scale=st.floats(1e-3, 1e3),
    seed=st.integers(0, 2**16),
)
def test_clip_grad_norm_is_the_reference_whatever_the_norm(
    norm_type: float, max_norm: float, scale: float, seed: int
) -> None:
    grads = _grads(np.float64, seed, scale)
    clip = ClipGradNorm(max_norm, norm_type)
    for value, want in zip(clipped_in_onnx(Clipped(clip), grads), _reference(clip, list(grads.values())), strict=True):
        np.testing.assert_allclose(value, want, rtol=1e-12, atol=0)


def test_onnx_runtimes_interface_refuses_all_but_the_l2_norm() -> None:
    assert ort_node(AdamW(clip_grad=ClipGradNorm(1.0))) is not None
    for clip in (ClipGradNorm(1.0, norm_type=math.inf), ClipGradValue(0.5)):
        with pytest.raises(ValueError, match="clips the gradients' L2 norm only"):
            ort_node(AdamW(clip_grad=clip))
    with empty_base() as base:
        base.add_input("w", tensor_type(onnx.TensorProto.FLOAT, [2]))
        with pytest.raises(ValueError, match="L2 norm only"):
            ort_optim.AdamW(clip_grad=ClipGradNorm(1.0, norm_type=1.0))  # type: ignore[arg-type]
