"""A model file written whole or not at all: beside its place, then renamed into it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import onnx
from onnx import external_data_helper
from onnx.external_data_helper import uses_external_data

from onnxtrain.fileio import make_durable, sync_directory, temporary_beside
from onnxtrain.graph import external


@contextlib.contextmanager
def replacing_model(model: onnx.ModelProto, target: Path, limit: int) -> Iterator[Path]:
    """Write ``model`` beside ``target`` and yield that file, whole and loadable; on leaving without an error,
    move it into place. Until then, and after any error, ``target`` is as it was, and the temporaries are gone.

    A model of ``limit`` bytes or more (protobuf's 2 GiB) keeps its tensors of 1 KiB or more in
    ``<target name>.data`` beside it (``model`` is changed: they then refer to that file; no file where there is
    no such tensor). The data is written anew to a temporary file of its own, not appended to an earlier
    export's as onnx would; on leaving, the data file is renamed into place first, then the model.
    ``IsADirectoryError`` or ``FileNotFoundError`` for a ``target`` that is a folder or whose folder does not
    exist.
    """
    if target.is_dir():
        raise IsADirectoryError(f"{target} is a directory; give the path of the .onnx file to write")
    if not target.parent.is_dir():
        raise FileNotFoundError(f"cannot write {target}: the directory {target.parent} does not exist")
    temporary = temporary_beside(target)
    data = target.with_name(f"{target.name}.data") if model.ByteSize() >= limit else None
    data_temporary = None if data is None else temporary_beside(data)
    try:
        if data_temporary is not None:
            external_data_helper.convert_model_to_external_data(
                model, all_tensors_to_one_file=True, location=data_temporary.name
            )
            external_data_helper.write_external_data_tensors(model, os.fspath(target.parent))
        onnx.save_model(model, temporary)
        yield temporary
        if data is not None and data_temporary is not None and _relocate(model, data.name):
            onnx.save_model(model, temporary)
            make_durable(data_temporary)
            os.replace(data_temporary, data)
        make_durable(temporary)
        os.replace(temporary, target)
        sync_directory(target.parent)
    finally:
        for path in (temporary, data_temporary):
            if path is not None:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()


def _relocate(model: onnx.ModelProto, location: str) -> bool:
    """Point every tensor of ``model`` kept in external data at ``location``; whether there was one."""
    moved = False
    for tensor, _ in external.model_tensors(model):
        if uses_external_data(tensor):
            moved = True
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = location
    return moved


__all__ = ["replacing_model"]
