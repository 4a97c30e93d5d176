"""The buckets of ``DistributedOptimizer`` in one process: a stand-in communicator plays the other ranks."""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("mpi4py", reason="the MPI extra is not installed: pip install -e '.[mpi]'")

from onnxtrain.distributed import DistributedOptimizer
from onnxtrain.distributed import optimizer as distributed_optimizer
from onnxtrain.distributed.buckets import DeviceBucket, HostBucket, wire_type
from onnxtrain.training import values
from onnxtrain.training.device import Device
from onnxtrain.training.pinned import cuda_runtime
from onnxtrain.training.store import StateTensor

CPU = Device("cpu")
DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
SHAPES = st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)


@dataclass
class OtherRanks:
    """``Allreduce(IN_PLACE, buffer, SUM)`` as if ``ranks - 1`` other ranks each held ``other`` everywhere."""

    ranks: int
    other: float
    calls: int = 0

    def Allreduce(self, _in_place: Any, buffer: Any, op: Any) -> None:  # mpi4py's name
        if hasattr(buffer, "__cuda_array_interface__"):  # as a CUDA-aware MPI: through the device pointer
            with device_memory(buffer.__cuda_array_interface__) as host:
                np.add(host, (self.ranks - 1) * self.other, out=host)
        else:
            np.add(buffer, (self.ranks - 1) * self.other, out=buffer)
        self.calls += 1

    def Get_size(self) -> int:
        return self.ranks


@contextlib.contextmanager
def device_memory(interface: dict[str, Any]) -> Iterator[np.ndarray]:
    """The GPU memory ``interface`` (``__cuda_array_interface__``) describes, as a host array written back after
    (``cudaMemcpy`` from the CUDA runtime onnxruntime's CUDA provider has loaded)."""
    assert interface["version"] == 3 and interface["strides"] is None and not interface["data"][1]
    host = np.empty(interface["shape"], np.dtype(interface["typestr"]))
    runtime = cuda_runtime()
    assert runtime is not None
    pointer, size = ctypes.c_void_p(interface["data"][0]), ctypes.c_size_t(host.nbytes)
    assert runtime.cudaMemcpy(host.ctypes.data_as(ctypes.c_void_p), pointer, size, 2) == 0  # device to host
    yield host
    assert runtime.cudaMemcpy(pointer, host.ctypes.data_as(ctypes.c_void_p), size, 1) == 0  # host to device


def placed(array: np.ndarray, device: Device = CPU) -> StateTensor:
    tensor = StateTensor(array)
    tensor.place(device)
    return tensor


@settings(max_examples=25, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    shapes=st.lists(SHAPES, min_size=1, max_size=4),
    ranks=st.integers(1, 4),
    average=st.booleans(),
    on_device=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_a_bucket_replaces_each_value_with_its_sum_over_the_ranks_times_the_scale(
    dtype: np.dtype, shapes: list[tuple[int, ...]], ranks: int, average: bool, on_device: bool, seed: int
) -> None:
    check_bucket(CPU, on_device, dtype, shapes, ranks, average, seed)


@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="no CUDA here")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_host_bucket_reduces_values_on_a_gpu(dtype: np.dtype) -> None:
    """One device-to-host copy into the flat buffer and one back per value (the stand-in sums host memory)."""
    bucket = check_bucket(Device("cuda", 0), False, dtype, [(3, 4), (0,), (), (5,)], 3, True, 7)
    assert isinstance(bucket, HostBucket) and bucket.pinned  # page-locked for the copies to and from the GPU


@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="no CUDA here")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_device_bucket_on_a_gpu_hands_mpi_its_flat_buffer_in_device_memory(dtype: np.dtype) -> None:
    """Packed and unpacked by onnxruntime on the GPU; the stand-in sums through the device pointer, as a
    CUDA-aware MPI does, and mpi4py takes the buffer (a one-rank in-place all-reduce leaves it as it is)."""
    from mpi4py import MPI

    check_bucket(Device("cuda", 0), True, dtype, [(3, 4), (0,), (), (5,)], 3, True, 7)
    tensors = [placed(np.ones(4, dtype), Device("cuda", 0))]
    bucket = DeviceBucket(tensors, Device("cuda", 0))
    bucket.reduce(MPI.COMM_SELF, 1.0)
    assert np.array_equal(tensors[0].numpy(), np.ones(4, dtype))


