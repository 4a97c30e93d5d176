"""Each optimizer model against the NumPy reference: 20 steps on random parameters and gradients.

Hypothesis draws the parameter shapes and dtypes (float32 and float64, mixed
in one model), the hyper-parameters, weight decay and clipping.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from onnxtrain.optim import SGD, Adagrad, Adam, AdamW, ClipGradNorm, ClipGradValue, Optimizer, RMSprop
from onnxtrain.optim.clip import GradientClipping
from tests.optim.runner import (
    assert_trajectories_close,
    learning_rates,
    onnx_trajectory,
    random_problem,
    reference_trajectory,
)

STEPS = 20

shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)
dtypes = st.sampled_from([np.dtype(np.float32), np.dtype(np.float64)])
parameter_sets = st.dictionaries(
    st.sampled_from(["w", "b", "layer.weight", "emb/table", "scale"]),
    st.tuples(shapes, dtypes),
    min_size=1,
    max_size=3,
)
#: No clipping, the L2 norm, the other norms torch's clip_grad_norm_ takes, and clip_grad_value_'s bound.
clips = st.one_of(
    st.none(),
    st.floats(0.1, 10.0).map(ClipGradNorm),
    st.builds(ClipGradNorm, st.floats(0.1, 10.0), st.sampled_from([1.0, 3.0, math.inf])),
    st.floats(0.01, 1.0).map(ClipGradValue),
)
weight_decays = st.one_of(st.just(0.0), st.floats(1e-4, 0.1))
unit = st.floats(0.0, 0.99)


@st.composite
def sgds(draw: st.DrawFn) -> SGD:
    momentum = draw(st.one_of(st.just(0.0), st.floats(0.1, 0.95)))
    nesterov = momentum > 0 and draw(st.booleans())
    dampening = 0.0 if nesterov else draw(st.one_of(st.just(0.0), st.floats(0.0, 0.5)))
    decay, clip = draw(weight_decays), draw(clips)
    return SGD(momentum=momentum, dampening=dampening, nesterov=nesterov, weight_decay=decay, clip_grad=clip)


@st.composite
def adams(draw: st.DrawFn) -> Adam:
    betas = (draw(unit), draw(st.floats(0.5, 0.9999)))
    eps = draw(st.sampled_from([1e-8, 1e-6, 1e-3]))
    return Adam(
        betas=betas, eps=eps, weight_decay=draw(weight_decays), bias_correction=draw(st.booleans()),
        amsgrad=draw(st.booleans()), clip_grad=draw(clips),
    )  # fmt: skip


@st.composite
def adamws(draw: st.DrawFn) -> AdamW:
    betas = (draw(unit), draw(st.floats(0.5, 0.9999)))
    eps = draw(st.sampled_from([1e-8, 1e-6, 1e-3]))
    adam_mode = draw(st.sampled_from([0, 1]))  # 1: Hugging Face's math, ONNX Runtime's on-device AdamW
    amsgrad = adam_mode == 0 and draw(st.booleans())
    bias_correction = draw(st.booleans())
    return AdamW(bias_correction, betas, eps, draw(weight_decays), draw(clips), amsgrad=amsgrad, adam_mode=adam_mode)


@st.composite
def adagrads(draw: st.DrawFn) -> Adagrad:
    return Adagrad(
        lr_decay=draw(st.one_of(st.just(0.0), st.floats(1e-3, 0.5))),
        weight_decay=draw(weight_decays),
        initial_accumulator_value=draw(st.one_of(st.just(0.0), st.floats(0.0, 1.0))),
        eps=draw(st.sampled_from([1e-10, 1e-6])),
        clip_grad=draw(clips),
    )


@st.composite
def rmsprops(draw: st.DrawFn) -> RMSprop:
    return RMSprop(
        alpha=draw(st.floats(0.5, 0.999)),
        eps=draw(st.sampled_from([1e-8, 1e-6])),
        weight_decay=draw(weight_decays),
        momentum=draw(st.one_of(st.just(0.0), st.floats(0.1, 0.95))),
        centered=draw(st.booleans()),
        clip_grad=draw(clips),
    )


OPTIMIZERS: dict[str, Callable[[], st.SearchStrategy[Optimizer]]] = {
    "SGD": sgds,
    "Adam": adams,
    "AdamW": adamws,
    "Adagrad": adagrads,
    "RMSprop": rmsprops,
}


def _tolerance(params: dict[str, tuple[tuple[int, ...], np.dtype]]) -> dict[str, float]:
    if any(dtype == np.float32 for _, dtype in params.values()):
        return {"rtol": 2e-5, "atol": 2e-6}
    return {"rtol": 1e-11, "atol": 1e-12}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@given(data=st.data(), params=parameter_sets, lr=st.sampled_from([1e-3, 1e-2, 0.1]), seed=st.integers(0, 2**16))
def test_optimizer_matches_reference(name: str, data: st.DataObject, params, lr: float, seed: int) -> None:
    optimizer = data.draw(OPTIMIZERS[name](), label="optimizer")
    start, grads = random_problem(params, STEPS, seed)
    lrs = learning_rates(lr, STEPS)
    actual = onnx_trajectory(optimizer, start, grads, lrs)
    expected = reference_trajectory(optimizer, start, grads, lrs)
    assert_trajectories_close(actual, expected, **_tolerance(params))


@pytest.mark.parametrize(
    "optimizer",
    [
        SGD(momentum=0.9, dampening=0.1, weight_decay=0.01),
        Adam(weight_decay=0.01, amsgrad=True),
        AdamW(weight_decay=0.01),
        AdamW(weight_decay=0.01, adam_mode=1),
        Adagrad(lr_decay=0.01, initial_accumulator_value=0.1),
        RMSprop(momentum=0.5, centered=True, weight_decay=0.01),
    ],
    ids=repr,
)
@pytest.mark.parametrize(
    "clip",
    [
        None,
        ClipGradNorm(0.5),
        ClipGradNorm(0.5, norm_type=math.inf),
        ClipGradNorm(2.0, norm_type=1.0),
        ClipGradValue(0.1),
    ],
    ids=repr,
)
def test_clipping_and_weight_decay_change_the_trajectory(optimizer: Optimizer, clip: GradientClipping | None) -> None:
    """A fixed case per optimizer: clipping really clips (the norm is over max_norm) and still matches."""
    optimizer = type(optimizer)(**optimizer.hyperparameters(), clip_grad=clip)
    params = {"w": ((3, 4), np.dtype(np.float32)), "b": ((4,), np.dtype(np.float64))}
    start, grads = random_problem(params, STEPS, seed=7, grad_scale=3.0)
    lrs = learning_rates(0.05, STEPS)
    actual = onnx_trajectory(optimizer, start, grads, lrs)
    expected = reference_trajectory(optimizer, start, grads, lrs)
    assert_trajectories_close(actual, expected, rtol=2e-5, atol=2e-6)
    unclipped = reference_trajectory(type(optimizer)(**optimizer.hyperparameters()), start, grads, lrs)
    moved = not np.allclose(unclipped[-1][0]["w"], expected[-1][0]["w"])
    assert moved == (clip is not None)


@pytest.mark.parametrize("make", [lambda: SGD(momentum=0.9), lambda: Adam(), lambda: AdamW(), Adagrad, RMSprop])
def test_float16_parameters_next_to_float32_and_float64(make: Callable[[], Optimizer]) -> None:
    """float16 parameters are updated in float32 and rounded back, as the reference does."""
    optimizer = make()
    params = {
        "h": ((5,), np.dtype(np.float16)),
        "w": ((2, 3), np.dtype(np.float32)),
        "d": ((), np.dtype(np.float64)),
    }
    start, grads = random_problem(params, STEPS, seed=3)
    lrs = learning_rates(0.01, STEPS)
    actual = onnx_trajectory(optimizer, start, grads, lrs)
    expected = reference_trajectory(optimizer, start, grads, lrs)
    assert_trajectories_close(actual, expected, rtol=2e-3, atol=2e-3)
    for params_t, states_t in actual:
        assert params_t["h"].dtype == np.float16 and all(s.dtype == np.float16 for s in states_t["h"])


def test_adamw_mode_1_is_onnx_runtimes_on_device_formula() -> None:
    """``adam_mode=1`` against ONNX Runtime's AdamWOptimizer kernel written out in float64 (bias correction
    on the step size, eps outside the root, weight decay after the update)."""
    b1, b2, eps, wd, lr = 0.8, 0.99, 1e-3, 0.1, 0.05
    rng = np.random.default_rng(3)
    p = rng.normal(size=(3, 2))
    grads = [{"w": rng.normal(size=(3, 2))} for _ in range(STEPS)]
    actual = onnx_trajectory(AdamW(True, (b1, b2), eps, wd, adam_mode=1), {"w": p}, grads, [lr] * STEPS)
    lr = float(np.float32(lr))  # as the model's float32 input holds it
    m = v = np.zeros_like(p)
    for t, step_grads in enumerate(grads, start=1):
        g = step_grads["w"]
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        p = p - lr * np.sqrt(1 - b2**t) / (1 - b1**t) * m / (np.sqrt(v) + eps)
        p = p - lr * wd * p
        np.testing.assert_allclose(actual[t - 1][0]["w"], p, rtol=1e-12)
        np.testing.assert_allclose(actual[t - 1][1]["w"][1], v, rtol=1e-12)


def test_adamw_mode_is_checked() -> None:
    with pytest.raises(ValueError, match="adam_mode must be 0"):
        AdamW(adam_mode=2)
    with pytest.raises(ValueError, match="amsgrad=True needs adam_mode=0"):
        AdamW(amsgrad=True, adam_mode=1)
