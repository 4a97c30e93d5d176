"""OrtValue helpers and the two binding paths."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from onnxtrain.training import binding, values
from onnxtrain.training.device import Device
from tests.helpers import FLOAT16, make_model
from tests.training import models
from tests.training.helpers import classifier_batch, open_module

CPU = Device("cpu")


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int64, np.bool_])
def test_round_trip_copies(dtype):
    array = (np.arange(6).reshape(2, 3) % 2).astype(dtype)
    value = values.from_numpy(array, CPU)
    assert values.dtype_of(value) == np.dtype(dtype)
    back = values.to_numpy(value)
    np.testing.assert_array_equal(back.astype(np.float64), array.astype(np.float64))
    assert back.dtype == np.dtype(dtype)
    back[...] = 1  # a copy
    np.testing.assert_array_equal(values.to_numpy(value).astype(np.float64), array.astype(np.float64))
    copied = values.copy(value, CPU)
    values.write(copied, np.ones((2, 3), dtype), "copied")
    assert values.to_numpy(copied).astype(np.float64).all()
    np.testing.assert_array_equal(values.to_numpy(value).astype(np.float64), array.astype(np.float64))


def test_write_checks_dtype_and_shape():
    value = values.from_numpy(np.zeros((2, 3), np.float32), CPU)
    with pytest.raises(TypeError, match=r"float32\[2, 3\]; got float64\[2, 3\]"):
        values.write(value, np.zeros((2, 3)), "v")
    with pytest.raises(ValueError, match=r"got shape \[3, 2\]"):
        values.write(value, np.zeros((3, 2), np.float32), "v")
    values.write(value, np.ones((2, 3), np.float32), "v")
    assert values.to_numpy(value).all()


def test_empty_and_scalar_tensors():
    assert values.to_numpy(values.from_numpy(np.zeros((0, 3), np.float32), CPU)).shape == (0, 3)
    assert values.to_numpy(values.from_numpy(np.float32(2.5), CPU)) == 2.5


def test_public_and_native_bindings_give_the_same_trajectory(classifier, monkeypatch):
    batches = [classifier_batch(np.random.default_rng(9)) for _ in range(4)]

    def run():
        _, module, optimizer = open_module(classifier)
        losses = []
        for batch in batches:
            losses.append(float(module(*batch)))
            optimizer.step()
            module.lazy_reset_grad()
        return module, losses

    native_module, native = run()
    assert native_module._train_session.native
    monkeypatch.setattr(binding._NativeBinding, "supported", staticmethod(lambda session: False))
    public_module, public = run()
    assert not public_module._train_session.native
    assert native == public


def test_float16_parameters_train(tmp_path):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])]
    model = make_model(
        {"x": (FLOAT16, ["batch", 3])},
        nodes,
        {"y": (FLOAT16, ["batch", 2])},
        [("W", rng.normal(size=(3, 2)).astype(np.float16)), ("b", np.zeros(2, np.float16))],
    )
    paths = models.generate(tmp_path, model, loss="MSELoss", optimizer="AdamW")
    state, module, optimizer = open_module(paths)
    optimizer.set_learning_rate(0.05)
    x = rng.normal(size=(8, 3)).astype(np.float16)
    target = (x[:, :2] * 0.5).astype(np.float16)
    losses = []
    for _ in range(20):
        losses.append(float(module(x, target)))
        optimizer.step()
        module.lazy_reset_grad()
    assert losses[-1] < 0.5 * losses[0]
    buffer = module.get_contiguous_parameters()
    assert buffer.numpy().dtype == np.float16 and buffer.numpy().size == 8
    assert state.parameters["W"].grad.dtype == np.float16


@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="no CUDA here")
def test_cuda_keeps_the_state_on_the_device_and_matches_the_cpu(classifier):
    batches = [classifier_batch(np.random.default_rng(10)) for _ in range(5)]
    trajectories = {}
    for device in ("cpu", "cuda"):
        state, module, optimizer = open_module(classifier, device=device)
        losses = []
        for batch in batches:
            losses.append(float(module(*batch)))
            optimizer.step()
            module.lazy_reset_grad()
        trajectories[device] = losses
        if device == "cuda":
            assert all(t.value.device_name().lower() == "cuda" for t in state.store.tensors.values())
            assert all(g.value.device_name().lower() == "cuda" for g in state.store.gradients.values())
            # every node a launch: the batches' shapes get a session of their own whatever their size
            assert module._fused is not None and module._fused.fold_every_shape
            assert [s.session.get_inputs()[0].shape for s in module._fused.sessions()] == [[16, 6]]
            device_inputs = [ort.OrtValue.ortvalue_from_numpy(a, "cuda", 0) for a in batches[0]]
            loss = module(*device_inputs)
            assert isinstance(loss, ort.OrtValue) and loss.device_name().lower() == "cuda"
    np.testing.assert_allclose(trajectories["cuda"], trajectories["cpu"], rtol=1e-4)
