"""OrtValues on a device, and NumPy copies of them, for every numeric element type.

onnxruntime's ``OrtValue.numpy()`` aliases CPU memory and cannot convert
bfloat16, and ``update_inplace`` checks neither dtype nor shape. These helpers
copy, check, and route bfloat16 through its bits (``uint16``).
"""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort

from onnxtrain.graph import dtypes
from onnxtrain.training.device import Device

_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
_BFLOAT16_CODE = onnx.TensorProto.BFLOAT16
_NUMPY_CONVERTIBLE_SPECIAL = frozenset({_BFLOAT16})  # ORT's .numpy() has no bfloat16


def elem_type_of(dtype: np.dtype) -> int:
    """The ONNX element type of a NumPy dtype."""
    return dtypes.to_elem_type(dtype)


def dtype_of(value: ort.OrtValue) -> np.dtype:
    """The NumPy dtype of a tensor OrtValue."""
    return dtypes.to_numpy_dtype(value.element_type())


def is_string(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is what ONNX's STRING tensors are in NumPy: ``object`` (each element a ``str``)."""
    return dtype.kind == "O"


def dtype_text(dtype: np.dtype) -> str:
    """A dtype's name in messages: ``float32``; ``string`` for ONNX's STRING (NumPy's ``object``)."""
    dtype = np.dtype(dtype)
    return "string" if is_string(dtype) else str(dtype)


def cast_hint(dtype: np.dtype) -> str:
    """The expression that makes an array of ``dtype`` with ``.astype(...)``: ``np.float32``,
    ``ml_dtypes.bfloat16``, ``object`` (NumPy 2 has no ``np.object``)."""
    dtype = np.dtype(dtype)
    if is_string(dtype):
        return "object"
    if dtype.type.__module__.split(".")[0] == "ml_dtypes":
        return f"ml_dtypes.{dtype.name}"
    return "np.bool_" if dtype.kind == "b" else f"np.{dtype.name}"  # np.bool is NumPy 2's only


def describe(dtype: np.dtype, shape: tuple[int, ...] | list[int]) -> str:
    """``float32[3, 4]``: a dtype and shape for messages (``string[3]`` for ONNX's STRING)."""
    return f"{dtype_text(dtype)}[{', '.join(str(d) for d in shape)}]"


def empty(shape: tuple[int, ...], dtype: np.dtype, device: Device) -> ort.OrtValue:
    """An uninitialised OrtValue of ``dtype`` and ``shape`` on ``device``, owned by onnxruntime."""
    dtype = np.dtype(dtype)
    element = elem_type_of(dtype) if dtype in _NUMPY_CONVERTIBLE_SPECIAL else dtype.type
    return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), element, device.type, device.id)


def _bits(array: np.ndarray) -> np.ndarray:
    """What ``update_inplace`` can read: the array itself, or bfloat16's bits as uint16; C-contiguous."""
    array = np.ascontiguousarray(array)
    return array.view(np.uint16) if array.dtype == _BFLOAT16 else array


def write(value: ort.OrtValue, array: np.ndarray, what: str) -> None:
    """Copy ``array`` into ``value`` in place; ``TypeError``/``ValueError`` unless dtype and shape match."""
    array = np.asarray(array)
    expected = dtype_of(value)
    if array.dtype.newbyteorder("=") != expected:
        raise TypeError(
            f"{what} is {describe(expected, value.shape())}; got {describe(array.dtype, array.shape)}: "
            f"cast it with .astype({cast_hint(expected)})"
        )
    if list(array.shape) != list(value.shape()):
        raise ValueError(f"{what} is {describe(expected, value.shape())}; got shape {list(array.shape)}")
    if array.size:
        value.update_inplace(_bits(array.astype(expected, copy=False)))


def from_numpy(array: np.ndarray, device: Device) -> ort.OrtValue:
    """A copy of ``array`` on ``device`` (never aliasing the array's memory)."""
    array = np.asarray(array)
    array = array.astype(array.dtype.newbyteorder("="), copy=False)
    value = empty(array.shape, array.dtype, device)
    if array.size:
        value.update_inplace(_bits(array))
    return value


