"""A model's protobuf encoding with its stubs' data in place, written a piece of one tensor at a time.

The bytes are those of ``model.SerializeToString()`` once every stub is
loaded (:meth:`onnxtrain.graph.external.TensorData.load_model`), without
loading any: protobuf writes a message's fields in the order of their
numbers, each length-delimited field as its key, its length (varints) and its
bytes. So a model is its fields before ``graph``, the graph, then its fields
after; the graph its fields before ``initializer``, each initializer, then
the rest; and a stub whose data is raw bytes its loaded fields before
``raw_data``, the key and length of its data, the data (streamed from where
the base keeps it), then its loaded fields after. Only the stubs among the
graph's initializers stream; any other (a subgraph's, a node's constant) is
loaded first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO

import onnx
from onnx.external_data_helper import uses_external_data

from onnxtrain.graph import external
from onnxtrain.graph.io import copy_model
from onnxtrain.graph.wire import GRAPH, INITIALIZER, RAW_DATA, length_key

Message = onnx.ModelProto | onnx.GraphProto | onnx.TensorProto


@dataclass(frozen=True)
class _Stored:
    """A stub's data, read from where ``data`` says when written."""

    tensor: onnx.TensorProto
    data: external.TensorData
    size: int

    def write(self, file: BinaryIO) -> None:
        for chunk in self.data.chunks(self.tensor):
            file.write(chunk)


@dataclass(frozen=True)
class _Inline:
    """A tensor that holds its data, serialized when written."""

    tensor: onnx.TensorProto
    size: int

    def write(self, file: BinaryIO) -> None:
        file.write(self.tensor.SerializeToString())


Piece = bytes | _Stored | _Inline


@dataclass(frozen=True)
class StreamedModel:
    """The pieces of a model's encoding and its size in bytes (that of the model with its data loaded)."""

    pieces: tuple[Piece, ...]
    size: int

    def write(self, file: BinaryIO) -> None:
        for piece in self.pieces:
            if isinstance(piece, bytes):
                file.write(piece)
            else:
                piece.write(file)


def streamed(model: onnx.ModelProto, data: external.TensorData) -> StreamedModel:
    """``model``'s encoding with the data of its stubs, which ``data`` finds, in place (nothing is read yet)."""
    light = copy_model(model)
    top_level = len(light.graph.initializer)
    for k, (tensor, where) in enumerate(external.model_tensors(light)):
        if k >= top_level and uses_external_data(tensor):  # not an initializer of the graph itself: loaded now
            data.load(tensor, where)
    initializers: list[Piece] = []
    for tensor in light.graph.initializer:
        pieces = _initializer(tensor, data)
        initializers += [length_key(INITIALIZER, _size(pieces)), *pieces]
    before, after = _split(light.graph, INITIALIZER)
    graph = [before, *initializers, after]
    before, after = _split(light, GRAPH)
    pieces = (before, length_key(GRAPH, _size(graph)), *graph, after)
    return StreamedModel(pieces, _size(pieces))


def _initializer(tensor: onnx.TensorProto, data: external.TensorData) -> list[Piece]:
    """The pieces of one initializer's encoding, loaded."""
    if not uses_external_data(tensor):
        return [_Inline(tensor, tensor.ByteSize())]
    if not data.has_raw_data(tensor):  # a held tensor of typed values: loaded (it is in memory already)
        data.load(tensor)
        return [_Inline(tensor, tensor.ByteSize())]
    before, after = _split(data.loaded_header(tensor), RAW_DATA)
    size = external.declared_nbytes(tensor) or 0
    return [before, length_key(RAW_DATA, size), _Stored(tensor, data, size), after]


def _split(message: Message, number: int) -> tuple[bytes, bytes]:
    """The encodings of ``message``'s fields numbered below ``number``, and above it."""
    fields = message.DESCRIPTOR.fields
    before, after = type(message)(), type(message)()
    external.copy_fields(message, before, {f.name for f in fields if f.number >= number})
    external.copy_fields(message, after, {f.name for f in fields if f.number <= number})
    return before.SerializeToString(), after.SerializeToString()


def _size(pieces: list[Piece] | tuple[Piece, ...]) -> int:
    return sum(len(piece) if isinstance(piece, bytes) else piece.size for piece in pieces)


__all__ = ["StreamedModel", "streamed"]
