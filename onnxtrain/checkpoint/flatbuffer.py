"""A bounds-checked view of a flatbuffer: tables, scalars, strings and vectors.

Flatbuffer layout (little-endian), as the ``flatbuffers`` library writes it:

- offset 0: ``uoffset`` (uint32) to the root table; offset 4: the 4-byte file
  identifier;
- a table starts with an ``soffset`` (int32): ``vtable = table - soffset``;
- a vtable is ``[vtable_size:u16, table_size:u16, field_offset:u16 ...]``;
  field ``slot`` (0-based, in schema order) is at ``4 + 2 * slot``; offset 0
  (or a vtable too short) means the field is absent and has its default;
- a reference field holds a ``uoffset`` relative to the field's own position;
- a vector is ``[length:u32, elements...]``; a string is a byte vector plus a
  NUL terminator; a vector of tables or strings holds one ``uoffset`` per
  element, each relative to the element's position.

Every read checks that what it touches lies inside the buffer and is aligned
the way flatbuffers' verifier requires, and raises :class:`CheckpointError`
otherwise. Nothing is allocated before its size has been checked against the
buffer, and a :class:`Budget` caps the bytes decoded in total, so offsets that
point many entries at the same data cannot multiply the work or the memory.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from onnxtrain.checkpoint.errors import CheckpointError

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")

#: Scalar field formats by kind.
SCALARS: Mapping[str, struct.Struct] = MappingProxyType(
    {
        "bool": struct.Struct("<B"),
        "int32": struct.Struct("<i"),
        "int64": struct.Struct("<q"),
        "float32": struct.Struct("<f"),
    }
)


class Budget:
    """Caps the bytes decoded from one buffer (a small multiple of its size)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def spend(self, nbytes: int, what: str) -> None:
        self.used += nbytes
        if self.used > self.limit:
            raise CheckpointError(
                f"{what}: the file refers to more data than it holds ({self.used} > {self.limit} bytes); "
                "entries share data, so the file is corrupt"
            )


@dataclass(frozen=True)
class Table:
    """One table in ``buf``: its position, vtable and size, all checked."""

    buf: memoryview
    pos: int
    vtable: int
    vtable_size: int
    table_size: int
    name: str
    budget: Budget

    @classmethod
    def at(cls, buf: memoryview, pos: int, name: str, budget: Budget) -> Table:
        """The table at ``pos``; checks its soffset, vtable and size."""
        _check_range(buf, pos, 4, name)
        _check_aligned(pos, 4, name)
        budget.spend(4, name)
        vtable = pos - _I32.unpack_from(buf, pos)[0]
        _check_range(buf, vtable, 4, f"{name} vtable")
        _check_aligned(vtable, 2, f"{name} vtable")
        vtable_size, table_size = _U16.unpack_from(buf, vtable)[0], _U16.unpack_from(buf, vtable + 2)[0]
        if vtable_size < 4 or vtable_size % 2:
            raise CheckpointError(f"{name} vtable has an invalid size {vtable_size}")
        _check_range(buf, vtable, vtable_size, f"{name} vtable")
        if table_size < 4:
            raise CheckpointError(f"{name} has an invalid size {table_size}")
        _check_range(buf, pos, table_size, name)
        return cls(buf, pos, vtable, vtable_size, table_size, name, budget)

    def _field(self, slot: int, size: int, what: str) -> int | None:
        """The absolute position of field ``slot`` (``size`` bytes), or None if absent."""
        entry = 4 + 2 * slot
        if entry + 2 > self.vtable_size:
            return None
        offset = _U16.unpack_from(self.buf, self.vtable + entry)[0]
        if offset == 0:
            return None
        if offset < 4 or offset + size > self.table_size:
            raise CheckpointError(f"{self.name}.{what} lies outside its table")
        position = self.pos + offset
        _check_aligned(position, size, f"{self.name}.{what}")
        return position

    def scalar(self, slot: int, kind: str, default: int | float, what: str) -> int | float:
        """A scalar field (``kind`` in :data:`SCALARS`) or its default."""
        fmt = SCALARS[kind]
        position = self._field(slot, fmt.size, what)
        return default if position is None else fmt.unpack_from(self.buf, position)[0]

    def _target(self, slot: int, what: str) -> int | None:
        position = self._field(slot, 4, what)
        return None if position is None else _follow(self.buf, position, f"{self.name}.{what}")

    def table(self, slot: int, what: str) -> Table | None:
        """A sub-table field, or None if absent."""
        target = self._target(slot, what)
        return None if target is None else Table.at(self.buf, target, f"{self.name}.{what}", self.budget)

    def string(self, slot: int, what: str) -> str | None:
        """A string field, or None if absent."""
        target = self._target(slot, what)
        return None if target is None else _string_at(self.buf, target, f"{self.name}.{what}", self.budget)

    def vector_bytes(self, slot: int, elem_size: int, what: str) -> tuple[int, int] | None:
        """``(start, length)`` of a vector of scalars, or None if absent."""
        target = self._target(slot, what)
        if target is None:
            return None
        return _vector_at(self.buf, target, elem_size, f"{self.name}.{what}", self.budget)

    def int64_vector(self, slot: int, what: str) -> list[int] | None:
        """A vector of int64, or None if absent."""
        found = self.vector_bytes(slot, 8, what)
        if found is None:
            return None
        start, length = found
        return np.frombuffer(self.buf, dtype="<i8", count=length, offset=start).tolist()

    def tables(self, slot: int, what: str) -> list[Table] | None:
        """A vector of tables, or None if absent."""
        positions = self._offsets(slot, what)
        if positions is None:
            return None
        return [Table.at(self.buf, p, f"{self.name}.{what}[{i}]", self.budget) for i, p in enumerate(positions)]

    def strings(self, slot: int, what: str) -> list[str] | None:
        """A vector of strings, or None if absent."""
        positions = self._offsets(slot, what)
        if positions is None:
            return None
        return [_string_at(self.buf, p, f"{self.name}.{what}[{i}]", self.budget) for i, p in enumerate(positions)]

    def _offsets(self, slot: int, what: str) -> list[int] | None:
        found = self.vector_bytes(slot, 4, what)
        if found is None:
            return None
        start, length = found
        return [_follow(self.buf, start + 4 * i, f"{self.name}.{what}[{i}]") for i in range(length)]


