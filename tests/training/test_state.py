"""CheckpointState: parameters and properties, save and load with optimizer state, mismatched checkpoints."""

from __future__ import annotations

import numpy as np
import pytest

from onnxtrain import api, checkpoint
from tests.training.helpers import classifier_batch, open_module, parameters, regression_batch


def test_parameters_view(regression):
    state = api.CheckpointState.load_checkpoint(regression["checkpoint"])
    assert len(state.parameters) == 4 and "fc0.weight" in state.parameters
    names = [name for name, _ in state.parameters]  # ORT yields (name, Parameter) pairs, in checkpoint order
    assert sorted(names) == ["fc0.bias", "fc0.weight", "fc1.bias", "fc1.weight"]
    parameter = state.parameters["fc0.weight"]
    assert parameter.name == "fc0.weight" and parameter.requires_grad and parameter.grad is None
    data = parameter.data
    data[...] = 42  # a copy: the state does not change
    assert not (state.parameters["fc0.weight"].data == 42).any()
    with pytest.raises(KeyError, match=r"fc0\.weight"):
        state.parameters["nope"]


def test_parameter_assignment_checks_and_reaches_the_module(regression, rng):
    state, module, _ = open_module(regression, optimizer=False)
    new = np.full((4, 8), 0.5, np.float32)
    state.parameters["fc0.weight"] = new
    np.testing.assert_array_equal(state.parameters["fc0.weight"].data, new)
    state.parameters["fc0.bias"].data = np.zeros(8, np.float32)
    x, target = regression_batch(rng)
    _, y = module.eval()(x, target)
    h = np.maximum(x @ new, 0)
    expected = h @ state.parameters["fc1.weight"].data + state.parameters["fc1.bias"].data
    np.testing.assert_allclose(y, expected, rtol=1e-5)
    with pytest.raises(ValueError, match=r"float32\[4, 8\].*shape \[8, 4\]"):
        state.parameters["fc0.weight"] = np.zeros((8, 4), np.float32)
    with pytest.raises(TypeError, match="astype"):
        state.parameters["fc0.weight"] = np.zeros((4, 8), np.float64)
    np.testing.assert_array_equal(state.parameters["fc0.weight"].data, new)


def test_properties(regression, tmp_path):
    state = api.CheckpointState.load_checkpoint(regression["checkpoint"])
    state.properties["epoch"] = 3
    state.properties["best"] = 0.25
    state.properties["tag"] = "run-1"
    assert "epoch" in state.properties and len(state.properties) == 3
    with pytest.raises(TypeError, match="bool"):
        state.properties["flag"] = True
    with pytest.raises(TypeError):
        state.properties["list"] = [1, 2]
    # a lone surrogate (os.fsdecode of a file name that is not UTF-8) was taken, then failed every later save
    with pytest.raises(ValueError, match=r"property 'file' holds '\\udcff' at position 3, which UTF-8 cannot"):
        state.properties["file"] = "run\udcff.npz"
    with pytest.raises(ValueError, match="the property name"):
        state.properties["\udcff"] = 1
    path = tmp_path / "ckpt"
    api.CheckpointState.save_checkpoint(state, path)
    loaded = api.CheckpointState.load_checkpoint(path)
    assert dict(loaded.properties) == {"epoch": 3, "best": 0.25, "tag": "run-1"}
    assert loaded["epoch"] == 3  # ORT's older spelling, state[name]


