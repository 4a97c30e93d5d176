"""Saving and loading checkpoint files: atomic writes, validated reads.

A checkpoint is one file; when its tensors hold more than
``external_data_threshold`` bytes, their data goes to ``<path>.data`` next to it
(ORT's layout). ``save`` of a single file writes a temporary file in the target
directory, flushes and fsyncs it and renames it into place (``os.replace``).
A checkpoint with a data file, or one replacing a checkpoint that had one, is
two names that must change together: they are a
:class:`~onnxtrain.filegroup.FileGroup`, written into a new version folder and
switched in with one rename. Either way an interrupted or failed save, or a
kill at any instant, leaves the previous checkpoint (and its data) or the new
one, complete. ``load`` never
unpickles anything and reports every defect of a file with :class:`CheckpointError`.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import BinaryIO

from onnxtrain.checkpoint.errors import CheckpointError
from onnxtrain.checkpoint.format import MAX_FLATBUFFER_BYTES, decode, encode, tensor_bytes, write
from onnxtrain.checkpoint.sources import LazyArrays
from onnxtrain.checkpoint.state import CheckpointState
from onnxtrain.filegroup import FileGroup, resolve_members
from onnxtrain.fileio import stale_temporaries, sync_directory, temporary_beside

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
    _check_threshold(external_data_threshold)
    target = Path(path)
    directory = target.parent
    if not directory.is_dir():
        raise FileNotFoundError(f"cannot save checkpoint {target}: directory {directory} does not exist")
    if target.is_dir():
        raise IsADirectoryError(f"cannot save checkpoint {target}: it is a directory")
    try:
        return _save(state, target, include_optimizer_state, external_data_threshold)
    except OSError as error:  # a full disk, a folder not writable: the error named a temporary file
        if error.errno is None:
            raise
        raise type(error)(
            error.errno, f"cannot save checkpoint {target}: {error.strerror}; the previous checkpoint is unchanged"
        ) from error


def _save(state: CheckpointState, target: Path, include_optimizer_state: bool, external_data_threshold: int) -> Path:
    """:func:`save`, its arguments checked."""
    directory = target.parent
    group = checkpoint_files(target)
    if tensor_bytes(state, include_optimizer_state) > external_data_threshold or os.path.lexists(
        external_data_path(target)
    ):  # two files, or one replacing two: they switch at once
        with group.replacing() as folder:
            write_files(
                state, folder, target.name,
                include_optimizer_state=include_optimizer_state, external_data_threshold=external_data_threshold,
            )  # fmt: skip
        return target
    buffer = None if _is_lazy(state) else encode(state, include_optimizer_state=include_optimizer_state)
    with group.locked():
        for stale in stale_temporaries(target):  # what a killed save left
            stale.unlink()
        temporary = temporary_beside(target)
        try:
            with open(temporary, "wb") as file:
                _write_one_file(state, file, buffer, include_optimizer_state)
                _sync(file)
            os.replace(temporary, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
        sync_directory(directory)
        group.release_unused()  # an earlier save's version folder, now that nothing links through it
    return target


def checkpoint_files(path: str | os.PathLike[str]) -> FileGroup:
    """The checkpoint at ``path`` and its data file, as one :class:`~onnxtrain.filegroup.FileGroup`."""
    target = Path(path)
    return FileGroup(target.parent, f"checkpoint.{target.name}", [target.name, target.name + EXTERNAL_DATA_SUFFIX])


def write_files(
    state: CheckpointState,
    folder: str | os.PathLike[str],
    name: str,
    *,
    include_optimizer_state: bool = True,
    external_data_threshold: int = DEFAULT_EXTERNAL_DATA_THRESHOLD,
) -> list[str]:
    """Write checkpoint ``name`` (and ``name.data`` above the threshold) into ``folder``, a folder being
    prepared (no atomic rename: the caller switches the folder in). Returns the names written.

    The tensors of a lazy state (:func:`~onnxtrain.checkpoint.state.lazy_from_tensors`) are read one at a
    time, each when it is written."""
    _check_threshold(external_data_threshold)
    folder = Path(folder)
    written = [name]
    buffer = None
    if tensor_bytes(state, include_optimizer_state) > external_data_threshold:
        written.append(name + EXTERNAL_DATA_SUFFIX)
        with open(folder / written[1], "wb") as data_file:
            buffer = encode(state, include_optimizer_state=include_optimizer_state, external=data_file)
            _sync(data_file)
    elif not _is_lazy(state):
        buffer = encode(state, include_optimizer_state=include_optimizer_state)
    with open(folder / name, "wb") as checkpoint_file:
        _write_one_file(state, checkpoint_file, buffer, include_optimizer_state)
        _sync(checkpoint_file)
    return written


def _is_lazy(state: CheckpointState) -> bool:
    """Whether ``state`` reads its parameters when they are written (they are not in memory)."""
    return isinstance(state.trainable, LazyArrays) or isinstance(state.frozen, LazyArrays)


def _write_one_file(state: CheckpointState, file: BinaryIO, buffer: memoryview | None, optimizer: bool) -> None:
    """Write the checkpoint's flatbuffer: ``buffer``, encoded already, or (``None``) the whole checkpoint
    streamed, each tensor read when it is written (:func:`~onnxtrain.checkpoint.format.write`)."""
    if buffer is None:
        write(state, file, include_optimizer_state=optimizer)
    else:
        file.write(buffer)


def _check_threshold(external_data_threshold: object) -> None:
    if isinstance(external_data_threshold, bool) or not isinstance(external_data_threshold, int):
        raise TypeError(f"external_data_threshold must be an int (bytes), not {type(external_data_threshold).__name__}")
    if external_data_threshold < 0:
        raise ValueError(f"external_data_threshold must be >= 0 bytes, not {external_data_threshold}")


def load(path: str | os.PathLike[str]) -> CheckpointState:
    """The state in the checkpoint at ``path`` (and ``<path>.data`` if it has external data).

    Raises :class:`CheckpointError` if the file is not a valid version-2 ORT
    training checkpoint, naming the problem; ``FileNotFoundError`` if missing.
    """
    target = Path(path)
    if target.is_dir():
        raise CheckpointError(f"{target} is a directory; a checkpoint is one file")
    # the checkpoint and its data from one version, even while a save switches them
    source, data = resolve_members(target, external_data_path(target))
    size = source.stat().st_size
    if size > MAX_FLATBUFFER_BYTES:
        raise CheckpointError(f"{target} has {size} bytes, more than a flatbuffer can hold (2 GiB): not a checkpoint")
    buffer = source.read_bytes()
    with _ExternalData(data) as external:
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


def _sync(file: BinaryIO) -> None:
    file.flush()
    os.fsync(file.fileno())
