"""The models as the runtime takes them: from a path, the serialized bytes or a ``ModelProto``.

A model is read without its external data, and from a path without the
data of its large inline initializers either, which then refer to their
bytes in the file (:func:`onnxtrain.graph.wire.load_light`);
:class:`LoadedModel` keeps the graph and what onnxruntime loads the model
from. A path's data files must
lie inside the model's folder, with their declared sizes; a model given in
memory must hold all its data. ONNX Runtime's in-place accumulators are
rewritten in standard operators on the way in.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx.external_data_helper import uses_external_data

from onnxtrain.artifacts.generate import PROTOBUF_LIMIT
from onnxtrain.artifacts.ort_training import to_standard_accumulation
from onnxtrain.graph import external, wire

#: A model as the runtime takes it: a path, the serialized bytes, or a ModelProto.
ModelSource = str | os.PathLike[str] | bytes | onnx.ModelProto


@dataclass(frozen=True)
class LoadedModel:
    """A model's graph (external data not loaded) and what onnxruntime loads it from."""

    proto: onnx.ModelProto
    source: str | bytes
    path: Path | None = None

    def with_data(self) -> onnx.ModelProto:
        """The full model, external data included (read from beside the file); the stubs of constants the
        runtime shares stay stubs (:mod:`onnxtrain.training.constants`)."""
        if self.path is None:
            return self.proto
        return onnx.load(os.fspath(self.path))

    def fits_in_protobuf(self) -> bool:
        """Whether the full model (:meth:`with_data`) stays under protobuf's limit, told without reading its data
        (shared constants are not in it)."""
        stored = [
            t
            for t, _ in external.model_tensors(self.proto)
            if uses_external_data(t) and external.location_of(t) != external.SHARED_LOCATION  # held apart
        ]
        return self.proto.ByteSize() + sum(external.declared_nbytes(t) or 0 for t in stored) <= PROTOBUF_LIMIT


def load_model(source: ModelSource, what: str) -> LoadedModel:
    """``source`` as a :class:`LoadedModel`; ``what`` names the argument in errors.

    ONNX Runtime's in-place accumulators (``com.microsoft::InPlaceAccumulatorV2``,
    artifacts of ``target="onnxruntime-training"``) are rewritten in standard
    operators (:func:`onnxtrain.artifacts.ort_training.to_standard_accumulation`).
    """
    return _in_standard_operators(_load_model(source, what))


def _in_standard_operators(model: LoadedModel) -> LoadedModel:
    """``model``, or its translation when it accumulates gradients with ONNX Runtime's kernel."""
    translated = to_standard_accumulation(model.proto)
    if translated is model.proto:
        return model
    if model.path is not None and external.has_external_data(translated):
        translated = to_standard_accumulation(model.with_data())
    data = translated.SerializeToString()
    return LoadedModel(translated, data)


def _load_model(source: ModelSource, what: str) -> LoadedModel:
    """``source`` as read: its graph (external data not loaded) and what onnxruntime loads."""
    if isinstance(source, onnx.ModelProto):
        if source.ByteSize() > PROTOBUF_LIMIT:
            raise ValueError(
                f"{what} is a ModelProto over protobuf's 2 GiB limit; save it with external data and pass the path"
            )
        _check_no_external_data(source, what)
        data = source.SerializeToString()
        return LoadedModel(onnx.load_from_string(data), data)
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        try:
            proto = onnx.load_from_string(data)
        except Exception as error:  # protobuf's DecodeError
            raise ValueError(f"{what}: the bytes are not a serialized ONNX model ({error})") from error
        _check_no_external_data(proto, what)
        return LoadedModel(proto, data)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"{what}: no ONNX model at {str(path)!r}")
        try:
            proto = wire.load_light(path)  # large inline weights refer to their bytes in the file, unread
        except Exception as error:
            if _is_ort_format(path):
                raise ValueError(
                    f"{what}: {str(path)!r} is in ONNX Runtime's ORT format (generate_artifacts(..., ort_format=True) "
                    "writes it beside the .onnx, for ONNX Runtime's mobile runtimes), which onnx cannot read: pass "
                    f"{path.with_suffix('.onnx').name!r}, which this runtime trains"
                ) from None
            raise ValueError(f"{what}: {str(path)!r} is not a readable ONNX model ({error})") from error
        # the folder the model is opened from, as onnxruntime and onnx resolve its data: not the folder a symbolic
        # link to the file leads to (an artifact set's names link into its version folder; their data's
        # locations are relative to the artifact directory)
        folder = path.absolute().parent
        try:  # onnxruntime reads the data itself: only files inside the model's folder, of the declared sizes
            external.check_model_data(proto, folder)
        except ValueError as error:
            raise ValueError(f"{what} {str(path)!r}: {error}") from None
        return LoadedModel(proto, os.fspath(path), folder / path.name)
    raise TypeError(f"{what} must be a path, the model's bytes or an onnx.ModelProto, not {type(source).__name__}")


#: The file identifier of ONNX Runtime's ORT-format models (a flatbuffer's bytes 4 to 8).
ORT_FORMAT_IDENTIFIER = b"ORTM"


def _is_ort_format(path: Path) -> bool:
    """Whether the file at ``path`` is an ORT-format model (its flatbuffer identifier)."""
    with open(path, "rb") as file:
        return file.read(8)[4:8] == ORT_FORMAT_IDENTIFIER


def _check_no_external_data(model: onnx.ModelProto, what: str) -> None:
    """``ValueError`` when a model given without its path refers to data files (found nowhere safe)."""
    if external.has_external_data(model):
        raise ValueError(
            f"{what} refers to external data files, and a model given in memory has no folder to find them in: "
            "pass the path of the .onnx file instead"
        )


__all__ = ["LoadedModel", "ModelSource", "load_model"]
