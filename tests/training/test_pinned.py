"""``pin``: page-locked host memory for the copies to and from a GPU."""

from __future__ import annotations

import ctypes

import numpy as np
import onnxruntime as ort
import pytest

from onnxtrain.training import values
from onnxtrain.training.device import Device
from onnxtrain.training.pinned import cuda_runtime, pin

CUDA = "CUDAExecutionProvider" in ort.get_available_providers()


def test_a_view_is_refused() -> None:
    with pytest.raises(ValueError, match="owns its memory, not a view"):
        pin(np.zeros(8)[2:])


def test_without_a_gpu_nothing_is_pinned() -> None:
    """No CUDA runtime, or one installed on a machine without a GPU: refused."""
    runtime = cuda_runtime()
    if runtime is not None:
        count = ctypes.c_int(0)
        if runtime.cudaGetDeviceCount(ctypes.byref(count)) == 0 and count.value > 0:
            pytest.skip("a GPU is here")
        runtime.cudaGetLastError()
    assert pin(np.zeros(8)) is False


@pytest.mark.skipif(not CUDA, reason="no CUDA here")
def test_a_pinned_array_copies_both_ways_and_a_refusal_leaves_no_error_behind() -> None:
    device = Device("cuda", 0)
    value = values.from_numpy(np.arange(6, dtype=np.float32), device)  # loads onnxruntime's CUDA runtime
    array = np.zeros(6, np.float32)
    assert pin(array)
    assert not pin(array)  # registered already: refused, and the CUDA error cleared
    values.copy_into(ort.OrtValue.ortvalue_from_numpy(array), value)
    np.testing.assert_array_equal(array, np.arange(6, dtype=np.float32))
    array *= 2
    values.write(value, array, "the value")  # a CUDA copy after the refusal runs without a stale error
    np.testing.assert_array_equal(values.to_numpy(value), 2 * np.arange(6, dtype=np.float32))