def check_bucket(
    device: Device,
    on_device: bool,
    dtype: np.dtype,
    shapes: list[tuple[int, ...]],
    ranks: int,
    average: bool,
    seed: int,
) -> None:
    """Twice, with the values' buffers swapped in between (a step moves them): the bucket reads the current ones."""
    rng = np.random.default_rng(seed)
    tensors = [placed(rng.standard_normal(shape).astype(dtype), device) for shape in shapes]
    bucket = DeviceBucket(tensors, device) if on_device else HostBucket(tensors)
    comm = OtherRanks(ranks, other=0.5)
    scale = 1 / ranks if average else 1.0
    wire = wire_type(dtype)
    for _ in range(2):
        before = [t.numpy() for t in tensors]
        bucket.reduce(comm, scale)
        for tensor, start in zip(tensors, before, strict=True):
            expected = ((start.astype(wire) + wire.type((ranks - 1) * 0.5)) * wire.type(scale)).astype(dtype)
            got = tensor.numpy()
            assert got.dtype == dtype and got.shape == start.shape
            np.testing.assert_array_equal(got.astype(np.float64), expected.astype(np.float64))
        for tensor in tensors:  # the next step writes the spares and swaps
            values.write(tensor.spare(), tensor.numpy() * 2, "the spare")
            tensor.swap()
    assert comm.calls == 2
    assert bucket.nbytes == sum(int(np.prod(s)) for s in shapes) * wire.itemsize
    assert not (isinstance(bucket, HostBucket) and device == CPU and bucket.pinned)  # the CPU's copies need none
    return bucket


def _stand_in(tensors: dict[str, StateTensor], device: Device = CPU) -> SimpleNamespace:
    """What ``DistributedOptimizer.step`` reads of an optimizer, its module and the module's state."""
    store = SimpleNamespace(gradient_status="ready", settle=lambda: None, gradients=tensors, tensors={})
    module = SimpleNamespace(
        device=device, state=SimpleNamespace(store=store), io=SimpleNamespace(trainable=list(tensors), statistics=[])
    )
    steps: list[int] = []
    return SimpleNamespace(module=module, step=lambda: steps.append(1), steps=steps)


def test_one_all_reduce_per_element_type_and_the_buckets_kept_from_step_to_step() -> None:
    gradients = {
        "a": placed(np.ones((2, 3), np.float32)),
        "b": placed(np.ones(4, np.float64)),
        "c": placed(np.ones(5, np.float32)),
    }
    wrapped = _stand_in(gradients)
    optimizer = DistributedOptimizer(wrapped, comm=OtherRanks(2, other=3.0))
    optimizer.step()
    _, buckets = optimizer._buckets["gradients"]
    assert [[t.dtype for t in b.tensors] for b in buckets] == [[np.float32, np.float32], [np.float64]]
    assert optimizer._comm.calls == 2 and wrapped.steps == [1]
    assert all(np.array_equal(t.numpy(), np.full(t.shape, 2.0)) for t in gradients.values())  # (1 + 3) / 2
    optimizer.step()
    assert optimizer._buckets["gradients"][1] is buckets  # the same flat buffers
    assert optimizer.reduced_bytes == 2 * (11 * 4 + 4 * 8) and optimizer.reduce_seconds > 0


def test_reducing_on_a_gpu_with_an_mpi_that_is_not_cuda_aware_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distributed_optimizer, "cuda_aware", lambda: False)
    optimizer = DistributedOptimizer(_stand_in({}, Device("cuda", 0)), comm=OtherRanks(2, 0.0), reduce_on_device=True)
    with pytest.raises(RuntimeError, match=r"needs an MPI library built CUDA-aware.*reduce_on_device=None or False"):
        optimizer.step()
    assert not DistributedOptimizer(_stand_in({}, Device("cuda", 0)), comm=OtherRanks(2, 0.0)).reduces_on_device


def test_reduce_on_device_must_be_a_bool_or_none() -> None:
    with pytest.raises(TypeError, match="reduce_on_device must be None, True or False, not 'yes'"):
        DistributedOptimizer(_stand_in({}), comm=OtherRanks(2, 0.0), reduce_on_device="yes")  # type: ignore[arg-type]
