"""Atomic writes: files written beside their final place, renamed into it, the rename made durable."""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

#: Random bytes in a temporary file's name (twice as many hex digits), which :func:`stale_temporaries` matches.
_TOKEN_BYTES = 6


def temporary_beside(target: Path) -> Path:
    """A new empty file ``.<name>.<random>.tmp`` in ``target``'s folder, with default permissions.

    Unlike ``tempfile.mkstemp`` (mode 0600), the file gets ``0666`` less the
    umask, like any file the user writes, so that renaming it into place
    leaves a file as readable as a plain write would.
    """
    for _ in range(100):
        name = target.with_name(f".{target.name}.{secrets.token_hex(_TOKEN_BYTES)}.tmp")
        try:
            handle = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        os.close(handle)
        return name
    raise FileExistsError(f"cannot create a temporary file next to {target}")


def stale_temporaries(target: Path) -> list[Path]:
    """The files :func:`temporary_beside` made for ``target`` that are still there (a writer was killed).

    Remove them only while holding the folder's lock (``FileGroup.locked``), so as not to take a live
    writer's file.
    """
    pattern = re.compile(rf"\.{re.escape(target.name)}\.[0-9a-f]{{{2 * _TOKEN_BYTES}}}\.tmp")
    try:
        names = os.listdir(target.parent)
    except FileNotFoundError:
        return []
    return [target.parent / name for name in names if pattern.fullmatch(name)]


def sync_directory(directory: Path) -> None:
    """Make the renames in ``directory`` durable (POSIX); a no-op where directories cannot be opened."""
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


def make_durable(path: Path) -> None:
    """Flush ``path``'s bytes to the disk."""
    with open(path, "rb+") as file:
        os.fsync(file.fileno())


__all__ = ["make_durable", "stale_temporaries", "sync_directory", "temporary_beside"]
