"""Tensor data a model declares, checked against the data it has: inline sizes and external-data locations.

A tensor's ``dims`` promise ``prod(dims)`` elements. Inline, the bytes (or
typed values) must be exactly that many; stored externally
(``data_location = EXTERNAL``), the entry ``location`` names a file relative to
the model's folder, and ``offset``/``length`` a byte range inside it. onnxtrain
resolves every location itself instead of trusting the installed ``onnx``:

- the location is relative, has no ``..`` part, and the file it names, with
  every symlink on the way resolved, lies inside the model's folder;
- it is a regular file holding the declared byte range, and the range holds
  exactly the bytes the dims declare.

Anything else is a ``ValueError`` naming the tensor and the location, raised
before a byte is read or allocated.

A model read lightly (:func:`onnxtrain.graph.io.load_light`) keeps its large
tensors where they are: in the files beside a model given as a path, or in the
caller's ``ModelProto``, which its copy refers to by *held stubs* (tensors
marked external at :data:`HELD_LOCATION`). :class:`TensorData` says where a
light model's data is, and reads it a tensor at a time, in pieces of at most
:data:`CHUNK_BYTES`, when it is written out.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.external_data_helper import uses_external_data

from onnxtrain.graph import dtypes
from onnxtrain.graph.walk import subgraphs

#: Elements per byte of the packed sub-byte types (their raw data holds ``ceil(n / k)`` bytes).
_PACKED: dict[int, int] = {onnx.TensorProto.INT4: 2, onnx.TensorProto.UINT4: 2}
for _name, _per_byte in (("FLOAT4E2M1", 2), ("INT2", 4), ("UINT2", 4)):
    if hasattr(onnx.TensorProto, _name):
        _PACKED[getattr(onnx.TensorProto, _name)] = _per_byte
del _name, _per_byte

_COMPLEX = {onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128}


def declared_elements(tensor: onnx.TensorProto) -> int:
    """``prod(tensor.dims)``; ``ValueError`` for a negative dimension."""
    if any(d < 0 for d in tensor.dims):
        raise ValueError(f"tensor {tensor.name!r} declares a negative dimension: {list(tensor.dims)}")
    return math.prod(tensor.dims)


def declared_nbytes(tensor: onnx.TensorProto) -> int | None:
    """The bytes of raw data ``tensor``'s type and dims declare (``None`` for strings)."""
    if tensor.data_type == onnx.TensorProto.STRING:
        return None
    count = declared_elements(tensor)
    if tensor.data_type in _PACKED:
        return -(-count // _PACKED[tensor.data_type])
    try:
        itemsize = dtypes.to_numpy_dtype(tensor.data_type).itemsize
    except (KeyError, ValueError, TypeError) as error:
        raise ValueError(f"tensor {tensor.name!r} has the unknown element type {tensor.data_type}") from error
    return count * itemsize


def _typed_values_expected(tensor: onnx.TensorProto) -> int:
    """How many values the typed field (``float_data``, ``int32_data``, ...) must hold."""
    count = declared_elements(tensor)
    if tensor.data_type in _PACKED:
        return -(-count // _PACKED[tensor.data_type])
    return 2 * count if tensor.data_type in _COMPLEX else count


def check_inline(tensor: onnx.TensorProto, where: str = "") -> None:
    """``ValueError`` unless the inline data of ``tensor`` is exactly what its dims declare."""
    label = f"{where}tensor {tensor.name!r} {dtypes.dtype_name(tensor.data_type)}{list(tensor.dims)}"
    expected_bytes = declared_nbytes(tensor)  # checks the element type and the dims first
    if tensor.HasField("raw_data"):
        if expected_bytes is not None and len(tensor.raw_data) != expected_bytes:
            raise ValueError(
                f"{label} declares {expected_bytes} bytes of data but holds {len(tensor.raw_data)}: "
                "the model file is truncated or corrupt"
            )
        return
    field = helper.tensor_dtype_to_field(tensor.data_type)
    present = len(getattr(tensor, field))
    expected = _typed_values_expected(tensor)
    if present != expected:
        raise ValueError(
            f"{label} declares {expected} values but holds {present} in {field}: the model file is truncated or corrupt"
        )


@dataclass(frozen=True)
class ExternalData:
    """Where a tensor's external data is: a checked file inside the model's folder, and a byte range."""

    path: Path
    offset: int
    length: int


def _bad_location(location: str) -> str | None:
    """Why ``location`` may not be followed, or ``None`` when it is a plain relative path."""
    if not location:
        return "it is empty"
    if "\0" in location:
        return "it contains a NUL character"
    if PurePosixPath(location).is_absolute() or PureWindowsPath(location).is_absolute() or location[0] in "/\\":
        return "it is an absolute path"
    if PureWindowsPath(location).drive:
        return "it names a drive"
    if ".." in location.replace("\\", "/").split("/"):
        return "it climbs out of the model's folder with '..'"
    return None


def locate(tensor: onnx.TensorProto, base_dir: str | os.PathLike[str] | None, where: str = "") -> ExternalData:
    """The checked file and byte range of ``tensor``'s external data, relative to ``base_dir``.

    ``ValueError`` (naming the tensor and its location) when there is no
    folder to resolve against, when the location is absolute, climbs with
    ``..``, or resolves (through symlinks) outside ``base_dir``, when it is not
    a regular file, or when the byte range is outside the file or not the
    size the tensor's dims declare. Nothing is read.
    """
    entries = {entry.key: entry.value for entry in tensor.external_data}
    location = entries.get("location", "")
    label = f"{where}tensor {tensor.name!r} (external data at {location!r})"
    if base_dir is None:
        raise ValueError(
            f"{label} keeps its data in a file, and a ModelProto has no folder to find it in: pass the path "
            "of the .onnx file instead (its data is read from the file's folder), or load the model with "
            "onnx.load(path) so that its data is inside it"
        )
    reason = _bad_location(location)
    if reason is not None:
        raise ValueError(
            f"{label}: the location may not be followed: {reason}; keep external data in the model's folder"
        )
    folder = os.path.realpath(base_dir)
    resolved = os.path.realpath(os.path.join(folder, location))
    if os.path.commonpath([folder, resolved]) != folder:
        raise ValueError(
            f"{label}: the location resolves to {resolved}, outside the model's folder {folder} (through a symlink); "
            "keep external data in the model's folder"
        )
    if not os.path.isfile(resolved):
        raise ValueError(f"{label}: no such file in {folder}")
    offset = _non_negative(entries.get("offset", "0"), "offset", label)
    size = os.path.getsize(resolved)
    length = _non_negative(entries["length"], "length", label) if "length" in entries else size - offset
    if offset + length > size or length < 0:
        raise ValueError(f"{label}: bytes {offset}..{offset + length} lie outside the file ({size} bytes)")
    expected = declared_nbytes(tensor)
    if expected is None:
        raise ValueError(f"{label}: string tensors cannot be stored as external data")
    if length != expected:
        raise ValueError(
            f"{label}: {length} bytes are stored, but {dtypes.dtype_name(tensor.data_type)}{list(tensor.dims)} "
            f"declares {expected}: the data file does not belong to this model"
        )
    return ExternalData(Path(resolved), offset, length)


def _non_negative(text: str, key: str, label: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{label}: its {key} {text!r} is not an integer") from None
    if value < 0:
        raise ValueError(f"{label}: its {key} {value} is negative")
    return value


def read_bytes(found: ExternalData, start: int, count: int, label: str) -> bytes:
    """``count`` bytes of ``found``'s range from ``start`` on (every read of external data goes through here);
    ``ValueError`` naming ``label`` when the file ended early."""
    with open(found.path, "rb") as file:
        file.seek(found.offset + start)
        data = file.read(count)
    if len(data) != count:
        raise ValueError(f"{label}: {found.path} ended early (changed while reading)")
    return data


def read_external(tensor: onnx.TensorProto, base_dir: str | os.PathLike[str] | None, where: str = "") -> None:
    """Move ``tensor``'s external data inside it (``raw_data``), in place, after :func:`locate` checked it."""
    found = locate(tensor, base_dir, where)
    tensor.raw_data = read_bytes(found, 0, found.length, f"{where}tensor {tensor.name!r}")
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT


def model_tensors(model: onnx.ModelProto) -> Iterator[tuple[onnx.TensorProto, str]]:
    """Every tensor the model stores (initializers, sparse ones, Constant and other tensor attributes,
    in subgraphs and functions too), with where it is for error messages."""
    yield from _graph_tensors(model.graph, "")
    for function in model.functions:
        for node in function.node:
            yield from _node_tensors(node, f"function {function.name!r}: ")


def _graph_tensors(graph: onnx.GraphProto, where: str) -> Iterator[tuple[onnx.TensorProto, str]]:
    for tensor in graph.initializer:
        yield tensor, where
    for sparse in graph.sparse_initializer:
        yield sparse.values, where
        yield sparse.indices, where
    for node in graph.node:
        yield from _node_tensors(node, where)


def _node_tensors(node: onnx.NodeProto, where: str) -> Iterator[tuple[onnx.TensorProto, str]]:
    inner = f"{where}node {node.name or node.op_type!r}: "
    for attribute in node.attribute:
        if attribute.HasField("t"):
            yield attribute.t, inner
        yield from ((tensor, inner) for tensor in attribute.tensors)
        if attribute.HasField("sparse_tensor"):
            yield attribute.sparse_tensor.values, inner
            yield attribute.sparse_tensor.indices, inner
    for graph in subgraphs(node):
        yield from _graph_tensors(graph, inner)


def check_model_data(model: onnx.ModelProto, base_dir: str | os.PathLike[str] | None) -> None:
    """``ValueError`` unless every tensor of ``model`` holds the data its dims declare (see module doc)."""
    for tensor, where in model_tensors(model):
        if uses_external_data(tensor):
            locate(tensor, base_dir, where)
        else:
            check_inline(tensor, where)


def load_external_data(model: onnx.ModelProto, base_dir: str | os.PathLike[str] | None) -> None:
    """Read every external tensor of ``model`` into it, in place, each checked by :func:`locate` first."""
    for tensor, where in model_tensors(model):
        if uses_external_data(tensor):
            read_external(tensor, base_dir, where)


def has_external_data(model: onnx.ModelProto) -> bool:
    """Whether any tensor of ``model`` keeps its data in a file."""
    return any(uses_external_data(tensor) for tensor, _ in model_tensors(model))


#: The location of a held stub: its data is the tensor at index ``offset`` of :attr:`TensorData.held`.
HELD_LOCATION = "<held by the caller's ModelProto>"
#: The location of a stub of a constant the training runtime holds once for all its sessions
#: (:mod:`onnxtrain.training.constants`).
SHARED_LOCATION = "<shared by the runtime's sessions>"
#: The most bytes read or copied at once when tensor data is streamed.
CHUNK_BYTES = 16 * 2**20
#: The tensor fields that hold data; a stub keeps every other field (name, type, dims, doc string).
DATA_FIELDS = frozenset(
    {"raw_data", "float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data"}
    | {"external_data", "data_location"}
)


def held_stub(tensor: onnx.TensorProto, index: int) -> onnx.TensorProto:
    """A tensor with ``tensor``'s name, type, dims and doc string whose data is ``held[index]`` of a
    :class:`TensorData` (marked external at :data:`HELD_LOCATION`, so that nothing reads it as inline data)."""
    stub = onnx.TensorProto()
    copy_fields(tensor, stub, DATA_FIELDS)
    stub.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", HELD_LOCATION), ("offset", str(index)), ("length", str(declared_nbytes(tensor)))):
        stub.external_data.add(key=key, value=value)
    return stub


Message = onnx.ModelProto | onnx.GraphProto | onnx.TensorProto


def copy_fields(source: Message, target: Message, skipped: Collection[str]) -> None:
    """Copy every field of ``source`` but those named in ``skipped`` into ``target``, an empty message of its type."""
    for descriptor, value in source.ListFields():
        if descriptor.name in skipped:
            continue
        field = getattr(target, descriptor.name)
        if hasattr(field, "extend"):  # a repeated field
            field.extend(value)
        elif descriptor.type == descriptor.TYPE_MESSAGE:
            field.CopyFrom(value)
        else:
            setattr(target, descriptor.name, value)


def location_of(tensor: onnx.TensorProto) -> str:
    """The ``location`` entry of ``tensor``'s external data (``""`` when it has none)."""
    return next((entry.value for entry in tensor.external_data if entry.key == "location"), "")


def _held_index(tensor: onnx.TensorProto) -> int | None:
    """The index in :attr:`TensorData.held` that ``tensor``, a held stub (:func:`held_stub`), stands for;
    ``None`` for any other tensor."""
    if not uses_external_data(tensor) or location_of(tensor) != HELD_LOCATION:
        return None
    return int(next(entry.value for entry in tensor.external_data if entry.key == "offset"))


@dataclass(frozen=True)
class TensorData:
    """Where the data of a light model's external tensors is, and its reader.

    ``base_dir``: the folder of a model read from a path, where its external
    data files are (``None`` for a ``ModelProto``); ``held``: the tensors of the
    caller's ``ModelProto`` that its held stubs stand for (never changed, never
    copied whole: a stub's data is read from its tensor when it is written).
    """

    base_dir: Path | None = None
    held: tuple[onnx.TensorProto, ...] = ()

    def _held(self, tensor: onnx.TensorProto) -> onnx.TensorProto | None:
        index = _held_index(tensor)
        return None if index is None else self.held[index]

    def reaches(self, tensor: onnx.TensorProto) -> bool:
        """Whether ``tensor``'s data is inline, a held tensor of this set, or in a file with a folder to find it
        in (:meth:`check` checks the file)."""
        if not uses_external_data(tensor):
            return True
        index = _held_index(tensor)
        if index is not None:
            return index < len(self.held)
        return self.base_dir is not None

    def check(self, tensor: onnx.TensorProto, where: str = "") -> None:
        """``ValueError`` unless the data of ``tensor``, marked external, can be read (:func:`locate`), reading none."""
        if self._held(tensor) is None:
            locate(tensor, self.base_dir, where)

    def has_raw_data(self, tensor: onnx.TensorProto) -> bool:
        """Whether ``tensor``, loaded (:meth:`load`), holds ``raw_data`` (a held tensor may hold typed values)."""
        source = self._held(tensor)
        return (source or tensor).HasField("raw_data") or (source is None and uses_external_data(tensor))

    def chunks(self, tensor: onnx.TensorProto, where: str = "") -> Iterator[bytes]:
        """``tensor``'s data as little-endian bytes (what ``raw_data`` holds), in pieces of at most
        :data:`CHUNK_BYTES` where it is read from a file; ``ValueError`` as :func:`locate` says."""
        source = self._held(tensor)
        if source is None and uses_external_data(tensor):
            found = locate(tensor, self.base_dir, where)
            label = f"{where}tensor {tensor.name!r}"
            for start in range(0, found.length, CHUNK_BYTES):
                yield read_bytes(found, start, min(CHUNK_BYTES, found.length - start), label)
            return
        source = tensor if source is None else source
        if source.HasField("raw_data"):
            yield source.raw_data
        else:
            yield little_endian(numpy_helper.to_array(source))

    def elements(
        self, tensor: onnx.TensorProto, positions: Sequence[int], itemsize: int, where: str = ""
    ) -> list[bytes]:
        """The little-endian bytes of ``tensor``'s elements at the flat ``positions`` (``itemsize`` bytes each),
        read one by one where the data is in a file; ``ValueError`` as :func:`locate` says."""
        source = self._held(tensor)
        if source is None and uses_external_data(tensor):
            found = locate(tensor, self.base_dir, where)
            with open(found.path, "rb") as file:
                picked = []
                for position in positions:
                    file.seek(found.offset + position * itemsize)
                    picked.append(file.read(itemsize))
            if any(len(element) != itemsize for element in picked):
                raise ValueError(f"{where}tensor {tensor.name!r}: {found.path} ended early (changed while reading)")
            return picked
        source = tensor if source is None else source
        data = source.raw_data if source.HasField("raw_data") else little_endian(numpy_helper.to_array(source))
        return [bytes(data[position * itemsize : (position + 1) * itemsize]) for position in positions]

    def loaded_header(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        """``tensor`` as :meth:`load` leaves it, without its ``raw_data`` (for a tensor :meth:`has_raw_data`)."""
        source = self._held(tensor)
        header = onnx.TensorProto()
        if source is None:
            copy_fields(tensor, header, DATA_FIELDS)
            header.data_location = onnx.TensorProto.DEFAULT  # as read_external leaves it
        else:
            copy_fields(source, header, {"raw_data"})
            header.name = tensor.name
        return header

    def load(self, tensor: onnx.TensorProto, where: str = "") -> None:
        """Put ``tensor``'s data inside it, in place: read from its file (:func:`read_external`), or copied
        from the caller's tensor it stands for. A tensor that holds its data is left as it is."""
        source = self._held(tensor)
        if source is not None:
            name = tensor.name
            tensor.CopyFrom(source)
            tensor.name = name
        elif uses_external_data(tensor):
            read_external(tensor, self.base_dir, where)

    def load_model(self, model: onnx.ModelProto) -> None:
        """Put the data of every external tensor of ``model`` inside it, in place (:meth:`load`)."""
        for tensor, where in model_tensors(model):
            self.load(tensor, where)

    def load_held(self, model: onnx.ModelProto) -> None:
        """Put the data of ``model``'s held stubs back inside them (tensors in files stay there), in place."""
        for tensor, where in model_tensors(model):
            if self._held(tensor) is not None:
                self.load(tensor, where)

    def array(self, tensor: onnx.TensorProto, where: str = "") -> np.ndarray:
        """``tensor``'s value as ``numpy_helper.to_array`` gives it, its data read now (``tensor`` is not changed)."""
        if not uses_external_data(tensor):
            return numpy_helper.to_array(tensor)
        loaded = onnx.TensorProto()
        loaded.CopyFrom(tensor)
        self.load(loaded, where)
        return numpy_helper.to_array(loaded)


def little_endian(array: np.ndarray) -> bytes:
    """``array``'s elements as little-endian bytes, in C order."""
    data = np.ascontiguousarray(array)
    if sys.byteorder == "big" and data.dtype.itemsize > 1:
        data = data.byteswap()
    return data.tobytes()


__all__ = [
    "CHUNK_BYTES",
    "DATA_FIELDS",
    "HELD_LOCATION",
    "SHARED_LOCATION",
    "ExternalData",
    "TensorData",
    "check_inline",
    "check_model_data",
    "copy_fields",
    "declared_elements",
    "declared_nbytes",
    "has_external_data",
    "held_stub",
    "little_endian",
    "load_external_data",
    "locate",
    "location_of",
    "model_tensors",
    "read_bytes",
    "read_external",
]
