"""Reading an ``.onnx`` file without the data of its large inline initializers, from protobuf's wire format.

``onnx.load`` reads the whole file and then parses it: a model of 1.4 GB
with its weights inside takes 2.8 GB while it loads, although the graph is a
few hundred kilobytes. :func:`load_light` walks the file's bytes (mapped,
not read) down to the main graph's initializers instead, and gives each
initializer whose ``raw_data`` has at least ``min_bytes`` an external-data
reference to those same bytes of the model file itself (``location``: the
file's name, ``offset`` and ``length``: where ``raw_data`` lies). The rest
of the file is parsed as ``onnx.load`` parses it. The result is the model
``onnx.load(path, load_external_data=False)`` gives, but for those
initializers, whose values :class:`~onnxtrain.graph.external.TensorData`
(or onnx's ``load_external_data_for_model``) then reads from the file, one
at a time.

Protobuf's encoding (https://protobuf.dev/programming-guides/encoding/):
each field is a varint tag, ``field_number << 3 | wire_type``, then its
value: a varint (type 0), 8 bytes (1), a varint length and that many bytes
(2), or 4 bytes (5). ``ModelProto.graph`` is field 7,
``GraphProto.initializer`` field 5, ``TensorProto.raw_data`` field 9,
``external_data`` 13 and ``data_location`` 14. A file this reader does not
follow (groups, a truncated field, an initializer that already has external
data) is parsed whole, as by ``onnx.load``.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import onnx

#: Initializers whose ``raw_data`` has at least this many bytes are left in the file by :func:`load_light`.
LIGHT_BYTES = 1 << 20

#: The field numbers this reader follows, and the one wire type it takes apart (length-delimited).
GRAPH = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
INITIALIZER = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number
RAW_DATA = onnx.TensorProto.DESCRIPTOR.fields_by_name["raw_data"].number
_EXTERNAL_DATA = onnx.TensorProto.DESCRIPTOR.fields_by_name["external_data"].number
_DATA_LOCATION = onnx.TensorProto.DESCRIPTOR.fields_by_name["data_location"].number
_LEN = 2


class _NotFollowed(Exception):
    """The bytes use an encoding this reader leaves to protobuf."""


def _varint(buffer: mmap.mmap | bytes, position: int, end: int) -> tuple[int, int]:
    """The varint at ``position`` and the position after it."""
    value = shift = 0
    while position < end:
        byte = buffer[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
    raise _NotFollowed("a truncated varint")


def varint(value: int) -> bytes:
    """``value`` (at least 0) as a varint."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_key(number: int, length: int) -> bytes:
    """The key of length-delimited field ``number`` and its ``length``: what precedes its bytes."""
    return varint(number << 3 | _LEN) + varint(length)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return length_key(number, len(payload)) + payload


def _fields(buffer: mmap.mmap, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """``(field number, start of the field's tag, start of its value, end of the field)`` of a message."""
    position = start
    while position < end:
        tag_start = position
        tag, position = _varint(buffer, position, end)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            _, after = _varint(buffer, position, end)
        elif wire_type == 1:
            after = position + 8
        elif wire_type == _LEN:
            length, position = _varint(buffer, position, end)
            after = position + length
        elif wire_type == 5:
            after = position + 4
        else:
            raise _NotFollowed(f"wire type {wire_type}")
        if after > end:
            raise _NotFollowed("a field past its message's end")
        yield number, tag_start, position, after
        position = after


def _light_tensor(buffer: mmap.mmap, start: int, end: int, location: str, min_bytes: int) -> bytes | None:
    """The initializer at ``buffer[start:end]`` with its ``raw_data`` replaced by a reference to where it lies,
    or ``None`` to keep it as it is (a small or external one)."""
    raw: tuple[int, int] | None = None
    kept: list[tuple[int, int]] = []  # the other fields, as they are
    for number, tag_start, value_start, after in _fields(buffer, start, end):
        if number == _EXTERNAL_DATA:
            return None
        if number == _DATA_LOCATION:
            if _varint(buffer, value_start, after)[0] != onnx.TensorProto.DEFAULT:
                return None
            continue  # written again below
        if number == RAW_DATA:
            raw = (value_start, after)
        else:
            kept.append((tag_start, after))
    if raw is None or raw[1] - raw[0] < min_bytes:
        return None
    offset, length = raw[0], raw[1] - raw[0]
    reference = onnx.TensorProto(data_location=onnx.TensorProto.EXTERNAL)  # its fields, appended: merged in
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        reference.external_data.add(key=key, value=value)
    return b"".join(bytes(buffer[a:b]) for a, b in kept) + reference.SerializeToString()


def _light_bytes(buffer: mmap.mmap, location: str, min_bytes: int) -> bytes:
    """The serialized model with its main graph's large initializers referring to the file."""
    pieces: list[bytes] = []
    for number, tag_start, value_start, after in _fields(buffer, 0, len(buffer)):
        if number != GRAPH:
            pieces.append(bytes(buffer[tag_start:after]))
            continue
        graph: list[bytes] = []
        for field, field_tag, field_value, field_after in _fields(buffer, value_start, after):
            light = None
            if field == INITIALIZER:
                light = _light_tensor(buffer, field_value, field_after, location, min_bytes)
            graph.append(bytes(buffer[field_tag:field_after]) if light is None else _length_delimited(field, light))
        pieces.append(_length_delimited(GRAPH, b"".join(graph)))
    return b"".join(pieces)


def load_light(
    path: str | os.PathLike[str], min_bytes: int | None = None, *, location: str | None = None
) -> onnx.ModelProto:
    """The model at ``path`` as ``onnx.load(path, load_external_data=False)`` gives it, but for the main graph's
    initializers with ``raw_data`` of ``min_bytes`` (default :data:`LIGHT_BYTES`) or more, which refer to
    their bytes in the file instead of holding them (see the module docstring). ``location``: the file as
    the model's readers will find it from the folder they resolve locations against (default: its name,
    for the folder ``path`` is in). Errors are ``onnx.load``'s."""
    file = Path(path)
    location = file.name if location is None else location
    min_bytes = LIGHT_BYTES if min_bytes is None else min_bytes
    with open(file, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            return onnx.load(os.fspath(file), load_external_data=False)
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
            try:
                data = _light_bytes(buffer, location, min_bytes)
            except _NotFollowed:
                return onnx.load(os.fspath(file), load_external_data=False)
    model = onnx.ModelProto()
    model.ParseFromString(data)
    return model


__all__ = ["GRAPH", "INITIALIZER", "LIGHT_BYTES", "RAW_DATA", "length_key", "load_light", "varint"]
