"""Gradient accumulation with the mean over the group's rows: ``Module.scale_grad`` and ``train_epoch(accumulate=k)``.

``train_epoch`` over batches of 8 accumulated 3 to a step must take the steps
of batches of 24: 45 rows make groups of 8 + 8 + 8 and 8 + 8 + 5 rows, and
one batch of 24 then one of 21. Every parameter, gradient, moment and the
step count are compared, on a float64 model (the sums differ only in their
rounding).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given
from hypothesis import strategies as st

import onnxtrain.onnxblock as onnxblock
from onnxtrain import api, optim
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


@pytest.fixture(scope="module")
def ignoring(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The float64 MLP with a cross-entropy of class weights that ignores the label -100, and SGD."""
    model = models.mlp((6, 16, 4), seed=3, elem_type=DOUBLE)
    loss = onnxblock.loss.CrossEntropyLoss(weight=np.array([1.0, 2.0, 0.5, 1.5]), ignore_index=-100)
    return models.generate(tmp_path_factory.mktemp("ignoring"), model, loss=loss, optimizer=optim.SGD(momentum=0.9))


def _ignored(rows: int = ROWS) -> tuple[np.ndarray, np.ndarray]:
    """Data whose batches count different numbers of labels: about a third ignored, unevenly."""
    x, y = _data(rows)
    y = y.copy()
    y[np.random.default_rng(11).random(rows) < np.linspace(0.0, 0.8, rows)] = -100
    return x, y


def test_batches_are_weighted_by_the_labels_their_loss_counts(ignoring) -> None:
    """A mean cross-entropy is a mean over its labels not ignored, by their class weights: the batches of a
    group are weighted by those (what ``count_loss_items`` gives), and the steps are those of batches as
    large as the groups; weighted by rows, they were not (SGD moves each parameter by about 0.05)."""
    x, y = _ignored()
    state_a, module_a, optimizer_a = open_module(ignoring)
    state_b, module_b, optimizer_b = open_module(ignoring)
    assert module_a.count_loss_items(x[:8], y[:8]) == pytest.approx(
        sum({0: 1.0, 1: 2.0, 2: 0.5, 3: 1.5}[label] for label in y[:8] if label != -100)
    )
    for epoch in range(2):
        module_a.train_epoch(optimizer_a, x, y, BATCH, True, epoch, accumulate=ACCUMULATE)
        module_b.train_epoch(optimizer_b, x, y, BATCH * ACCUMULATE, True, epoch)
    a, b = snapshot(state_a), snapshot(state_b)
    for name, value in b.items():
        np.testing.assert_allclose(a[name], value, rtol=1e-9, atol=1e-13, err_msg=name)


@pytest.mark.parametrize("loss", ["cross-entropy", "mse"])
def test_a_loss_summed_over_its_batch_adds_the_gradients_unweighted(loss: str, tmp_path: Path) -> None:
    """A sum over the batch is a sum over the group's rows when the batches' gradients are added as they are:
    the step of one batch as large as the group, the short last group included (weighted by rows, the steps
    were 1/k of it)."""
    from onnxtrain.artifacts.metadata import LOSS_ITEMS_KEY, read_metadata

    block = (
        onnxblock.loss.CrossEntropyLoss(reduction="sum", ignore_index=-100)
        if loss == "cross-entropy"
        else onnxblock.loss.MSELoss(reduction="sum")
    )
    paths = models.generate(tmp_path, models.mlp((6, 16, 4), seed=4, elem_type=DOUBLE), loss=block,
                            optimizer=optim.SGD())  # fmt: skip
    assert json.loads(read_metadata(onnx.load(paths["training_model"]))[LOSS_ITEMS_KEY]) == {"reduction": "sum"}
    x, y = _ignored()
    target = y if loss == "cross-entropy" else np.random.default_rng(2).standard_normal((ROWS, 4))
    state_a, module_a, optimizer_a = open_module(paths)
    state_b, module_b, optimizer_b = open_module(paths)
    assert module_a.count_loss_items(x, target) is None
    module_a.train_epoch(optimizer_a, x, target, BATCH, accumulate=ACCUMULATE)
    module_b.train_epoch(optimizer_b, x, target, BATCH * ACCUMULATE)
    a, b = snapshot(state_a), snapshot(state_b)
    for name, value in b.items():
        np.testing.assert_allclose(a[name], value, rtol=1e-9, atol=1e-12, err_msg=name)


def test_a_label_out_of_range_in_an_accumulated_batch_raises_the_label_error(ignoring) -> None:
    x, y = _ignored(16)
    y[11] = 7
    _, module, optimizer = open_module(ignoring)
    module.count_loss_items(x, y)  # no IndexError of its own: the step's check says what is wrong
    with pytest.raises(ValueError, match=r"train_epoch: 1 label is out of range in 'labels'.*7 at \[11\]"):
        module.train_epoch(optimizer, x, y, BATCH, accumulate=2)


def test_artifacts_without_the_loss_items_read_them_from_the_eval_model(ignoring, tmp_path: Path) -> None:
    """Artifacts written before the metadata (or by other tools) have the loss in their eval model; a module
    with neither counts rows."""
    from onnxtrain.artifacts.metadata import LOSS_ITEMS_KEY, read_metadata

    written = json.loads(read_metadata(onnx.load(ignoring["training_model"]))[LOSS_ITEMS_KEY])
    assert written == {"labels": "labels", "ignore_index": -100, "class_weights": [1.0, 2.0, 0.5, 1.5]}
    paths = dict(ignoring)
    for role in ("training_model", "eval_model"):
        model = onnx.load(ignoring[role])
        kept = [entry for entry in model.metadata_props if entry.key != LOSS_ITEMS_KEY]
        del model.metadata_props[:]
        model.metadata_props.extend(kept)
        paths[role] = tmp_path / f"{role}.onnx"
        onnx.save(model, paths[role])
    x, y = _ignored(8)
    _, module, _ = open_module(paths)
    assert module.count_loss_items(x, y) == open_module(ignoring)[1].count_loss_items(x, y) < 8
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    assert api.Module(paths["training_model"], state).count_loss_items(x, y) == 8  # rows


def test_a_cross_entropy_that_ignores_nothing_counts_its_labels_and_other_losses_rows(paths, tmp_path: Path) -> None:
    """Labels ``[N]``: as many as the rows. A mean squared error is a mean over its rows (of one width): rows,
    and no metadata."""
    from onnxtrain.artifacts.metadata import LOSS_ITEMS_KEY, read_metadata

    _, module, _ = open_module(paths)
    x, y = _data(8)
    assert module.count_loss_items(x[:5], y[:5]) == 5
    assert json.loads(read_metadata(onnx.load(paths["training_model"]))[LOSS_ITEMS_KEY])["ignore_index"] is None
    mse = models.generate(tmp_path, models.mlp((6, 4), elem_type=DOUBLE), loss=LossType.MSELoss, optimizer=optim.SGD())
    assert LOSS_ITEMS_KEY not in read_metadata(onnx.load(mse["training_model"]))
    _, module, _ = open_module(mse)
    assert module.count_loss_items(x[:3], np.zeros((3, 4))) == 3


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
