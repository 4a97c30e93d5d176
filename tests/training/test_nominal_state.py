"""A nominal checkpoint on the runtime, as in ONNX Runtime 1.19.2: nothing reads or runs until it holds values.

ONNX Runtime's messages start the errors (users match on them); the errors
are ``RuntimeError``s, as ONNX Runtime's, and ``ValueError``s, as onnxtrain's
were. Filled from the full checkpoint's contiguous parameters, a nominal
state trains exactly as the full one.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx.numpy_helper
import pytest

from onnxtrain import api, checkpoint, onnxblock
from onnxtrain.artifacts import LossType, OptimType
from onnxtrain.training.state import NominalStateError
from tests.training import models
from tests.training.helpers import parameters, regression_batch

GET = "Cannot get parameter from a nominal state. Please load the parameter states first"
LOAD = "Please load the model parameters first."
FROZEN = ["fc0.bias", "fc0.weight"]
TRAINABLE = ["fc1.bias", "fc1.weight"]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """MLP 4-8-3 with the first layer frozen, MSE, AdamW; with ``nominal_checkpoint``."""
    return models.generate(
        tmp_path_factory.mktemp("nominal"),
        models.mlp((4, 8, 3), seed=3),
        requires_grad=TRAINABLE,
        frozen_params=FROZEN,
        loss=LossType.MSELoss,
        optimizer=OptimType.AdamW,
        nominal_checkpoint=True,
    )


def _open(paths: dict[str, Path], which: str) -> tuple[api.CheckpointState, api.Module, api.Optimizer]:
    state = api.CheckpointState.load_checkpoint(paths[which])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    return state, module, api.Optimizer(paths["optimizer_model"], module)


def _raises(start: str, missing: list[str]) -> pytest.RaisesExc:
    """``NominalStateError`` whose message starts with ``start`` and ORT's sentence, and names ``missing``."""
    pattern = f"{start} {LOAD} Parameters {sorted(missing)} of this nominal checkpoint state hold no values yet"
    return pytest.raises(NominalStateError, match=f"^{re.escape(pattern)}")


def _train(module: api.Module, optimizer: api.Optimizer, batches: list) -> list[np.ndarray]:
    losses = []
    for x, target in batches:
        losses.append(module(x, target))
        optimizer.step()
        module.lazy_reset_grad()
    return losses