def test_save_without_and_with_optimizer_state(classifier, rng, tmp_path):
    state, module, optimizer = open_module(classifier)
    optimizer.set_learning_rate(0.02)
    for _ in range(2):
        module(*classifier_batch(rng))
        optimizer.step()
        module.lazy_reset_grad()
    api.CheckpointState.save_checkpoint(state, tmp_path / "params_only")
    api.CheckpointState.save_checkpoint(state, tmp_path / "full", include_optimizer_state=True)
    params_only = checkpoint.load(tmp_path / "params_only")
    full = checkpoint.load(tmp_path / "full")
    assert params_only.optimizer is None
    assert full.optimizer.step == 2
    assert full.optimizer.initial_learning_rate == pytest.approx(0.02)
    assert sorted(full.optimizer.moments) == sorted(name for name, _ in state.parameters)
    for name, value in parameters(state).items():
        np.testing.assert_array_equal(full.trainable[name], value)
    # restored: the new optimizer continues from step 2 at the saved rate
    restored = api.CheckpointState.load_checkpoint(tmp_path / "full")
    module2 = api.Module(classifier["training_model"], restored)
    optimizer2 = api.Optimizer(classifier["optimizer_model"], module2)
    assert restored.to_checkpoint().optimizer.step == 2
    assert optimizer2.get_learning_rate() == pytest.approx(0.02)
    for name, moments in full.optimizer.moments.items():
        for saved, live in zip(moments, restored.to_checkpoint().optimizer.moments[name], strict=True):
            np.testing.assert_array_equal(saved, live)


def test_optimizer_state_of_another_optimizer_is_refused(classifier, momentum, rng, tmp_path):
    # SGD with momentum keeps 1 moment per parameter; AdamW 2.
    state, module, optimizer = open_module(momentum)
    module(*regression_batch(rng))
    optimizer.step()
    api.CheckpointState.save_checkpoint(state, tmp_path / "sgd", include_optimizer_state=True)
    saved = checkpoint.load(tmp_path / "sgd")
    moments = {name: [m, m] for name, (m,) in saved.optimizer.moments.items()}
    two = checkpoint.CheckpointState(
        saved.trainable, saved.frozen, checkpoint.OptimizerState(moments, step=1), saved.properties
    )
    checkpoint.save(two, tmp_path / "two")
    state2 = api.CheckpointState.load_checkpoint(tmp_path / "two")
    module2 = api.Module(momentum["training_model"], state2)
    with pytest.raises(ValueError, match=r"2 moment.*keeps 1 per parameter"):
        api.Optimizer(momentum["optimizer_model"], module2)


def test_checkpoint_of_another_model_is_refused(regression, classifier, momentum):
    other = api.CheckpointState.load_checkpoint(classifier["checkpoint"])
    with pytest.raises(ValueError, match=r"fc0.weight.*float32\[6, 16\].*float32\[4, 8\]"):
        api.Module(regression["training_model"], other)
    frozen_differently = api.CheckpointState.load_checkpoint(momentum["checkpoint"])
    with pytest.raises(ValueError, match="frozen"):
        api.Module(regression["training_model"], frozen_differently)


def test_missing_and_extra_parameters_are_named(regression, tmp_path):
    saved = checkpoint.load(regression["checkpoint"])
    missing = checkpoint.CheckpointState({k: v for k, v in saved.trainable.items() if k != "fc1.bias"})
    checkpoint.save(missing, tmp_path / "missing")
    with pytest.raises(ValueError, match=r"fc1\.bias"):
        api.Module(regression["training_model"], api.CheckpointState.load_checkpoint(tmp_path / "missing"))
    extra = checkpoint.CheckpointState(saved.trainable, {"stray": np.zeros(2, np.float32)})
    checkpoint.save(extra, tmp_path / "extra")
    with pytest.raises(ValueError, match="stray"):
        api.Module(regression["training_model"], api.CheckpointState.load_checkpoint(tmp_path / "extra"))


def test_nominal_checkpoint_needs_parameters_before_training(tmp_path, rng):
    from onnxtrain.artifacts import LossType
    from tests.training import models

    paths = models.generate(tmp_path, models.mlp((4, 8, 3)), loss=LossType.MSELoss, nominal_checkpoint=True)
    full = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    full_module = api.Module(paths["training_model"], full)
    buffer = full_module.get_contiguous_parameters().numpy()
    state = api.CheckpointState.load_checkpoint(paths["nominal_checkpoint"])
    module = api.Module(paths["training_model"], state)
    x, target = regression_batch(rng)
    with pytest.raises(ValueError, match="nominal"):
        module(x, target)
    module.copy_buffer_to_parameters(buffer, trainable_only=False)
    np.testing.assert_array_equal(module(x, target), full_module(x, target))
