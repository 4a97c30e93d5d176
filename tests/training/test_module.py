"""Module: train and eval steps, names, lazy reset and gradient accumulation."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from onnxtrain import api
from onnxtrain.training.device import resolve
from tests.training.helpers import open_module, parameters, regression_batch, run_onnx


def _direct_training_run(paths, state_values, x, target, buffers=None, reset=True):
    """The training model run directly with onnxruntime: what a train step must compute."""
    trainable = ["fc0.weight", "fc0.bias", "fc1.weight", "fc1.bias"]
    feeds = {"x": x, "target": target, **state_values, "lazy_reset_grad": np.array([reset])}
    for name in trainable:
        feeds[f"{name}_grad.accumulation.buffer"] = (
            np.zeros_like(state_values[name]) if buffers is None else buffers[name]
        )
    return run_onnx(paths["training_model"], feeds)


def test_train_step_returns_the_user_outputs_and_keeps_the_gradients(regression, rng):
    state, module, _ = open_module(regression, optimizer=False)
    x, target = regression_batch(rng)
    before = parameters(state)
    assert module.training is True
    loss, y = module(x, target)  # the loss, then the additional output "y"
    expected = _direct_training_run(regression, before, x, target)
    np.testing.assert_allclose(loss, expected["reducesum_4"], rtol=1e-6)
    np.testing.assert_allclose(y, expected["y"], rtol=1e-6)
    for name in ("fc0.weight", "fc1.bias"):
        np.testing.assert_allclose(
            state.parameters[name].grad, expected[f"{name}_grad.accumulation.out"], rtol=1e-5, atol=1e-7
        )
    # a train step does not change the parameters
    for name, value in parameters(state).items():
        np.testing.assert_array_equal(value, before[name])


def test_names_hide_parameters_buffers_and_flags(regression):
    _, module, _ = open_module(regression, optimizer=False)
    assert module.input_names() == ["x", "target"]
    assert module.output_names() == ["reducesum_4", "y"]
    module.eval()
    assert module.input_names() == ["x", "target"]
    assert module.output_names() == ["reducesum_4", "y"]


def test_eval_step_uses_the_eval_model_and_changes_nothing(regression, rng):
    state, module, _ = open_module(regression, optimizer=False)
    x, target = regression_batch(rng)
    assert module.eval() is module and module.training is False
    loss, y = module(x, target)
    expected = run_onnx(regression["eval_model"], {"x": x, "target": target, **parameters(state)})
    np.testing.assert_allclose(loss, expected["reducesum_4"], rtol=1e-6)
    np.testing.assert_allclose(y, expected["y"], rtol=1e-6)
    grad = state.parameters["fc0.weight"].grad  # no train step yet: zeros, as in ONNX Runtime
    assert grad is not None and grad.shape == (4, 8) and not grad.any()
    assert module.train() is module and module.training is True


def test_inputs_by_name_and_as_ortvalues(regression, rng):
    _, module, _ = open_module(regression, optimizer=False)
    x, target = regression_batch(rng)
    by_position = module(x, target)
    module.lazy_reset_grad()
    by_name = module(target=target, x=x)
    module.lazy_reset_grad()
    on_device = module(ort.OrtValue.ortvalue_from_numpy(x), ort.OrtValue.ortvalue_from_numpy(target))
    assert all(isinstance(v, ort.OrtValue) for v in on_device)  # all OrtValues in: OrtValues out, as ORT
    for a, b, c in zip(by_position, by_name, on_device, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c.numpy())


def test_gradients_accumulate_until_lazy_reset(regression, rng):
    state, module, _ = open_module(regression, optimizer=False)
    x1, t1 = regression_batch(rng)
    x2, t2 = regression_batch(rng)
    module(x1, t1)
    g1 = state.parameters["fc0.weight"].grad
    module(x2, t2)  # accumulates: lazy_reset_grad = False
    g12 = state.parameters["fc0.weight"].grad
    module.lazy_reset_grad()
    assert not state.parameters["fc0.weight"].grad.any()  # zero once reset (lazily)
    module(x2, t2)  # overwrites: lazy_reset_grad = True
    g2 = state.parameters["fc0.weight"].grad
    np.testing.assert_allclose(g12, g1 + g2, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fuse", [True, False])
def test_modules_over_one_state_share_its_gradients_and_their_reset(regression, rng, fuse):
    """The gradients are the state's: a second module made over it (a notebook's setup cell run again, an
    evaluator) keeps what the first accumulated, and a reset by either is a reset for both. The first module
    added its next step to the buffers the second had reset (its own count said it was accumulating), and
    making the second module discarded the first's gradients."""
    state, first, opt = open_module(regression, fuse=fuse)
    (x1, t1), (x2, t2), (x3, t3) = (regression_batch(rng) for _ in range(3))
    first(x1, t1)
    accumulated = {name: parameter.grad for name, parameter in state.parameters}
    second = api.Module(regression["training_model"], state, regression["eval_model"])
    for name, parameter in state.parameters:
        np.testing.assert_array_equal(parameter.grad, accumulated[name], err_msg=name)
    second(x2, t2)  # adds to the first's
    second.lazy_reset_grad()
    assert not state.parameters["fc0.weight"].grad.any()
    first(x3, t3)  # from the reset gradients
    alone_state, alone, _ = open_module(regression, optimizer=False)
    for name, parameter in state.parameters:
        alone_state.parameters[name].data = parameter.data
    alone(x3, t3)
    for name, parameter in alone_state.parameters:
        np.testing.assert_allclose(state.parameters[name].grad, parameter.grad, rtol=1e-6, atol=1e-7, err_msg=name)
    opt.step()  # the first's gradients, which the optimizer applies


