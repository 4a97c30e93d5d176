"""A nominal state on the runtime: nothing allocated until needed, and what is needed checked against a limit.

The regression artifacts' parameters take 268 bytes (67 float32); the tests
lower ``MAX_NOMINAL_BYTES`` below that instead of declaring gigabytes.
"""

from __future__ import annotations

import numpy as np
import pytest

from onnxtrain import api, checkpoint
from onnxtrain.checkpoint import CheckpointError
from onnxtrain.checkpoint import state as checkpoint_state
from tests.training.helpers import regression_batch

PARAMETER_BYTES = 268


@pytest.fixture
def nominal(regression, tmp_path):
    """The regression checkpoint's nominal version, saved; and the full state."""
    full = checkpoint.load(regression["checkpoint"])
    checkpoint.save(full.nominal(), tmp_path / "nominal")
    return tmp_path / "nominal", full


def test_a_module_over_a_nominal_state_checks_the_limit(regression, nominal, monkeypatch, rng):
    path, full = nominal
    monkeypatch.setattr(checkpoint_state, "MAX_NOMINAL_BYTES", PARAMETER_BYTES - 1)
    state = api.CheckpointState.load_checkpoint(path)
    placing = r"placing .* 268 bytes .* 'fc1\.weight' \(float32\[8, 3\]\).*MAX_NOMINAL_BYTES = 267"
    with pytest.raises(CheckpointError, match=placing):
        api.Module(regression["training_model"], state)
    monkeypatch.setattr(checkpoint_state, "MAX_NOMINAL_BYTES", 100)
    with pytest.raises(RuntimeError, match="Please load the parameter states first"):
        state.parameters["fc0.weight"]  # (no value to read, and nothing allocated)
    monkeypatch.setattr(checkpoint_state, "MAX_NOMINAL_BYTES", PARAMETER_BYTES)
    module = api.Module(regression["training_model"], state)  # the failed attempt left the state as it was
    assert state.is_nominal
    with pytest.raises(RuntimeError, match="Please load the parameter states first"):
        state.parameters["fc0.weight"]  # (placed on the device, still no value: no zeros)
    reference = api.Module(regression["training_model"], api.CheckpointState(full))
    module.copy_buffer_to_parameters(reference.get_contiguous_parameters().numpy(), trainable_only=False)
    x, target = regression_batch(rng)
    for got, expected in zip(module(x, target), reference(x, target), strict=True):
        np.testing.assert_array_equal(got, expected)


def test_parameters_given_before_the_module_need_no_limit(regression, nominal, monkeypatch, rng):
    path, full = nominal
    monkeypatch.setattr(checkpoint_state, "MAX_NOMINAL_BYTES", 0)
    state = api.CheckpointState.load_checkpoint(path)
    for name, value in full.parameters.items():
        state.parameters[name] = value  # memory follows the data given
    assert not state.is_nominal
    module = api.Module(regression["training_model"], state)
    reference = api.Module(regression["training_model"], api.CheckpointState(full))
    x, target = regression_batch(rng)
    for got, expected in zip(module(x, target), reference(x, target), strict=True):
        np.testing.assert_array_equal(got, expected)


def test_a_nominal_snapshot_allocates_nothing(nominal, monkeypatch):
    path, full = nominal
    monkeypatch.setattr(checkpoint_state, "MAX_NOMINAL_BYTES", 0)
    state = api.CheckpointState.load_checkpoint(path)
    snapshot = state.to_checkpoint()
    assert snapshot == full.nominal()
    assert all(a.strides == (0,) * a.ndim for a in snapshot.parameters.values())
