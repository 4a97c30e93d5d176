"""A built model written to its file, with the data of the constants it keeps from the base model.

Under protobuf's 2 GiB limit, the model is one file with every tensor inside.
Over it, the tensors onnx would move out (``convert_model_to_external_data``:
initializers holding ``raw_data`` of 1024 bytes or more, as ``sys.getsizeof``
counts them) go to a data file beside it, packed in onnx's order, and the
model file refers to them. A model built from a light base
(:func:`onnxtrain.graph.io.load_light`) keeps its constants as stubs whose
data :class:`~onnxtrain.graph.external.TensorData` finds: either file is
then written a piece of one tensor at a time, straight from where the base
keeps it (:mod:`onnxtrain.artifacts.streamed_model` for the one file), and
the result is the same bytes as the model with its data loaded, written by onnx.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import external_data_helper
from onnx.external_data_helper import uses_external_data

from onnxtrain.artifacts.streamed_model import streamed
from onnxtrain.graph import external
from onnxtrain.graph.io import copy_model
from onnxtrain.graph.walk import subgraphs

#: onnx moves a tensor to external data when ``sys.getsizeof(tensor.raw_data)`` reaches this.
EXTERNAL_THRESHOLD = 1024


def save(proto: onnx.ModelProto, path: Path, data_file: DataFile, data: external.TensorData | None, limit: int) -> bool:
    """Write ``proto`` to ``path``, its stubs' data from ``data``; whether its tensors went to ``data_file``
    (they do when the model, its data inside, would take ``limit`` bytes or more)."""
    if data is None or not external.has_external_data(proto):
        return _save_loaded(proto, path, data_file, limit)
    model = streamed(proto, data)
    if model.size >= limit:
        _save_streamed(proto, path, data_file, data)
        return True
    with open(path, "wb") as file:
        model.write(file)
    return False


@dataclass(frozen=True)
class DataFile:
    """Where a model's external data goes: ``location``, relative to ``folder`` (the folder the model is opened
    from, which its readers resolve the location against)."""

    folder: Path
    location: str


def _save_loaded(proto: onnx.ModelProto, path: Path, data_file: DataFile, limit: int) -> bool:
    """Write ``proto``, which holds its data, inline or (at ``limit`` bytes or more) with external data."""
    if proto.ByteSize() < limit:
        onnx.save_model(proto, path)
        return False
    copy = copy_model(proto)
    external_data_helper.convert_model_to_external_data(copy, all_tensors_to_one_file=True, location=data_file.location)
    external_data_helper.write_external_data_tensors(copy, os.fspath(data_file.folder))
    onnx.save_model(copy, path)
    return True


def _save_streamed(proto: onnx.ModelProto, path: Path, data_file: DataFile, data: external.TensorData) -> None:
    """:func:`_save_loaded`'s external-data result for ``proto``, each stub's data copied from ``data`` in pieces."""
    copy = copy_model(proto)
    location = data_file.location
    with open(data_file.folder / location, "xb") as out:
        for tensor in _initializers(copy.graph):
            if uses_external_data(tensor):
                if not data.has_raw_data(tensor) or _stays_inline(external.declared_nbytes(tensor) or 0):
                    continue
                offset = out.tell()
                for chunk in data.chunks(tensor):
                    out.write(chunk)
            elif tensor.HasField("raw_data") and not _stays_inline(len(tensor.raw_data)):
                offset = out.tell()
                out.write(tensor.raw_data)
                tensor.ClearField("raw_data")
            else:
                continue
            _refer(tensor, location, offset, out.tell() - offset)
    for tensor, where in external.model_tensors(copy):  # stubs that stay inline, constants of nodes
        if uses_external_data(tensor) and external.location_of(tensor) != location:
            data.load(tensor, where)
    onnx.save_model(copy, path)


def _stays_inline(nbytes: int) -> bool:
    """Whether onnx keeps ``raw_data`` of ``nbytes`` bytes inside the model (``sys.getsizeof`` under the threshold)."""
    return sys.getsizeof(b"") + nbytes < EXTERNAL_THRESHOLD


def _refer(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    """Point ``tensor`` at ``length`` bytes at ``offset`` of ``location``, as onnx's ``set_external_data`` does."""
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        tensor.external_data.add(key=key, value=str(value))


def _initializers(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """The initializers of ``graph`` and of its subgraphs, in the order onnx writes external data."""
    yield from graph.initializer
    for node in graph.node:
        for subgraph in subgraphs(node):
            yield from _initializers(subgraph)


__all__ = ["EXTERNAL_THRESHOLD", "DataFile", "save"]
