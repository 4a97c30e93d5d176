"""Saving and loading checkpoint files: atomic writes, validated reads.

A checkpoint is one file; when its tensors hold more than
``external_data_threshold`` bytes, their data goes to ``<path>.data`` next to it
(ORT's layout). ``save`` writes temporary files in the target directory,
flushes and fsyncs them and renames them into place (``os.replace``): an
interrupted or failed save leaves the previous checkpoint as it was and no
temporary file behind. With external data, the data file is renamed first and
restored if renaming the checkpoint fails. ``load`` never unpickles anything and
reports every defect of a file with :class:`CheckpointError`.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import BinaryIO

from onnxtrain.checkpoint.errors import CheckpointError
from onnxtrain.checkpoint.format import MAX_FLATBUFFER_BYTES, decode, encode, tensor_bytes
from onnxtrain.checkpoint.state import CheckpointState
from onnxtrain.fileio import temporary_beside

#: ORT 1.19.2 switches to external data at 1800 MiB, below flatbuffers' 2 GiB limit.
DEFAULT_EXTERNAL_DATA_THRESHOLD = 1800 * 2**20

#: Suffix of the external data file: ``<checkpoint>.data``.
EXTERNAL_DATA_SUFFIX = ".data"


def external_data_path(path: str | os.PathLike[str]) -> Path:
    """``<path>.data``, where a checkpoint's external tensor data lives."""
    return Path(os.fspath(path) + EXTERNAL_DATA_SUFFIX)


def save(
    state: CheckpointState,
    path: str | os.PathLike[str],
    *,
    include_optimizer_state: bool = True,
    external_data_threshold: int = DEFAULT_EXTERNAL_DATA_THRESHOLD,
) -> Path:
    """Write ``state`` to ``path`` atomically, in ONNX Runtime's checkpoint format.

    Tensors (parameters, and moments unless ``include_optimizer_state=False``)
    holding more than ``external_data_threshold`` bytes in total go to
    ``<path>.data``. The directory must exist. Returns ``Path(path)``.
    """
    if not isinstance(state, CheckpointState):
        raise TypeError(f"state must be a CheckpointState, not {type(state).__name__}")
    if isinstance(external_data_threshold, bool) or not isinstance(external_data_threshold, int):
        raise TypeError(f"external_data_threshold must be an int (bytes), not {type(external_data_threshold).__name__}")
    if external_data_threshold < 0:
        raise ValueError(f"external_data_threshold must be >= 0 bytes, not {external_data_threshold}")
    target = Path(path)
    directory = target.parent
    if not directory.is_dir():
        raise FileNotFoundError(f"cannot save checkpoint {target}: directory {directory} does not exist")
    if target.is_dir():
        raise IsADirectoryError(f"cannot save checkpoint {target}: it is a directory")
    use_external = tensor_bytes(state, include_optimizer_state) > external_data_threshold
    temporaries: list[Path] = []
    try:
        data_temp = None
        if use_external:
            data_temp = _temporary(target.with_name(target.name + EXTERNAL_DATA_SUFFIX), temporaries)
            with open(data_temp, "wb") as data_file:
                buffer = encode(state, include_optimizer_state=include_optimizer_state, external=data_file)
                _sync(data_file)
        else:
            buffer = encode(state, include_optimizer_state=include_optimizer_state)
        checkpoint_temp = _temporary(target, temporaries)
        with open(checkpoint_temp, "wb") as checkpoint_file:
            checkpoint_file.write(buffer)
            _sync(checkpoint_file)
        _install(checkpoint_temp, data_temp, target, temporaries)
    finally:
        for temporary in temporaries:
            with contextlib.suppress(OSError):
                temporary.unlink()
    return target


def load(path: str | os.PathLike[str]) -> CheckpointState:
    """The state in the checkpoint at ``path`` (and ``<path>.data`` if it has external data).

    Raises :class:`CheckpointError` if the file is not a valid version-2 ORT
    training checkpoint, naming the problem; ``FileNotFoundError`` if missing.
    """
    target = Path(path)
    if target.is_dir():
        raise CheckpointError(f"{target} is a directory; a checkpoint is one file")
    size = target.stat().st_size
    if size > MAX_FLATBUFFER_BYTES:
        raise CheckpointError(f"{target} has {size} bytes, more than a flatbuffer can hold (2 GiB): not a checkpoint")
    buffer = target.read_bytes()
    with _ExternalData(external_data_path(target)) as external:
        try:
            return decode(buffer, external.read)
        except CheckpointError as error:
            raise CheckpointError(f"{target}: {error}") from None


class _ExternalData:
    """Reads tensor data from ``<checkpoint>.data``, opened on first use, bounds checked."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: BinaryIO | None = None
        self.size = 0
        self.used = 0

    def __enter__(self) -> _ExternalData:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            self.file.close()

    def read(self, offset: int, nbytes: int, what: str) -> memoryview:
        if self.file is None:
            try:
                self.file = open(self.path, "rb")  # noqa: SIM115 - closed in __exit__
            except OSError as error:
                raise CheckpointError(f"{what} is in external data, but {self.path} cannot be read: {error}") from None
            self.size = os.fstat(self.file.fileno()).st_size
        if offset + nbytes > self.size:
            raise CheckpointError(
                f"{what}: external data at byte {offset} (+{nbytes}) lies outside {self.path} ({self.size} bytes)"
            )
        self.used += nbytes
        if self.used > self.size:
            raise CheckpointError(f"{what}: tensors share external data in {self.path}; the checkpoint is corrupt")
        data = bytearray(nbytes)
        self.file.seek(offset)
        if self.file.readinto(data) != nbytes:
            raise CheckpointError(f"{what}: {self.path} ended early (truncated while reading)")
        return memoryview(data)


def _temporary(target: Path, temporaries: list[Path]) -> Path:
    """A new empty file next to ``target`` (default permissions), recorded for cleanup."""
    name = temporary_beside(target)
    temporaries.append(name)
    return name


def _sync(file: BinaryIO) -> None:
    file.flush()
    os.fsync(file.fileno())


def _install(checkpoint_temp: Path, data_temp: Path | None, target: Path, temporaries: list[Path]) -> None:
    """Rename the new files into place; on failure put the old data file back."""
    data_target = external_data_path(target)
    backup = None
    if data_temp is not None:
        if data_target.exists():
            backup = _temporary(data_target, temporaries)
            os.replace(data_target, backup)
        try:
            os.replace(data_temp, data_target)
            temporaries.remove(data_temp)
            os.replace(checkpoint_temp, target)
        except BaseException:
            if backup is not None:
                os.replace(backup, data_target)
            else:
                with contextlib.suppress(OSError):
                    data_target.unlink()
            raise
    else:
        os.replace(checkpoint_temp, target)
        with contextlib.suppress(OSError):
            data_target.unlink()  # a stale data file of an older save: nothing refers to it now
    temporaries.remove(checkpoint_temp)
    _sync_directory(target.parent)


def _sync_directory(directory: Path) -> None:
    """Make the renames durable (POSIX); a no-op where directories cannot be opened."""
    try:
        handle = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)