def test_nothing_reads_or_runs_before_the_parameters_are_loaded(artifacts, tmp_path, rng):
    state, module, optimizer = _open(artifacts, "nominal_checkpoint")
    x, target = regression_batch(rng)
    everything = sorted(FROZEN + TRAINABLE)
    # what needs no values works: names, shapes, sizes, lazy_reset_grad, learning rates
    assert sorted(state.parameters.names()) == everything and "fc0.weight" in state.parameters
    assert len(state.parameters) == len(everything) and "'fc1.weight': 'float32[8, 3]'" in repr(state)
    assert "Parameter(name=fc1.weight, requires_grad=True, shape=(8, 3), dtype=float32)" in repr(state.parameters)
    assert module.get_parameters_size() == 27 and module.get_parameters_size(trainable_only=False) == 67
    module.lazy_reset_grad()
    optimizer.set_learning_rate(0.01)
    # getting a parameter raises ORT's error at [name] already, a RuntimeError (and a ValueError): never zeros
    for name in everything:
        with pytest.raises(RuntimeError, match=f"^{GET}: '{name}' holds no value yet"):
            state.parameters[name]
        with pytest.raises(ValueError, match=GET):
            state[name]  # (ORT's older spelling)
    with pytest.raises(RuntimeError, match=GET):
        list(state.parameters)  # iterating yields Parameters, as ORT's does
    with pytest.raises(KeyError, match="no parameter 'nope'"):
        state.parameters["nope"]  # (an unknown name is still a KeyError)
    with _raises("Cannot copy parameters from a nominal checkpoint state.", everything):
        module.get_contiguous_parameters()
    with _raises("Cannot copy parameters from a nominal checkpoint state.", TRAINABLE):
        module.get_contiguous_parameters(trainable_only=True)
    with _raises("Cannot copy parameters from a nominal checkpoint state.", everything):
        module.get_contiguous_parameters_per_dtype()
    with _raises("Cannot perform TrainStep with a nominal state.", everything):
        module(x, target)
    with _raises("The optimizer state cannot be constructed.", everything):
        optimizer.step()
    module.eval()
    with _raises("Cannot perform EvalStep with a nominal state.", everything):
        module(x, target)
    with _raises("Cannot export the model with a nominal state.", everything):
        module.export_model_for_inferencing(tmp_path / "inference.onnx", ["y"])
    assert not (tmp_path / "inference.onnx").exists()
    assert module.train_step_count == 0 and state.step == 0 and state.is_nominal
    # an array of another shape or dtype fills nothing: ORT's sentence for writing to a nominal state
    for wrong in (np.ones((10, 10), np.float32), np.ones((4, 8), np.float64)):
        with pytest.raises(RuntimeError, match="^Cannot copy parameter to a nominal state. Please load all the "
                           r"parameter states first, or assign to 'fc0.weight' an array of its dtype and shape: it "
                           r"is float32\[4, 8\]"):  # fmt: skip
            state.parameters["fc0.weight"] = wrong
    with pytest.raises(ValueError, match=r"buffer has 3 float32 elements, but the trainable parameters have 27"):
        module.copy_buffer_to_parameters(np.zeros(3, np.float32))
    assert state.is_nominal
    # the untouched nominal state saves as one; a partly loaded one does not
    api.CheckpointState.save_checkpoint(state, tmp_path / "again")
    assert checkpoint.load(tmp_path / "again") == checkpoint.load(artifacts["nominal_checkpoint"])
    state.parameters["fc0.bias"] = np.zeros(8, np.float32)
    with pytest.raises(RuntimeError, match=r"^Cannot save a partly loaded nominal state\. Please load all the "):
        api.CheckpointState.save_checkpoint(state, tmp_path / "partly")
    assert not (tmp_path / "partly").exists()


@pytest.mark.parametrize("fill", ["all", "trainable, then frozen by assignment", "each by assignment"])
def test_a_filled_nominal_state_trains_as_the_full_checkpoint(artifacts, fill, rng):
    """Ten steps from the nominal checkpoint filled with the full one's values equal the full one's."""
    full, full_module, full_optimizer = _open(artifacts, "checkpoint")
    state, module, optimizer = _open(artifacts, "nominal_checkpoint")
    x, target = regression_batch(rng)
    buffer = full_module.get_contiguous_parameters()  # an OrtValue, in training-model order
    if fill == "all":
        module.copy_buffer_to_parameters(buffer, trainable_only=False)
    elif fill == "trainable, then frozen by assignment":
        module.copy_buffer_to_parameters(full_module.get_contiguous_parameters(trainable_only=True).numpy())
        np.testing.assert_array_equal(
            module.get_contiguous_parameters(trainable_only=True).numpy(),
            full_module.get_contiguous_parameters(trainable_only=True).numpy(),
        )
        # the frozen parameters still hold no values: every step names them (and only them)
        with _raises("Cannot perform TrainStep with a nominal state.", FROZEN):
            module(x, target)
        with _raises("The optimizer state cannot be constructed.", FROZEN):
            optimizer.step()
        with _raises("Cannot copy parameters from a nominal checkpoint state.", FROZEN):
            module.get_contiguous_parameters()
        module.eval()
        with _raises("Cannot perform EvalStep with a nominal state.", FROZEN):
            module(x, target)
        module.train()
        assert state.is_nominal and module.train_step_count == 0
        for name in FROZEN:
            state.parameters[name] = full.parameters[name].data
    else:
        for name, parameter in full.parameters:
            state.parameters[name] = parameter.data
            assert state.parameters[name].requires_grad == parameter.requires_grad
    assert not state.is_nominal
    assert parameters(state).keys() == parameters(full).keys()
    for name, value in parameters(full).items():
        np.testing.assert_array_equal(state.parameters[name].data, value, err_msg=name)
    batches = [regression_batch(rng) for _ in range(10)]
    losses = _train(module, optimizer, batches)
    expected = _train(full_module, full_optimizer, batches)
    for step, (got, want) in enumerate(zip(losses, expected, strict=True)):
        np.testing.assert_array_equal(got, want, err_msg=f"step {step}")
    for name, value in parameters(full).items():
        np.testing.assert_array_equal(state.parameters[name].data, value, err_msg=name)
    assert state.to_checkpoint() == full.to_checkpoint()  # moments and step count too
    module.eval()
    full_module.eval()
    np.testing.assert_array_equal(module(x, target), full_module(x, target))


