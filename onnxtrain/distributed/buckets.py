r"""Buckets: the state tensors of one element type, all-reduced as one flat buffer.

A bucket keeps its flat buffer from step to step and reads the tensors'
current values at each :meth:`reduce` (a step swaps a tensor's two buffers,
so the values move). Where the sum is a mean, the scale ``1 / ranks`` is
applied on the way back. Two kinds:

- :class:`HostBucket`: the flat buffer is a NumPy array. onnxruntime copies
  each value into its slice (from a GPU: one device-to-host copy),
  ``Allreduce`` sums the array in place, and each slice comes back scaled (on
  the CPU, multiplied straight into the value's memory; to a GPU, one
  host-to-device copy, from page-locked memory). On the CPU that is two
  passes over the gradients; float16 and bfloat16 are summed in float32.
- :class:`DeviceBucket`: the flat buffer is an ``OrtValue`` on the tensors'
  device. onnxruntime packs it (``Concat`` of the flattened values) and
  unpacks it (``Mul`` by the scale, then one ``Slice`` and ``Reshape`` per
  value, written over the values), and ``Allreduce`` sums it where it lies: on a
  GPU, with an MPI library built CUDA-aware, the gradients never reach host
  memory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from onnxtrain.distributed.communicator import mpi
from onnxtrain.graph import ops
from onnxtrain.graph.builder import tensor_type
from onnxtrain.graph.context import empty_base
from onnxtrain.sessions import inference_session
from onnxtrain.training import values
from onnxtrain.training.device import Device
from onnxtrain.training.pinned import pin
from onnxtrain.training.store import StateTensor

CPU = Device("cpu")
#: Element types MPI sums natively; others (float16, bfloat16) are summed in float32.
NATIVE = (np.dtype(np.float32), np.dtype(np.float64))


def wire_type(dtype: np.dtype) -> np.dtype:
    """The element type a bucket of ``dtype`` is summed in: ``dtype`` itself, or float32 for float16 and bfloat16."""
    dtype = np.dtype(dtype)
    return dtype if dtype in NATIVE else np.dtype(np.float32)


class Bucket(Protocol):
    """Tensors of one element type on one device, summed over the ranks in one ``Allreduce``."""

    tensors: Sequence[StateTensor]

    @property
    def nbytes(self) -> int:
        """The bytes each rank sends per :meth:`reduce` (the flat buffer's size)."""

    def reduce(self, comm: Any, scale: float) -> None:
        """Replace each tensor's value with its sum over the ranks of ``comm``, times ``scale``."""


class HostBucket:
    """A bucket whose flat buffer is a NumPy array (see the module docstring)."""

    def __init__(self, tensors: Sequence[StateTensor]) -> None:
        self.tensors = list(tensors)
        self.dtype = np.dtype(self.tensors[0].dtype)
        self.flat = np.empty(sum(t.size for t in self.tensors), wire_type(self.dtype))
        ends = np.cumsum([t.size for t in self.tensors])
        self.slices = [self.flat[e - t.size : e].reshape(t.shape) for e, t in zip(ends, self.tensors, strict=True)]
        # CPU OrtValues over the slices (onnxruntime aliases a CPU array's memory): a value of the bucket's
        # own type is copied into its slice by onnxruntime, from any device, without a NumPy copy first.
        direct = self.dtype == self.flat.dtype and not values.needs_ortvalue(self.dtype)
        self.views = [ort.OrtValue.ortvalue_from_numpy(s) if direct and s.size else None for s in self.slices]
        # on the CPU, the sum is scaled straight into the values' memory (a CPU OrtValue's NumPy array aliases
        # it): one pass back instead of scaling the flat buffer, then copying
        self.scaled_in_place = direct and all(t.device == CPU for t in self.tensors)
        # for values on a GPU, page-locked: the copies each way run about three times faster
        self.pinned = any(t.device is not None and t.device.type == "cuda" for t in self.tensors) and pin(self.flat)

    @property
    def nbytes(self) -> int:
        return int(self.flat.nbytes)

    def reduce(self, comm: Any, scale: float) -> None:
        for tensor, target, view in zip(self.tensors, self.slices, self.views, strict=True):
            assert tensor.value is not None, "place the state on a device first"
            if view is not None:
                values.copy_into(view, tensor.value)
            elif target.size:
                target[...] = values.to_numpy(tensor.value, copy=False)
        comm.Allreduce(mpi().IN_PLACE, self.flat, op=mpi().SUM)
        factor = self.flat.dtype.type(scale)
        if self.scaled_in_place:
            for tensor, source in zip(self.tensors, self.slices, strict=True):
                np.multiply(source, factor, out=values.to_numpy(tensor.value, copy=False))
            return
        if scale != 1:
            np.multiply(self.flat, factor, out=self.flat)
        for tensor, source in zip(self.tensors, self.slices, strict=True):
            assert tensor.value is not None
            values.write(tensor.value, source.astype(self.dtype, copy=False), "a reduced tensor")


class CudaBuffer:
    """An ``OrtValue``'s memory on a GPU as mpi4py takes it: through ``__cuda_array_interface__`` (version 3)."""

    def __init__(self, value: ort.OrtValue) -> None:
        dtype = values.dtype_of(value)
        self.__cuda_array_interface__ = {
            "shape": tuple(value.shape()),
            "typestr": dtype.str,
            "data": (value.data_ptr(), False),
            "strides": None,
            "version": 3,
        }


class DeviceBucket:
    """A bucket whose flat buffer lies on the tensors' device, packed and unpacked by onnxruntime (see the module
    docstring). On the CPU, ``Allreduce`` reads a NumPy view of it; on a GPU, its device pointer, which needs
    an MPI library built CUDA-aware."""

    def __init__(self, tensors: Sequence[StateTensor], device: Device) -> None:
        self.tensors = list(tensors)
        self.device = device
        self.dtype = np.dtype(self.tensors[0].dtype)
        wire = wire_type(self.dtype)
        sizes = [t.size for t in self.tensors]
        self.flat = values.empty((sum(sizes),), wire, device)
        self.scale = values.empty((), wire, device)
        self._scale = 1.0
        values.write(self.scale, np.ones((), wire), "the scale")
        providers, options = device.providers(), _copy_options()
        self.pack = inference_session(_pack_model(self.tensors, wire).SerializeToString(), options, providers)
        self.unpack = inference_session(_unpack_model(self.tensors, wire).SerializeToString(), options, providers)
        if device.type == "cpu":
            self.buffer: Any = values.to_numpy(self.flat, copy=False)
        else:
            self.buffer = CudaBuffer(self.flat)

    @property
    def nbytes(self) -> int:
        return int(self.flat.tensor_size_in_bytes())

    def reduce(self, comm: Any, scale: float) -> None:
        if scale != self._scale:
            values.write(self.scale, np.asarray(scale, values.dtype_of(self.scale)), "the scale")
            self._scale = scale
        pack = self.pack.io_binding()
        for index, tensor in enumerate(self.tensors):
            assert tensor.value is not None, "place the state on a device first"
            pack.bind_ortvalue_input(f"value{index}", tensor.value)
        pack.bind_ortvalue_output("flat", self.flat)
        self.pack.run_with_iobinding(pack)
        comm.Allreduce(mpi().IN_PLACE, self.buffer, op=mpi().SUM)
        unpack = self.unpack.io_binding()
        unpack.bind_ortvalue_input("flat", self.flat)
        unpack.bind_ortvalue_input("scale", self.scale)
        for index, tensor in enumerate(self.tensors):
            assert tensor.value is not None
            unpack.bind_ortvalue_output(f"value{index}", tensor.value)
        self.unpack.run_with_iobinding(unpack)


def _copy_options() -> ort.SessionOptions:
    """Sessions that only copy: one thread that does not spin (each rank's own sessions have the cores; a
    spinning pool per rank would take them from the other ranks on the same machine)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def _pack_model(tensors: Sequence[StateTensor], wire: np.dtype) -> Any:
    """``flat = Concat(Reshape(Cast(value_i, wire), [-1]) for each i)``."""
    with empty_base() as b:
        elem, wire_elem = values.elem_type_of(tensors[0].dtype), values.elem_type_of(wire)
        flat_shape = ops.int64s(b, [-1], "flat_shape")
        parts = []
        for index, tensor in enumerate(tensors):
            value = b.add_input(f"value{index}", tensor_type(elem, list(tensor.shape)))
            if wire_elem != elem:
                value = b.add_node1("Cast", [value], to=wire_elem)
            parts.append(b.add_node1("Reshape", [value, flat_shape]))
        b.add_node("Concat", parts, ["flat"], axis=0)
        b.set_outputs(["flat"])
        return b.finalize()


def _unpack_model(tensors: Sequence[StateTensor], wire: np.dtype) -> Any:
    """``value_i = Cast(Reshape(Slice(flat, start_i, end_i) * scale, shape_i), type)`` for each i."""
    with empty_base() as b:
        elem, wire_elem = values.elem_type_of(tensors[0].dtype), values.elem_type_of(wire)
        total = sum(t.size for t in tensors)
        flat = b.add_input("flat", tensor_type(wire_elem, [total]))
        scale = b.add_input("scale", tensor_type(wire_elem, []))
        scaled = b.add_node1("Mul", [flat, scale])
        outputs, start = [], 0
        for index, tensor in enumerate(tensors):
            end = start + math.prod(tensor.shape)
            part = b.add_node1("Slice", [scaled, ops.int64s(b, [start], "start"), ops.int64s(b, [end], "end")])
            name = f"value{index}"
            if wire_elem != elem:
                part = b.add_node1("Cast", [part], to=elem)
            b.add_node("Reshape", [part, ops.int64s(b, list(tensor.shape), "shape")], [name], allowzero=1)
            outputs.append(name)
            start = end
        b.set_outputs(outputs)
        return b.finalize()


__all__ = ["NATIVE", "Bucket", "CudaBuffer", "DeviceBucket", "HostBucket", "wire_type"]
