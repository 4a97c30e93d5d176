"""The tensors a checkpoint writes, each read only when it is written.

A :class:`TensorSource` knows a tensor's dtype and shape without its data,
and gives the data as little-endian pieces (:meth:`TensorSource.chunks`) or
as an array. :class:`ArraySource` wraps an array; :class:`InitializerSource`
reads a model's initializer where its data is (inline, in an external data
file, held by the caller's ``ModelProto``: :class:`onnxtrain.graph.external.TensorData`),
so that a checkpoint of a model of many gigabytes is written a tensor at a
time. :class:`LazyArrays` is the read-only mapping of a state whose arrays
are such sources: reading ``state.trainable[name]`` reads that tensor then.
"""

from __future__ import annotations

import math
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from types import MappingProxyType

import numpy as np
import onnx

from onnxtrain.graph.external import TensorData


class TensorSource(ABC):
    """A tensor's dtype and shape, and its data when asked."""

    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @abstractmethod
    def chunks(self) -> Iterator[bytes | memoryview]:
        """The data, little-endian and in C order, in pieces (read now)."""

    def array(self) -> np.ndarray:
        """The data as a read-only array in the machine's byte order, owning its memory (read now)."""
        array = np.empty(self.shape, self.dtype)
        flat = array.reshape(-1).view(np.uint8)
        position = 0
        for chunk in self.chunks():
            piece = np.frombuffer(chunk, np.uint8)
            flat[position : position + piece.size] = piece
            position += piece.size
        if position != self.nbytes:
            raise ValueError(f"{self} gave {position} bytes of data; its dtype and shape declare {self.nbytes}")
        if sys.byteorder == "big" and self.dtype.itemsize > 1:
            array.byteswap(inplace=True)
        array.setflags(write=False)
        return array


class ArraySource(TensorSource):
    """An array that is already in memory."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array
        self.dtype = array.dtype
        self.shape = tuple(array.shape)

    def chunks(self) -> Iterator[bytes | memoryview]:
        data = np.ascontiguousarray(self._array).reshape(-1)
        if sys.byteorder == "big" and data.dtype.itemsize > 1:
            data = data.byteswap()
        yield data.view(np.uint8).data

    def array(self) -> np.ndarray:
        return self._array


class InitializerSource(TensorSource):
    """An initializer of a model, read from where ``data`` says its data is (``where`` names it in errors)."""

    def __init__(self, tensor: onnx.TensorProto, data: TensorData, where: str = "") -> None:
        self._tensor = tensor
        self._data = data
        self._where = where
        self.dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
        self.shape = tuple(int(d) for d in tensor.dims)

    def chunks(self) -> Iterator[bytes | memoryview]:
        return self._data.chunks(self._tensor, self._where)

    def __repr__(self) -> str:
        return f"{self._where}tensor {self._tensor.name!r}"


class LazyArrays(Mapping[str, np.ndarray]):
    """Name -> array, each read from its :class:`TensorSource` whenever it is looked up (never kept)."""

    def __init__(self, sources: Mapping[str, TensorSource]) -> None:
        self._sources = MappingProxyType(dict(sources))

    def source(self, name: str) -> TensorSource:
        return self._sources[name]

    def __getitem__(self, name: str) -> np.ndarray:
        return self._sources[name].array()

    def __iter__(self) -> Iterator[str]:
        return iter(self._sources)

    def __len__(self) -> int:
        return len(self._sources)


def source_of(arrays: Mapping[str, np.ndarray], name: str) -> TensorSource:
    """The source of ``arrays[name]``: without reading it for a :class:`LazyArrays`."""
    if isinstance(arrays, LazyArrays):
        return arrays.source(name)
    return ArraySource(arrays[name])


__all__ = ["ArraySource", "InitializerSource", "LazyArrays", "TensorSource", "source_of"]