def test_a_nominal_checkpoint_from_onnxblock_and_the_cpp_names(artifacts, tmp_path, rng):
    """``onnxblock.save_checkpoint(..., nominal_checkpoint=True)``, filled by ``TrainingSession.from_buffer``."""
    full = checkpoint.load(artifacts["checkpoint"])
    trainable = [onnx.numpy_helper.from_array(a, n) for n, a in full.trainable.items()]
    frozen = [onnx.numpy_helper.from_array(a, n) for n, a in full.frozen.items()]
    onnxblock.save_checkpoint((trainable, frozen), tmp_path / "nominal", nominal_checkpoint=True)
    state = api.CheckpointState.load_checkpoint(tmp_path / "nominal")
    session = api.TrainingSession(
        state, artifacts["training_model"], artifacts["eval_model"], artifacts["optimizer_model"]
    )
    x, target = regression_batch(rng)
    with pytest.raises(RuntimeError, match=r"^Cannot perform TrainStep with a nominal state\. Please load the model"):
        session.train_step([x, target])
    with pytest.raises(RuntimeError, match=r"^Cannot copy parameters from a nominal checkpoint state"):
        session.to_buffer(only_trainable=False)
    reference = api.TrainingSession(
        api.CheckpointState(full), artifacts["training_model"], optimizer_model=artifacts["optimizer_model"]
    )
    session.from_buffer(reference.to_buffer(only_trainable=False))  # the size says: every parameter
    for _ in range(3):
        x, target = regression_batch(rng)
        np.testing.assert_array_equal(session.train_step([x, target])[0], reference.train_step([x, target])[0])
        session.optimizer_step()
        reference.optimizer_step()
        session.lazy_reset_grad()
        reference.lazy_reset_grad()
    np.testing.assert_array_equal(session.to_buffer(False).numpy(), reference.to_buffer(False).numpy())


def test_onnx_runtimes_nominal_checkpoint_without_shapes_takes_the_models(artifacts, tmp_path, rng):
    """ONNX Runtime 1.19.2's ``generate_artifacts(nominal_checkpoint=True)`` writes no dimensions (every tensor
    rank 0): the module takes each parameter's shape from the training model, the buffer fills it, and it trains
    as the full checkpoint."""
    full, full_module, full_optimizer = _open(artifacts, "checkpoint")
    nominal = checkpoint.load(artifacts["nominal_checkpoint"])
    shapeless = checkpoint.CheckpointState(
        *({name: checkpoint.state.placeholder(array.dtype, ()) for name, array in group.items()}
          for group in (nominal.trainable, nominal.frozen)),
        is_nominal=True,
    )  # fmt: skip
    checkpoint.save(shapeless, tmp_path / "ort_nominal")
    state, module, optimizer = _open({**artifacts, "ort": tmp_path / "ort_nominal"}, "ort")
    assert module.get_parameters_size(False) == full_module.get_parameters_size(False)
    module.copy_buffer_to_parameters(full_module.get_contiguous_parameters(), trainable_only=False)
    for name, value in parameters(full).items():
        np.testing.assert_array_equal(state.parameters[name].data, value, err_msg=name)
    batches = [regression_batch(rng) for _ in range(3)]
    np.testing.assert_array_equal(_train(module, optimizer, batches), _train(full_module, full_optimizer, batches))
