"""Files in one folder that change together: a kill at any instant leaves all the old ones or all the new ones.

An artifact set (training, eval and optimizer models, checkpoint) or a
checkpoint with its ``.data`` file is several files with fixed names that
runtimes open one by one. Renaming them into place one after the other is not
atomic: a crash between two renames pairs a new training model with an old
optimizer model. So the names are symbolic links through one pointer, and the
pointer is what changes. For a group ``G`` in folder ``D``::

    D/.onnxtrain.G.current   -> .onnxtrain.G.v-<id>             the pointer
    D/.onnxtrain.G.v-<id>/   the files of the current version (and files they refer to)
    D/<name>                 -> .onnxtrain.G.current/<name>     each member name

and ``D`` itself is locked (``flock``) while a writer works.
A new version is written into a fresh folder ``.onnxtrain.G.v-<new>``, every
file flushed to disk; then ``os.replace`` of a new symlink onto the pointer
switches every member at once. Before that switch, files already at member
names that are not links through the pointer (regular files of an earlier
save, links of another group) are taken into the current version first: each
is hard-linked (or copied) there and its name replaced by a member link, which
reads the same bytes at every instant. A name the new version lacks is a
dangling link after the switch: it reads as absent, and is removed.

A crash leaves the old version or the new one complete, plus hidden leftovers
(an unused version folder, a temporary link) that the next writer of the
group removes. Readers need nothing special; ``resolve_members`` lets a reader
of two files (a checkpoint and its data) read both from one version. Where
symbolic links cannot be made, the files are replaced one by one (each atomic,
the group not).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

from onnxtrain.fileio import sync_directory

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

_MARK = ".onnxtrain."
_TOKEN_BYTES = 8  # random bytes in the names of versions and temporary links (twice as many hex digits)
_VERSION = re.compile(rf"v-[0-9a-f]{{{2 * _TOKEN_BYTES}}}")
_TEMPORARY = re.compile(rf"tmp-[0-9a-f]{{{2 * _TOKEN_BYTES}}}")


class FileGroup:
    """The member ``names`` of group ``group`` in ``directory`` (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike[str], group: str, names: Iterable[str]) -> None:
        if not group or any(sep and sep in group for sep in ("/", os.sep, os.altsep)):
            raise ValueError(f"a file group needs a name without path separators, not {group!r}")
        self.directory = Path(directory)
        self.group = group
        self.names = tuple(dict.fromkeys(names))
        self._prefix = f"{_MARK}{group}."
        self.pointer = f"{self._prefix}current"

    # ------------------------------------------------------------------ writing

    @contextlib.contextmanager
    def replacing(self) -> Iterator[Path]:
        """Yield an empty version folder; the member names the caller writes into it replace the group's.

        On a normal exit the files written there under member names become the
        group (names it lacks disappear); files under other names stay in the
        folder, for the members to refer to (at ``<folder name>/<file>``
        relative to ``directory``). On an exception nothing changes and the
        folder is removed. Returns nothing; the members are at ``directory / name``.
        """
        for name in self.names:
            path = self.directory / name
            if path.is_dir():
                raise IsADirectoryError(
                    f"{path} is a directory, where {name!r} goes: move it away or choose another folder"
                )
        with self.locked():
            self._clean()
            staging = None
            try:
                staging = self._new_version()
                yield staging
                _sync_tree(staging)
                self._switch(staging)
            finally:  # the pointer tells whether the switch happened (an interrupt may come right after it)
                if staging is None or self._current() != staging.name:
                    self.release_unused()  # the new folder too: it is not the current version

    def _switch(self, staging: Path) -> None:
        """Make ``staging`` the current version: the pointer's rename is the commit point."""
        publish = {name for name in self.names if (staging / name).is_file() and not (staging / name).is_symlink()}
        if not _symlinks_work(self.directory, self._temporary_name()):
            self._replace_one_by_one(staging, publish)
            return
        adopt = [name for name in self.names if not self._is_member(self.directory / name)
                 and os.path.exists(self.directory / name)]  # fmt: skip
        old = self._current()
        if old is None and adopt:  # files of an earlier save, not yet a group: they become its first version
            old = self._new_version().name
            self._point_to(old)
        old_folder = None if old is None else self.directory / old
        for name in self.names:
            if name in adopt:  # same bytes, read through the group from now on
                assert old_folder is not None
                _discard(old_folder / name)
                _link_or_copy(self.directory / name, old_folder / name)
                self._link_member(name)
            elif name in publish and not self._is_member(self.directory / name):
                if old_folder is not None:  # absent (or a dangling link), and stays absent until the switch
                    _discard(old_folder / name)
                self._link_member(name)
        if old_folder is not None:
            sync_directory(old_folder)
        self._point_to(staging.name)  # the commit point
        with contextlib.suppress(OSError):  # leftovers only: the next writer removes what stays
            for name in self.names:
                if name not in publish and self._is_member(self.directory / name):
                    os.unlink(self.directory / name)
            if old_folder is not None:
                shutil.rmtree(old_folder)
            sync_directory(self.directory)

    def release_unused(self) -> None:
        """Remove the group's hidden files once no member name links through it any more (its names were
        replaced by plain files). Call it while holding :meth:`locked`. Without symbolic links the pointer
        is a file and the members plain files, which may refer to the version folder: it stays."""
        pointer = self.directory / self.pointer
        if pointer.is_symlink() and not any(self._is_member(self.directory / name) for name in self.names):
            _discard(pointer)
        self._clean()

    def _replace_one_by_one(self, staging: Path, publish: set[str]) -> None:
        """Without symbolic links: each member renamed into place (atomic per file, not as a group)."""
        self._write_pointer_file(staging.name)
        for name in self.names:
            path = self.directory / name
            if name in publish:
                os.replace(staging / name, path)
            elif os.path.lexists(path):
                os.unlink(path)
        sync_directory(self.directory)
        self._clean()

    # ------------------------------------------------------------------ reading the layout

    def _current(self) -> str | None:
        """The current version folder's name, or ``None`` when there is no (valid) pointer."""
        pointer = self.directory / self.pointer
        if pointer.is_symlink():
            target = os.readlink(pointer)
        elif pointer.is_file():
            target = pointer.read_text().strip()
        else:
            return None
        if not self._is_version(target) or not (self.directory / target).is_dir():
            return None
        return target

    def _is_version(self, name: str) -> bool:
        return name.startswith(self._prefix) and _VERSION.fullmatch(name[len(self._prefix) :]) is not None

    def _is_member(self, path: Path) -> bool:
        return path.is_symlink() and os.readlink(path) == f"{self.pointer}/{path.name}"

    # ------------------------------------------------------------------ changing the layout

    def _clean(self) -> None:
        """Remove what an interrupted writer left: unused versions, temporary links, dangling members; and a
        pointer that is a folder, which a copy following the links made (``shutil.copytree``): its members are
        plain files then, taken in as an earlier save's."""
        pointer = self.directory / self.pointer
        if pointer.is_dir() and not pointer.is_symlink():
            shutil.rmtree(pointer)
        current = self._current()
        for entry in os.scandir(self.directory):
            if not entry.name.startswith(self._prefix):
                continue
            rest = entry.name[len(self._prefix) :]
            if _VERSION.fullmatch(rest) and entry.name != current:
                shutil.rmtree(entry.path, ignore_errors=True)
            elif _TEMPORARY.fullmatch(rest):
                _discard(Path(entry.path))
        for name in self.names:
            path = self.directory / name
            if self._is_member(path) and not path.exists():
                os.unlink(path)

    def _new_version(self) -> Path:
        folder = self.directory / f"{self._prefix}v-{secrets.token_hex(_TOKEN_BYTES)}"
        folder.mkdir()
        sync_directory(self.directory)
        return folder

    def _temporary_name(self) -> Path:
        return self.directory / f"{self._prefix}tmp-{secrets.token_hex(_TOKEN_BYTES)}"

    def _replace_with_link(self, target: str, path: Path) -> None:
        temporary = self._temporary_name()
        os.symlink(target, temporary)
        try:
            os.replace(temporary, path)
        except BaseException:
            _discard(temporary)
            raise

    def _point_to(self, version: str) -> None:
        self._replace_with_link(version, self.directory / self.pointer)
        sync_directory(self.directory)

    def _link_member(self, name: str) -> None:
        self._replace_with_link(f"{self.pointer}/{name}", self.directory / name)

    def _write_pointer_file(self, version: str) -> None:
        temporary = self._temporary_name()
        temporary.write_text(version)
        os.replace(temporary, self.directory / self.pointer)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Lock ``directory`` itself (``flock``; nothing where there is no ``fcntl``): one writer at a time."""
        if fcntl is None:  # pragma: no cover - not POSIX
            yield
            return
        handle = os.open(self.directory, os.O_RDONLY)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
        finally:
            os.close(handle)  # releases the lock


def resolve_members(*paths: str | os.PathLike[str]) -> list[Path]:
    """Each of ``paths`` itself, or, for a member link, its file in the group's current version.

    Members of one group are resolved with one reading of its pointer, so a
    reader of two files (a checkpoint, then ``<checkpoint>.data``) gets both
    from one version even while a writer switches the group in between.
    """
    versions: dict[Path, str | None] = {}
    resolved = []
    for given in paths:
        path = Path(given)
        pointer = _pointer_of(path)
        if pointer is not None and pointer not in versions:
            versions[pointer] = os.readlink(pointer) if pointer.is_symlink() else None
        version = None if pointer is None else versions[pointer]
        resolved.append(path if version is None or "/" in version else path.parent / version / path.name)
    return resolved


def _pointer_of(path: Path) -> Path | None:
    """The pointer a member link ``path`` reads through, or ``None`` when ``path`` is no member link."""
    if not path.is_symlink():
        return None
    pointer, _, name = os.readlink(path).partition("/")
    if pointer.startswith(_MARK) and pointer.endswith(".current") and name == path.name:
        return path.parent / pointer
    return None


def _symlinks_work(directory: Path, probe: Path) -> bool:
    """Whether symbolic links can be made in ``directory`` (not on some Windows set-ups and file systems)."""
    try:
        os.symlink("probe", probe)
    except (OSError, NotImplementedError):
        return False
    os.unlink(probe)
    return True


def _link_or_copy(source: Path, target: Path) -> None:
    """``target`` holding ``source``'s bytes: a hard link where the file system allows, else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
        with open(target, "rb") as file:
            os.fsync(file.fileno())


def _discard(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            os.unlink(path)


def _sync_tree(folder: Path) -> None:
    """Flush every file under ``folder``, and the folders, to disk."""
    for root, _, files in os.walk(folder):
        for name in files:
            handle = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(handle)
            finally:
                os.close(handle)
        sync_directory(Path(root))


__all__ = ["FileGroup", "resolve_members"]
