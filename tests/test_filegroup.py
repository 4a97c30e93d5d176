"""FileGroup: names in a folder that change together through one pointer; the layout each step leaves."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from onnxtrain import filegroup
from onnxtrain.filegroup import FileGroup, resolve_members
from tests.folders import leftovers, visible_files

NAMES = ("a", "b", "c")


def _write(group: FileGroup, files: dict[str, bytes]) -> None:
    with group.replacing() as folder:
        for name, data in files.items():
            (folder / name).write_bytes(data)


def test_members_link_through_one_pointer_and_names_a_new_version_lacks_disappear(tmp_path: Path):
    group = FileGroup(tmp_path, "g", NAMES)
    _write(group, {"a": b"1", "b": b"2"})
    assert visible_files(tmp_path) == {"a": b"1", "b": b"2"}
    assert os.readlink(tmp_path / "a") == ".onnxtrain.g.current/a"
    version = os.readlink(tmp_path / ".onnxtrain.g.current")
    assert sorted(os.listdir(tmp_path / version)) == ["a", "b"]
    _write(group, {"a": b"3", "c": b"4"})
    assert visible_files(tmp_path) == {"a": b"3", "c": b"4"}
    assert not os.path.lexists(tmp_path / "b")
    assert leftovers(tmp_path) == []
    assert sorted(os.listdir(tmp_path)) == [".onnxtrain.g.current", os.readlink(tmp_path / ".onnxtrain.g.current"),
                                            "a", "c"]  # fmt: skip


def test_files_under_other_names_stay_in_the_version_folder(tmp_path: Path):
    group = FileGroup(tmp_path, "g", NAMES)
    with group.replacing() as folder:
        (folder / "a").write_bytes(b"model")
        (folder / "a.data").write_bytes(b"tensors")
        location = f"{folder.name}/a.data"  # where a member refers to it, from the folder
    assert (tmp_path / location).read_bytes() == b"tensors"
    assert visible_files(tmp_path) == {"a": b"model"}


def test_plain_files_are_taken_in_with_their_bytes_then_replaced(tmp_path: Path):
    (tmp_path / "a").write_bytes(b"old a")
    (tmp_path / "b").write_bytes(b"old b")
    (tmp_path / "notes.txt").write_bytes(b"not in the group")
    group = FileGroup(tmp_path, "g", NAMES)
    with group.replacing() as folder:
        (folder / "a").write_bytes(b"new a")
        assert visible_files(tmp_path) == {"a": b"old a", "b": b"old b", "notes.txt": b"not in the group"}
    assert visible_files(tmp_path) == {"a": b"new a", "notes.txt": b"not in the group"}
    assert leftovers(tmp_path) == []


def test_a_copy_that_followed_the_links_is_written_over_as_plain_files(tmp_path: Path):
    """``shutil.copytree`` follows symbolic links: the pointer becomes a folder and the members plain files. A
    write there failed with "Is a directory" where the pointer's link goes."""
    import shutil

    (tmp_path / "original").mkdir()
    _write(FileGroup(tmp_path / "original", "g", NAMES), {"a": b"1", "b": b"2"})
    copy = Path(shutil.copytree(tmp_path / "original", tmp_path / "copy"))
    assert (copy / ".onnxtrain.g.current").is_dir() and not (copy / "a").is_symlink()
    group = FileGroup(copy, "g", NAMES)
    _write(group, {"a": b"3", "c": b"4"})
    assert visible_files(copy) == {"a": b"3", "c": b"4"}
    assert os.readlink(copy / "a") == ".onnxtrain.g.current/a" and (copy / ".onnxtrain.g.current").is_symlink()
    assert leftovers(copy) == []
    assert visible_files(tmp_path / "original") == {"a": b"1", "b": b"2"}


def test_an_error_while_writing_changes_nothing(tmp_path: Path):
    group = FileGroup(tmp_path, "g", NAMES)
    _write(group, {"a": b"1"})
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(RuntimeError, match="disk full"), group.replacing() as folder:
        (folder / "a").write_bytes(b"half")
        raise RuntimeError("disk full")
    assert sorted(os.listdir(tmp_path)) == before
    assert visible_files(tmp_path) == {"a": b"1"}


def test_a_first_write_that_fails_leaves_nothing(tmp_path: Path):
    with pytest.raises(RuntimeError), FileGroup(tmp_path, "g", NAMES).replacing() as folder:
        (folder / "a").write_bytes(b"half")
        raise RuntimeError("interrupted")
    assert os.listdir(tmp_path) == []


