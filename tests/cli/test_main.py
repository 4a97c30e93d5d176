"""The ``onnxtrain`` command itself: help, usage errors, ``python -m onnxtrain`` and the installed script."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from onnxtrain.cli import SUBCOMMANDS, main
from onnxtrain.cli.common import BROKEN_PIPE, expected_errors, one_line, report
from tests.cli.helpers import assert_error, cli

NAMES = [module.__name__.rsplit(".", 1)[1] for module in SUBCOMMANDS]


def test_help_lists_every_subcommand(capsys):
    status, out, _ = cli(capsys, "--help")
    assert status == 0
    assert all(name in out for name in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_every_subcommand_has_help(capsys, name: str):
    status, out, err = cli(capsys, name, "--help")
    assert (status, err) == (0, "")
    assert out.startswith(f"usage: onnxtrain {name}")


def test_no_subcommand_is_a_usage_error(capsys):
    status, out, err = cli(capsys)
    assert status == 2 and out == ""
    assert err.strip() == "onnxtrain: error: the following arguments are required: COMMAND (see onnxtrain --help)"


def test_an_unknown_subcommand(capsys):
    status, _, err = cli(capsys, "fit")
    assert status == 2 and "invalid choice: 'fit'" in err and len(err.strip().splitlines()) == 1


def test_the_version(capsys):
    status, out, _ = cli(capsys, "--version")
    assert status == 0 and out.startswith("onnxtrain ")


def test_errors_are_one_line_with_the_exit_status(capsys):
    assert report("onnxtrain x", ValueError("two\nlines  and   spaces")) == 1
    assert_error(capsys.readouterr().err, "x", "two lines and spaces")
    assert one_line("a\n\tb") == "a b"
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail

    expected = expected_errors()
    assert all(any(issubclass(kind, cls) for cls in expected) for kind in (FileNotFoundError, Fail))
    assert not any(issubclass(AssertionError, cls) for cls in expected)


def test_an_os_error_names_the_file(capsys):
    error = FileNotFoundError(2, "No such file or directory", "/x/y.npz")
    report("onnxtrain train", error)
    assert_error(capsys.readouterr().err, "train", "/x/y.npz: No such file or directory")


def test_unexpected_errors_keep_their_traceback(monkeypatch: pytest.MonkeyPatch):
    from onnxtrain.cli import inspect

    def broken(args: object) -> int:
        raise AssertionError("a bug")

    monkeypatch.setattr(inspect, "run", broken)
    with pytest.raises(AssertionError, match="a bug"):
        main(["inspect", "."])


def _environment() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}


def test_python_dash_m_onnxtrain():
    done = subprocess.run(
        [sys.executable, "-m", "onnxtrain", "--help"], capture_output=True, text=True, env=_environment(), check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: onnxtrain")


def test_the_installed_script():
    script = shutil.which("onnxtrain", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("the onnxtrain script is not installed here (pip install -e . installs it)")
    done = subprocess.run([script, "train", "--epochs", "x"], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert_error(done.stderr, "train", "--epochs")


def test_a_reader_that_closes_early_ends_the_command_quietly(model_path: Path):
    """``onnxtrain inspect MODEL | head -1``: no broken-pipe error, exit status 141 (128 + SIGPIPE)."""
    command = [sys.executable, "-m", "onnxtrain", "inspect", str(model_path)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_environment())
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before the command writes
    err = process.stderr.read().decode()
    assert process.wait(timeout=60) == BROKEN_PIPE == 141
    assert err == ""


def test_a_warning_is_one_line_naming_the_command_and_its_category(capsys):
    """Not Python's two lines (the message, then the source line it is attributed to: the console script's
    ``sys.exit(main())``); the filters still apply, and the process's own ``showwarning`` is kept."""
    import argparse
    import warnings

    from onnxtrain.cli import run

    def warns(args: argparse.Namespace) -> int:
        warnings.warn("the training model computes Gemm in float32", UserWarning, stacklevel=1)
        warnings.warn("an ignored one", DeprecationWarning, stacklevel=1)
        return 0

    before = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        assert run(argparse.Namespace(run=warns, prog="onnxtrain train")) == 0
    assert warnings.showwarning is before
    err = capsys.readouterr().err
    assert err == "onnxtrain train: warning: the training model computes Gemm in float32 (UserWarning)\n"