def test_two_half_batches_accumulate_to_the_full_batch_gradient(regression, rng):
    """With a sum reduction, the accumulated gradient of the halves is the full batch's gradient."""
    x, target = regression_batch(rng, n=16)
    state_full, full, _ = open_module(regression, optimizer=False)
    loss_full, _ = full(x, target)
    state_half, half, _ = open_module(regression, optimizer=False)
    loss_a, _ = half(x[:8], target[:8])
    loss_b, _ = half(x[8:], target[8:])
    np.testing.assert_allclose(loss_a + loss_b, loss_full, rtol=1e-5)
    for name, parameter in state_full.parameters:
        np.testing.assert_allclose(state_half.parameters[name].grad, parameter.grad, rtol=1e-4, atol=1e-5)


def test_frozen_parameters_have_no_gradient(momentum, rng):
    state, module, _ = open_module(momentum, optimizer=False)
    module(*regression_batch(rng))
    assert state.parameters["fc0.weight"].requires_grad is False
    assert state.parameters["fc0.weight"].grad is None
    assert state.parameters["fc1.weight"].requires_grad is True
    assert state.parameters["fc1.weight"].grad.shape == (8, 3)


def test_models_load_from_bytes(regression, rng):
    state = api.CheckpointState.load_checkpoint(regression["checkpoint"])
    module = api.Module(regression["training_model"].read_bytes(), state, regression["eval_model"].read_bytes())
    x, target = regression_batch(rng)
    loss, _ = module(x, target)
    assert np.isfinite(loss)
    module.eval()
    assert np.isfinite(module(x, target)[0])


def test_parameters_size(regression):
    _, module, _ = open_module(regression, optimizer=False)
    assert module.get_parameters_size() == 4 * 8 + 8 + 8 * 3 + 3  # trainable only by default
    assert module.get_parameters_size(trainable_only=False) == 4 * 8 + 8 + 8 * 3 + 3


def test_frozen_parameters_count_in_full_size_only(momentum):
    _, module, _ = open_module(momentum, optimizer=False)
    assert module.get_parameters_size() == 8 * 3 + 3
    assert module.get_parameters_size(trainable_only=False) == 4 * 8 + 8 + 8 * 3 + 3


def test_device_strings(regression):
    state = api.CheckpointState.load_checkpoint(regression["checkpoint"])
    module = api.Module(regression["training_model"], state, device="cpu")
    assert str(module.device) == "cpu"
    state = api.CheckpointState.load_checkpoint(regression["checkpoint"])
    module = api.Module(regression["training_model"], state, providers=["CPUExecutionProvider"])
    assert str(module.device) == "cpu"


@pytest.mark.parametrize("value", ["1", 1, True, "True"])
@pytest.mark.parametrize("provider", ["CUDAExecutionProvider", "TensorrtExecutionProvider"])
def test_graph_capture_in_the_provider_options_is_refused_with_the_reason(regression, provider, value):
    """A captured run replays the addresses of its first runs; the runtime binds each batch anew. Refused before
    onnxruntime is asked for the provider (so here too, without CUDA)."""
    key = "enable_cuda_graph" if provider == "CUDAExecutionProvider" else "trt_cuda_graph_enable"
    state = api.CheckpointState.load_checkpoint(regression["checkpoint"])
    with pytest.raises(ValueError, match=f"{key}=.*stale data. Remove the option"):
        api.Module(regression["training_model"], state, providers=[(provider, {key: value}), "CPUExecutionProvider"])
    assert state.parameters["fc0.weight"].grad is None  # the state was not touched
    device, providers = resolve(None, [("CPUExecutionProvider", {key: "0"})])  # off: accepted
    assert str(device) == "cpu" and providers == [("CPUExecutionProvider", {key: "0"})]


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="CUDA is available here")
def test_a_missing_provider_is_named(regression):
    state = api.CheckpointState.load_checkpoint(regression["checkpoint"])
    with pytest.raises(ValueError, match="CUDAExecutionProvider"):
        api.Module(regression["training_model"], state, device="cuda:1")
    with pytest.raises(ValueError, match="'cpu', 'cuda' or 'cuda:<id>'"):
        api.Module(regression["training_model"], state, device="gpu")
    assert state.parameters["fc0.weight"].grad is None  # the state was not touched
