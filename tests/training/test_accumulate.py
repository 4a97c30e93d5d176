"""Gradient accumulation with the mean over the group's rows: ``Module.scale_grad`` and ``train_epoch(accumulate=k)``.

``train_epoch`` over batches of 8 accumulated 3 to a step must take the steps
of batches of 24: 45 rows make groups of 8 + 8 + 8 and 8 + 8 + 5 rows, and
one batch of 24 then one of 21. Every parameter, gradient, moment and the
step count are compared, on a float64 model (the sums differ only in their
rounding).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given
from hypothesis import strategies as st

from onnxtrain import optim
from onnxtrain.artifacts import LossType
from onnxtrain.training.gradient_scale import scaling_model
from onnxtrain.training.store import StateTensor
from tests.helpers import DOUBLE
from tests.training import models
from tests.training.helpers import open_module, snapshot

ROWS, BATCH, ACCUMULATE = 45, 8, 3


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A float64 MLP with cross-entropy and AdamW whose gradients are clipped by a norm they pass."""
    model = models.mlp((6, 16, 4), seed=2, elem_type=DOUBLE)
    adamw = optim.AdamW(weight_decay=0.01, clip_grad=optim.ClipGradNorm(0.5))
    return models.generate(tmp_path_factory.mktemp("mlp64"), model, loss=LossType.CrossEntropyLoss, optimizer=adamw)


def _data(rows: int = ROWS) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    return rng.standard_normal((rows, 6)), rng.integers(0, 4, rows).astype(np.int64)


@pytest.mark.parametrize("shuffle", [False, True])
def test_accumulated_batches_take_the_steps_of_batches_as_large_as_their_group(paths, shuffle: bool) -> None:
    x, y = _data()
    state_a, module_a, optimizer_a = open_module(paths)
    state_b, module_b, optimizer_b = open_module(paths)
    for epoch in range(2):
        small = module_a.train_epoch(optimizer_a, x, y, BATCH, shuffle, epoch, accumulate=ACCUMULATE)
        large = module_b.train_epoch(optimizer_b, x, y, BATCH * ACCUMULATE, shuffle, epoch)
        assert small.shape == (6,) and large.shape == (2,)
        # the group's first batches are computed from the same parameters as the large batch: same mean loss
        np.testing.assert_allclose(np.average(small[:3], weights=[8, 8, 8]), large[0], rtol=1e-12)
    assert optimizer_a.step_count == optimizer_b.step_count == 4
    a, b = snapshot(state_a), snapshot(state_b)
    assert sorted(a) == sorted(b) and any(name.startswith("grad ") for name in a)
    for name, value in b.items():
        np.testing.assert_allclose(a[name], value, rtol=1e-9, atol=1e-13, err_msg=name)


def test_accumulation_equals_the_users_loop_with_scale_grad(paths) -> None:
    """``train_epoch(accumulate=3)`` is the loop the docs spell out, weights of the short batch included."""
    x, y = _data(21)  # batches of 8, 8 and 5: one group
    state_a, module_a, optimizer_a = open_module(paths)
    state_b, module_b, optimizer_b = open_module(paths)
    module_a.train_epoch(optimizer_a, x, y, BATCH, accumulate=ACCUMULATE)
    module_b(x[:8], y[:8])
    module_b(x[8:16], y[8:16])
    module_b.scale_grad(8 / 5)  # the sum so far weighted as the 5-row batch will be
    module_b(x[16:], y[16:])
    module_b.scale_grad(5 / 21)
    optimizer_b.step()
    module_b.lazy_reset_grad()
    a, b = snapshot(state_a), snapshot(state_b)
    for name, value in b.items():
        np.testing.assert_array_equal(a[name], value, err_msg=name)


