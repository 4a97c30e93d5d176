"""What a folder shows its readers, and what its file groups keep hidden (``onnxtrain.filegroup``)."""

from __future__ import annotations

import os
import re
from pathlib import Path

HIDDEN = ".onnxtrain."
#: The temporary file of an atomic write of ``name`` (``onnxtrain.fileio.temporary_beside``).
TEMPORARY = re.compile(r"\..+\.[0-9a-f]{12}\.tmp")


def _hidden(name: str) -> bool:
    return name.startswith(HIDDEN) or TEMPORARY.fullmatch(name) is not None


def visible_files(folder: Path) -> dict[str, bytes]:
    """``{name: bytes}`` of the files a reader opens in ``folder``: through links, without the groups'
    hidden entries and without dangling links (which read as absent)."""
    if not folder.exists():
        return {}
    return {
        name: (folder / name).read_bytes()
        for name in sorted(os.listdir(folder))
        if not _hidden(name) and (folder / name).is_file()
    }


def visible_names(folder: Path) -> list[str]:
    """The sorted names of :func:`visible_files`, and nothing else is there (no other kind of entry)."""
    if not folder.exists():
        return []
    names = [name for name in sorted(os.listdir(folder)) if not _hidden(name)]
    return [name for name in names if (folder / name).is_file() or not os.path.lexists(folder / name)]


def leftovers(folder: Path) -> list[str]:
    """Entries of ``folder`` that a finished writer would not leave: temporary files, hidden entries other
    than each group's pointer and current version, and dangling links."""
    if not folder.exists():
        return []
    names = sorted(os.listdir(folder))
    pointers = [name for name in names if name.startswith(HIDDEN) and name.endswith(".current")]
    current = set()
    for pointer in pointers:
        path = folder / pointer
        current.add(os.readlink(path) if path.is_symlink() else path.read_text().strip())
    found = []
    for name in names:
        path = folder / name
        if TEMPORARY.fullmatch(name):
            found.append(name)
        elif name.startswith(HIDDEN):
            if name not in pointers and name not in current:
                found.append(name)
        elif path.is_symlink() and not path.exists():
            found.append(name)
    return found


def assert_clean(folder: Path, names: list[str] | None = None) -> None:
    """``folder`` shows exactly ``names`` (when given) and holds no leftovers."""
    assert leftovers(folder) == [], f"{folder} has leftovers"
    if names is not None:
        assert visible_names(folder) == sorted(names)
