"""An interrupted or failed save leaves the previous checkpoint intact and no temporary file."""

from __future__ import annotations

import os

import numpy as np
import pytest

from onnxtrain.checkpoint import CheckpointState, OptimizerState, external_data_path, load, save
from onnxtrain.checkpoint import files as files_module
from onnxtrain.checkpoint import format as format_module
from tests.folders import leftovers, visible_files, visible_names


def state(value: float) -> CheckpointState:
    w = np.full((8, 8), value, np.float32)
    return CheckpointState(
        {"w": w}, {"ids": np.arange(30)}, OptimizerState({"w": [w, w]}, step=int(value)), {"v": value}
    )


def snapshot(directory) -> dict[str, bytes]:
    """The files a reader sees; and no temporary file, unused version or dangling link besides."""
    assert leftovers(directory) == []
    return visible_files(directory)


class Boom(Exception):
    pass


def fail_on_call(real, failing_call: int, error: BaseException):
    calls = {"n": 0}

    def wrapper(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == failing_call:
            raise error
        return real(*args, **kwargs)

    return wrapper


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external"])
@pytest.mark.parametrize("previous_external", [False, True], ids=["old-inline", "old-external"])
@pytest.mark.parametrize(
    ("target", "failing_call", "error"),
    [
        ("encode", 1, Boom("failed while encoding")),
        ("fsync", 1, OSError("disk full")),
        ("fsync", 2, OSError("disk full")),
        ("replace", 1, OSError("rename failed")),
        ("replace", 2, OSError("rename failed")),
        ("replace", 3, OSError("rename failed")),
        ("fsync", 1, KeyboardInterrupt()),
    ],
)
def test_failed_save_keeps_the_previous_checkpoint(
    tmp_path, monkeypatch, external, previous_external, target, failing_call, error
):
    path = tmp_path / "ckpt"
    old = state(1.0)
    threshold = 0 if previous_external else 10**9
    save(old, path, external_data_threshold=threshold)
    before = snapshot(tmp_path)
    if target == "encode":
        real_encode = format_module.encode

        def encode_half(state, *, include_optimizer_state=True, external=None):
            if external is not None:
                external.write(b"partial data")
            raise error

        monkeypatch.setattr(files_module, "encode", encode_half)
        assert real_encode is not None
    elif target == "fsync":
        monkeypatch.setattr(files_module.os, "fsync", fail_on_call(os.fsync, failing_call, error))
    else:
        monkeypatch.setattr(files_module.os, "replace", fail_on_call(os.replace, failing_call, error))
    try:
        save(state(2.0), path, external_data_threshold=0 if external else 10**9)
    except (Boom, OSError, KeyboardInterrupt) as raised:
        assert raised is error
    else:
        # the failing call was never reached (e.g. a third rename an inline save does not make)
        monkeypatch.undo()
        assert load(path) == state(2.0)
        return
    monkeypatch.undo()
    assert snapshot(tmp_path) == before, "the previous checkpoint files changed"
    assert load(path) == old


def test_failed_first_save_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(files_module.os, "replace", fail_on_call(os.replace, 1, OSError("no")))
    with pytest.raises(OSError, match="no"):
        save(state(1.0), tmp_path / "ckpt", external_data_threshold=0)
    assert os.listdir(tmp_path) == []


def test_save_replaces_and_keeps_permissions_default(tmp_path):
    path = tmp_path / "ckpt"
    save(state(1.0), path)
    save(state(2.0), path)
    assert load(path) == state(2.0)
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_external_save_replaces_both_files(tmp_path):
    path = tmp_path / "ckpt"
    save(state(1.0), path, external_data_threshold=0)
    save(state(2.0), path, external_data_threshold=0)
    assert load(path) == state(2.0)
    assert visible_names(tmp_path) == ["ckpt", "ckpt.data"]
    assert leftovers(tmp_path) == []
    assert external_data_path(path) == tmp_path / "ckpt.data"


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external"])
def test_an_os_error_names_the_checkpoint_not_its_temporary_file(tmp_path, monkeypatch, external):
    """A full disk said ``[Errno 28] No space left on device: 'ro/.ckpt.<random>.tmp'``: a file the user never
    named. The error keeps its type and errno, names the checkpoint, and the previous one stands."""
    import errno

    path = tmp_path / "ckpt"
    save(state(1.0), path)
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / ".ckpt.0123.tmp"))
    writer = "write_files" if external else "_write_one_file"
    monkeypatch.setattr(files_module, writer, fail_on_call(getattr(files_module, writer), 1, full))
    with pytest.raises(OSError, match=rf"cannot save checkpoint {path}: No space left on device; the previous") as e:
        save(state(2.0), path, external_data_threshold=0 if external else 10**9)
    assert e.value.errno == errno.ENOSPC and ".tmp" not in str(e.value)
    monkeypatch.undo()
    assert load(path) == state(1.0)