def root(buf: memoryview, identifier: bytes, name: str, budget: Budget) -> Table:
    """The root table of a finished buffer with a file identifier."""
    if len(buf) < 8:
        raise CheckpointError(f"the file has {len(buf)} bytes, too few for a flatbuffer (at least 8)")
    found = bytes(buf[4:8])
    if found != identifier:
        raise CheckpointError(
            f"file identifier {found!r} is not {identifier!r}: this is not an ONNX Runtime training checkpoint"
        )
    return Table.at(buf, _follow(buf, 0, "root"), name, budget)


def _follow(buf: memoryview, position: int, what: str) -> int:
    """Where the uoffset at ``position`` points."""
    _check_range(buf, position, 4, what)
    offset = _U32.unpack_from(buf, position)[0]
    if offset == 0 or offset >= 2**31:
        raise CheckpointError(f"{what} has an invalid offset {offset}")
    target = position + offset
    _check_range(buf, target, 4, what)
    return target


def _vector_at(buf: memoryview, position: int, elem_size: int, what: str, budget: Budget) -> tuple[int, int]:
    _check_aligned(position, 4, what)
    length = _U32.unpack_from(buf, position)[0]
    start = position + 4
    if length > (len(buf) - start) // elem_size:
        raise CheckpointError(
            f"{what} claims {length} elements of {elem_size} bytes, more than the {len(buf) - start} bytes left"
        )
    budget.spend(4 + length * elem_size, what)
    return start, length


def _string_at(buf: memoryview, position: int, what: str, budget: Budget) -> str:
    start, length = _vector_at(buf, position, 1, what, budget)
    if start + length >= len(buf) or buf[start + length] != 0:
        raise CheckpointError(f"{what} is a string without its terminating NUL byte")
    try:
        return bytes(buf[start : start + length]).decode("utf-8")
    except UnicodeDecodeError as error:
        raise CheckpointError(f"{what} is not valid UTF-8 ({error.reason} at byte {error.start})") from None


def _check_range(buf: memoryview, position: int, size: int, what: str) -> None:
    if position < 0 or position + size > len(buf):
        raise CheckpointError(
            f"{what} at byte {position} (+{size}) lies outside the {len(buf)}-byte file; "
            "the file is truncated or corrupt"
        )


def _check_aligned(position: int, alignment: int, what: str) -> None:
    if position % alignment:
        raise CheckpointError(f"{what} at byte {position} is not aligned to {alignment} bytes")