def test_learning_rates_are_given_per_optimizer_step(paths) -> None:
    x, y = _data()
    state_a, module_a, optimizer_a = open_module(paths)
    state_b, module_b, optimizer_b = open_module(paths)
    with pytest.raises(ValueError, match="learning_rates has 6 values; the pass takes 2 optimizer steps"):
        module_a.train_epoch(optimizer_a, x, y, BATCH, learning_rates=np.full(6, 1e-3), accumulate=3)
    module_a.train_epoch(optimizer_a, x, y, BATCH, learning_rates=[1e-2, 3e-3], accumulate=3)
    optimizer_b.set_learning_rate(1e-2)
    module_b.train_epoch(optimizer_b, x[:24], y[:24], 24)
    optimizer_b.set_learning_rate(3e-3)
    module_b.train_epoch(optimizer_b, x[24:], y[24:], 21)
    a, b = snapshot(state_a), snapshot(state_b)
    for name, value in b.items():
        np.testing.assert_allclose(a[name], value, rtol=1e-9, atol=1e-13, err_msg=name)


@pytest.mark.parametrize("accumulate", [0, -2, 1.5, True])
def test_accumulate_is_a_count(paths, accumulate: object) -> None:
    _, module, optimizer = open_module(paths)
    with pytest.raises((TypeError, ValueError), match="accumulate"):
        module.train_epoch(optimizer, *_data(), BATCH, accumulate=accumulate)


def test_scale_grad_scales_the_accumulated_gradients_and_leaves_reset_ones_at_zero(paths) -> None:
    state, module, _ = open_module(paths)
    x, y = _data(16)
    module.scale_grad(3.0)  # nothing computed yet: nothing to scale
    module(x[:8], y[:8])
    module(x[8:], y[8:])
    before = {name: parameter.grad for name, parameter in state.parameters}
    module.scale_grad(0.5)
    for name, parameter in state.parameters:
        np.testing.assert_array_equal(parameter.grad, before[name] * 0.5, err_msg=name)
    module.lazy_reset_grad()
    module.scale_grad(2.0)
    assert all(not parameter.grad.any() for _, parameter in state.parameters)
    for bad, error in ((float("nan"), ValueError), (float("inf"), ValueError), ("2", TypeError), (None, TypeError)):
        with pytest.raises(error, match="scale_grad"):
            module.scale_grad(bad)  # type: ignore[arg-type]


def test_scale_grad_applies_a_recorded_update_with_the_gradients_it_was_recorded_with(paths) -> None:
    """``optimizer.step()`` may leave its update recorded, to run with the next train step: scaling the gradients
    after it must not change the step taken."""
    x, y = _data(16)
    state_a, module_a, optimizer_a = open_module(paths)
    state_b, module_b, optimizer_b = open_module(paths)
    for module, optimizer in ((module_a, optimizer_a), (module_b, optimizer_b)):
        module(x, y)
        optimizer.step()
    module_a.scale_grad(0.25)
    a, b = snapshot(state_a), snapshot(state_b)
    for name, value in b.items():
        expected = value * 0.25 if name.startswith("grad ") else value
        np.testing.assert_array_equal(a[name], expected, err_msg=name)


@given(
    dtype=st.sampled_from([np.float16, np.float32, np.float64]),
    factor=st.floats(-1e3, 1e3, allow_nan=False),
    seed=st.integers(0, 2**16),
)
def test_the_scaling_model_multiplies_each_gradient_as_numpy_does(dtype: type, factor: float, seed: int) -> None:
    """float32 and float64 in their own type; float16 in float32, rounded once."""
    rng = np.random.default_rng(seed)
    gradients = [rng.standard_normal(shape).astype(dtype) for shape in ((3, 4), (5,), (0, 2), ())]
    model = scaling_model([StateTensor(g) for g in gradients])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"factor": np.asarray(factor, np.float64), **{f"grad{i}": g for i, g in enumerate(gradients)}}
    for gradient, scaled in zip(gradients, session.run(None, feeds), strict=True):
        wide = np.float64 if dtype == np.float64 else np.float32
        expected = (gradient.astype(wide) * wide(factor)).astype(dtype)
        assert scaled.dtype == dtype and scaled.shape == gradient.shape
        np.testing.assert_array_equal(scaled, expected)
