"""Contiguous parameter buffers: order, round trip, dtypes, size errors."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from tests.training.helpers import open_module, parameters

ORDER = ["fc0.weight", "fc0.bias", "fc1.weight", "fc1.bias"]  # training-model order


def test_buffer_is_the_parameters_in_training_model_order(regression):
    state, module, _ = open_module(regression, optimizer=False)
    buffer = module.get_contiguous_parameters()
    assert isinstance(buffer, ort.OrtValue)
    values = parameters(state)
    np.testing.assert_array_equal(buffer.numpy(), np.concatenate([values[n].ravel() for n in ORDER]))


def test_round_trip_through_a_buffer(regression, momentum):
    _state, module, _ = open_module(regression, optimizer=False)
    original = module.get_contiguous_parameters(trainable_only=True).numpy()
    module.copy_buffer_to_parameters(np.zeros_like(original))
    assert not module.get_contiguous_parameters().numpy().any()
    module.copy_buffer_to_parameters(ort.OrtValue.ortvalue_from_numpy(original))
    np.testing.assert_array_equal(module.get_contiguous_parameters().numpy(), original)
    # trainable_only with frozen parameters: only the trainable ones are written
    state2, module2, _ = open_module(momentum, optimizer=False)
    frozen = state2.parameters["fc0.weight"].data
    size = module2.get_parameters_size(trainable_only=True)
    module2.copy_buffer_to_parameters(np.ones(size, np.float32), trainable_only=True)
    np.testing.assert_array_equal(state2.parameters["fc0.weight"].data, frozen)
    assert (state2.parameters["fc1.weight"].data == 1).all()
    full = module2.get_contiguous_parameters(trainable_only=False).numpy()
    assert full.size == module2.get_parameters_size(trainable_only=False)


def test_wrong_size_or_dtype_is_refused_and_nothing_is_written(regression):
    state, module, _ = open_module(regression, optimizer=False)
    before = parameters(state)
    size = module.get_parameters_size()
    with pytest.raises(ValueError, match=f"{size - 1} float32 elements.*have {size}"):
        module.copy_buffer_to_parameters(np.zeros(size - 1, np.float32))
    with pytest.raises(TypeError, match="float64"):
        module.copy_buffer_to_parameters(np.zeros(size, np.float64))
    with pytest.raises(TypeError, match=r"OrtValue or a numpy\.ndarray"):
        module.copy_buffer_to_parameters([0.0] * size)
    for name, value in parameters(state).items():
        np.testing.assert_array_equal(value, before[name])


def test_parameters_of_several_dtypes_have_one_buffer_per_dtype(mixed):
    state, module, _ = open_module(mixed, optimizer=False)
    with pytest.raises(TypeError, match="per_dtype"):
        module.get_contiguous_parameters()
    buffers = module.get_contiguous_parameters_per_dtype()
    assert list(buffers) == ["float32", "float64"]
    np.testing.assert_array_equal(buffers["float32"].numpy(), state.parameters["W"].data.ravel())
    np.testing.assert_array_equal(buffers["float64"].numpy(), state.parameters["b"].data)
    module.copy_buffer_to_parameters({"float32": np.ones(6, np.float32), "float64": np.full(2, 2.0)})
    assert (state.parameters["W"].data == 1).all() and (state.parameters["b"].data == 2).all()
    with pytest.raises(TypeError, match="several dtypes"):
        module.copy_buffer_to_parameters(np.ones(8, np.float32))
    with pytest.raises(ValueError, match="dtypes"):
        module.copy_buffer_to_parameters({"float32": np.ones(6, np.float32)})


def test_the_buffers_device_name_is_onnx_runtimes(regression, mixed):
    """ONNX Runtime's training API gives the device's own name ("Cpu", "Cuda"); onnxruntime's OrtValue lower-cases
    it. The buffer is still an OrtValue that copy_buffer_to_parameters takes back."""
    _state, module, _ = open_module(regression, optimizer=False)
    buffer = module.get_contiguous_parameters()
    assert buffer.device_name() == "Cpu"
    module.copy_buffer_to_parameters(buffer)
    _state, module, _ = open_module(mixed, optimizer=False)
    assert {value.device_name() for value in module.get_contiguous_parameters_per_dtype().values()} == {"Cpu"}


@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="no CUDA here")
def test_a_cuda_buffers_device_name_is_onnx_runtimes(regression):
    """ONNX Runtime's test_cuda_execution_provider asserts ``device_name() == "Cuda"``."""
    _state, module, _ = open_module(regression, optimizer=False, device="cuda")
    assert module.get_contiguous_parameters().device_name() == "Cuda"


def test_the_layout_says_where_each_parameter_lies_in_the_buffers(regression, momentum, mixed):
    """The buffers follow the training model's order, not ``state.parameters.names()``: offsets computed from
    names() wrote into the wrong parameter. The layout gives the offsets."""
    state, module, _ = open_module(regression, optimizer=False)
    layout = module.get_contiguous_parameters_layout()
    assert [entry.name for entry in layout] == ORDER != state.parameters.names()
    assert [(entry.offset, entry.size, entry.shape, entry.dtype) for entry in layout] == [
        (0, 32, (4, 8), "float32"), (32, 8, (8,), "float32"), (40, 24, (8, 3), "float32"), (64, 3, (3,), "float32"),
    ]  # fmt: skip
    buffer = module.get_contiguous_parameters().numpy()
    for name, offset, size, shape, _dtype in layout:
        np.testing.assert_array_equal(buffer[offset : offset + size].reshape(shape), state.parameters[name].data)
    buffer[layout[1].offset : layout[1].offset + layout[1].size] = 7.0  # write one parameter through the layout
    module.copy_buffer_to_parameters(buffer, trainable_only=False)
    assert (state.parameters["fc0.bias"].data == 7.0).all() and not (state.parameters["fc0.weight"].data == 7).any()
    # trainable only, with frozen parameters
    state, module, _ = open_module(momentum, optimizer=False)
    trainable = module.get_contiguous_parameters_layout(trainable_only=True)
    assert [entry.name for entry in trainable] == ["fc1.weight", "fc1.bias"] and trainable[1].offset == 24
    assert sum(entry.size for entry in trainable) == module.get_parameters_size(trainable_only=True)
    # several dtypes: offsets in the buffer of each dtype
    state, module, _ = open_module(mixed, optimizer=False)
    buffers = {kind: value.numpy() for kind, value in module.get_contiguous_parameters_per_dtype().items()}
    for name, offset, size, shape, dtype in module.get_contiguous_parameters_layout():
        assert offset == 0
        np.testing.assert_array_equal(
            buffers[dtype][offset : offset + size].reshape(shape), state.parameters[name].data
        )
