"""The ``onnxtrain`` command: ``demo``, ``generate``, ``train``, ``inspect`` and ``export`` (docs/cli.md).

Each subcommand is a module with ``add_parser(subcommands)`` and ``run(args)``;
the library does the work. Expected errors are one line on standard error
(:mod:`onnxtrain.cli.common`), and so is each warning (``onnxtrain train:
warning: ...``, without the source line Python would show). When the reader of standard output goes away
(``onnxtrain inspect DIR | head -3``), the command ends quietly with status
``BROKEN_PIPE`` (141), as a command that SIGPIPE ends.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any, TextIO

from onnxtrain.cli import demo, export, generate, inspect, train
from onnxtrain.cli.common import BROKEN_PIPE, INTERRUPTED, Parser, expected_errors, report

SUBCOMMANDS = (demo, generate, train, inspect, export)


def build_parser() -> Parser:
    """The parser of ``onnxtrain`` and its subcommands."""
    from onnxtrain import __version__

    parser = Parser(
        prog="onnxtrain",
        description="Make forward-only ONNX models trainable, train them on stock onnxruntime, export them.",
        epilog="Run `onnxtrain demo` to see every step; `onnxtrain COMMAND --help` describes each command.",
    )
    parser.add_argument("--version", action="version", version=f"onnxtrain {__version__}")
    subcommands = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND", required=True)
    for module in SUBCOMMANDS:
        module.add_parser(subcommands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``onnxtrain`` with ``argv`` (default: the process's arguments); the exit status."""
    try:
        status = _parse_and_run(argv)
        sys.stdout.flush()  # here, not at exit, so that a reader gone away is noticed while it can be handled
    except BrokenPipeError:
        return _reader_gone()
    return status


def _parse_and_run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, --version and usage errors (already printed)
        return exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
    return run(args)


def _reader_gone() -> int:
    """Standard output's reader went away: point it at the null device (nothing left to flush at exit)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):  # a stream without a descriptor (captured in tests): nothing to redirect
        pass
    return BROKEN_PIPE


def run(args: argparse.Namespace) -> int:
    """Run the parsed subcommand; expected errors and warnings become one line each on standard error."""
    with warnings.catch_warnings():
        warnings.showwarning = _warning_line(args.prog)
        return _run(args)


def _warning_line(prog: str) -> Any:
    """A ``warnings.showwarning`` that writes ``PROG: warning: MESSAGE (Category)`` on standard error."""

    def show(
        message: Warning | str, category: type[Warning], filename: str, lineno: int, file: TextIO | None = None,
        line: str | None = None,
    ) -> None:  # fmt: skip
        print(f"{prog}: warning: {message} ({category.__name__})", file=sys.stderr if file is None else file)

    return show


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.run(args))
    except BrokenPipeError:  # the reader went away: main() ends quietly
        raise
    except KeyboardInterrupt:
        print(f"{args.prog}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except expected_errors() as error:
        return report(args.prog, error)


__all__ = ["build_parser", "main"]