def test_a_directory_at_a_member_name_is_an_error_before_anything_is_written(tmp_path: Path):
    (tmp_path / "b").mkdir()
    with pytest.raises(IsADirectoryError, match=r"b is a directory.*move it away"):
        _write(FileGroup(tmp_path, "g", NAMES), {"a": b"1"})
    assert os.listdir(tmp_path) == ["b"]


def test_groups_in_one_folder_are_independent(tmp_path: Path):
    first, second = FileGroup(tmp_path, "run1", ["run1.a"]), FileGroup(tmp_path, "run1.x", ["run1.x.a"])
    _write(first, {"run1.a": b"1"})
    _write(second, {"run1.x.a": b"2"})
    _write(first, {"run1.a": b"3"})  # cleaning run1's versions leaves run1.x's alone
    assert visible_files(tmp_path) == {"run1.a": b"3", "run1.x.a": b"2"}
    assert leftovers(tmp_path) == []


def test_a_member_of_another_group_is_taken_in_with_its_bytes(tmp_path: Path):
    _write(FileGroup(tmp_path, "g", NAMES), {"a": b"1", "b": b"2"})
    other = FileGroup(tmp_path, "h", ["b", "b.data"])
    _write(other, {"b": b"new", "b.data": b"data"})
    assert visible_files(tmp_path) == {"a": b"1", "b": b"new", "b.data": b"data"}
    assert os.readlink(tmp_path / "b") == ".onnxtrain.h.current/b"


def test_resolve_members_reads_a_pair_from_one_version(tmp_path: Path):
    group = FileGroup(tmp_path, "g", ["ckpt", "ckpt.data"])
    _write(group, {"ckpt": b"1", "ckpt.data": b"d1"})
    ckpt, data = resolve_members(tmp_path / "ckpt", tmp_path / "ckpt.data")
    _write(group, {"ckpt": b"2", "ckpt.data": b"d2"})  # a writer switches between the reader's two opens
    assert ckpt.parent == data.parent and not ckpt.parent.exists()  # one (now removed) version for both
    (tmp_path / "plain").write_bytes(b"p")
    assert resolve_members(tmp_path / "plain") == [tmp_path / "plain"]
    assert [p.read_bytes() for p in resolve_members(tmp_path / "ckpt", tmp_path / "ckpt.data")] == [b"2", b"d2"]


def test_release_unused_removes_a_group_whose_names_became_plain_files(tmp_path: Path):
    group = FileGroup(tmp_path, "g", ["a"])
    _write(group, {"a": b"1"})
    os.unlink(tmp_path / "a")
    (tmp_path / "a").write_bytes(b"plain")
    with group.locked():
        group.release_unused()
    assert os.listdir(tmp_path) == ["a"]


def test_without_symbolic_links_each_file_is_replaced_on_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(filegroup, "_symlinks_work", lambda directory, probe: False)
    group = FileGroup(tmp_path, "g", NAMES)
    with group.replacing() as folder:
        (folder / "a").write_bytes(b"1")
        (folder / "a.data").write_bytes(b"kept")
        first = folder.name
    with group.replacing() as folder:
        (folder / "b").write_bytes(b"2")
        (folder / "b.data").write_bytes(b"kept too")
        second = folder.name
    assert visible_files(tmp_path) == {"b": b"2"}
    assert not (tmp_path / "b").is_symlink()
    assert (tmp_path / second / "b.data").read_bytes() == b"kept too"  # files the members refer to stay
    assert not (tmp_path / first).exists()
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("group", ["", "a/b", f"a{os.sep}b"])
def test_a_group_name_is_a_plain_name(tmp_path: Path, group: str):
    with pytest.raises(ValueError, match="without path separators"):
        FileGroup(tmp_path, group, ["a"])


def test_without_symbolic_links_a_failed_write_keeps_the_version_the_files_refer_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(filegroup, "_symlinks_work", lambda directory, probe: False)
    group = FileGroup(tmp_path, "g", NAMES)
    with group.replacing() as folder:
        (folder / "a").write_bytes(b"model")
        (folder / "a.data").write_bytes(b"tensors")  # what the plain file "a" refers to
        kept = folder.name
    with pytest.raises(RuntimeError), group.replacing() as folder:
        raise RuntimeError("interrupted")
    assert (tmp_path / kept / "a.data").read_bytes() == b"tensors"
    assert visible_files(tmp_path) == {"a": b"model"}
    assert leftovers(tmp_path) == []