class ParameterBuffer(ort.OrtValue):
    """A contiguous parameter buffer: an ``OrtValue`` whose ``device_name()`` is ONNX Runtime's training API's,
    the device's own name (``"Cpu"``, ``"Cuda"``), where onnxruntime's ``OrtValue`` lower-cases it."""

    def device_name(self) -> str:
        return str(self._ortvalue.device_name())


def parameter_buffer(value: ort.OrtValue) -> ParameterBuffer:
    """``value`` as a :class:`ParameterBuffer` over the same memory (and the same NumPy array, if any)."""
    return ParameterBuffer(value._ortvalue, getattr(value, "_numpy_obj", None))


def filled(shape: tuple[int, ...], dtype: np.dtype, fill: float, device: Device) -> ort.OrtValue:
    """An OrtValue of ``shape`` and ``dtype`` on ``device`` with every element ``fill``."""
    return from_numpy(np.full(shape, fill, dtype=dtype), device)


def needs_ortvalue(dtype: np.dtype) -> bool:
    """Whether arrays of ``dtype`` must be bound as OrtValues (:func:`input_value`): bfloat16.

    A cheap test first: NumPy's own numeric dtypes are never of kind ``"V"``.
    """
    return dtype.kind == "V" and dtype == _BFLOAT16


def input_value(array: np.ndarray) -> ort.OrtValue | None:
    """A CPU OrtValue viewing ``array`` for dtypes ``IOBinding.bind_cpu_input`` rejects (bfloat16), else None."""
    if array.dtype != _BFLOAT16:
        return None
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(_bits(array), elem_type_of(_BFLOAT16))


def to_numpy(value: ort.OrtValue, *, copy: bool = True) -> np.ndarray:
    """The tensor's data as a NumPy array (a copy unless ``copy=False``; bfloat16 always copies)."""
    if value.element_type() != _BFLOAT16_CODE:
        array = value.numpy()
        return np.array(array, copy=True) if copy else array
    dtype = _BFLOAT16
    shape = tuple(value.shape())
    if value.device_name().lower() != "cpu":
        host = empty(shape, dtype, Device("cpu"))
        copy_into(host, value)
        value = host
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.zeros(shape, dtype)
    raw = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    return np.frombuffer(raw, dtype=np.uint16).copy().view(dtype).reshape(shape)


def copy(value: ort.OrtValue, device: Device) -> ort.OrtValue:
    """A copy of ``value`` on ``device``."""
    result = empty(tuple(value.shape()), dtype_of(value), device)
    if int(np.prod(value.shape(), dtype=np.int64)):
        copy_into(result, value)
    return result


def copy_into(target: ort.OrtValue, source: ort.OrtValue) -> None:
    """Copy ``source`` into ``target`` (same type and shape, any devices): ``target.update_inplace(source)``,
    where onnxruntime <= 1.23 takes only NumPy arrays: then a CPU source goes through a NumPy view of its
    memory, any other through ``onnxruntime.copy_tensors``."""
    try:
        target.update_inplace(source)
    except TypeError:
        if source.device_name().lower() != "cpu":
            ort.copy_tensors([source], [target], None)
        else:
            target.update_inplace(_bits(to_numpy(source, copy=False)))


def on_device(value: ort.OrtValue, device: Device) -> bool:
    """Whether ``value`` lives on ``device``."""
    return value.device_name().lower() == device.type  # onnxruntime names the kind of device only


__all__ = [
    "cast_hint",
    "copy",
    "copy_into",
    "describe",
    "dtype_of",
    "dtype_text",
    "elem_type_of",
    "empty",
    "filled",
    "from_numpy",
    "input_value",
    "is_string",
    "needs_ortvalue",
    "on_device",
    "to_numpy",
    "write",
]
