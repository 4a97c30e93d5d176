"""What the subcommands share: one-line usage errors, argument types, and which errors are expected.

An expected error (a bad argument, a missing or corrupt file, anything the
library rejects with ``ValueError``, ``TypeError``, ``OSError``, ...) is one
line on standard error, ``onnxtrain <subcommand>: error: ...``, and exit
status 1 (2 for usage errors, as argparse does). Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import NoReturn

#: Exit status of an expected failure; usage errors exit with argparse's 2, interrupted runs with 130.
FAILURE = 1
USAGE = 2
INTERRUPTED = 130
#: Exit status when the reader of standard output went away (``onnxtrain ... | head``): 128 + SIGPIPE, as a shell
#: reports a command that SIGPIPE ended.
BROKEN_PIPE = 141


class CommandError(Exception):
    """An expected failure a subcommand reports itself: its message, one line, and exit status 1."""

    status = FAILURE


class UsageError(CommandError):
    """A combination of arguments that does not make sense: exit status 2, as argparse's errors."""

    status = USAGE


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line: ``onnxtrain train: error: ...``."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def one_line(message: object) -> str:
    """``message`` on one line: its lines joined, runs of spaces collapsed."""
    return " ".join(str(message).split())


def report(prog: str, error: BaseException) -> int:
    """Print ``error`` as ``prog: error: ...`` on standard error; return the exit status."""
    text = str(error) or type(error).__name__
    if isinstance(error, OSError) and error.strerror and error.filename and error.strerror in text:
        text = f"{error.filename}: {error.strerror}"
    print(f"{prog}: error: {one_line(text)}", file=sys.stderr)
    return error.status if isinstance(error, CommandError) else FAILURE


def expected_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that are the user's problem, not a bug: reported in one line."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

    from onnxtrain.training.binding import RunError

    from_onnxruntime = tuple(
        value
        for value in vars(ort_errors).values()
        if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == ort_errors.__name__
    )
    expected = (CommandError, ValueError, TypeError, OSError, NotImplementedError, FloatingPointError, RunError)
    return (*expected, *from_onnxruntime)


def in_options(text: str, options: Mapping[str, str]) -> str:
    """``text`` with each library argument name (a key of ``options``, a whole word) replaced by its option."""
    for name, option in options.items():
        text = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w])", option, text)
    return text


@contextmanager
def speaking_options(options: Mapping[str, str]) -> Iterator[None]:
    """Re-raise the library's ``ValueError`` and ``TypeError`` with its argument names as the command's options."""
    try:
        yield
    except (ValueError, TypeError) as error:
        text = in_options(str(error), options)
        if text == str(error):
            raise
        raise type(error)(text) from error


def count(minimum: int) -> Callable[[str], int]:
    """An argument type: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is less than {minimum}")
        return value

    return parse


def non_negative(text: str) -> float:
    """An argument type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a finite number >= 0")
    return value


def positive(text: str) -> float:
    """An argument type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a finite number > 0")
    return value


def fraction(text: str) -> float:
    """An argument type: a number strictly between 0 and 1."""
    value = non_negative(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a fraction strictly between 0 and 1")
    return value


def size_text(size: int) -> str:
    """``532 B``, ``18.8 KiB``, ``3.1 MiB``."""
    if size < 1024:
        return f"{size} B"
    value = size / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


__all__ = [
    "BROKEN_PIPE",
    "FAILURE",
    "INTERRUPTED",
    "USAGE",
    "CommandError",
    "Parser",
    "UsageError",
    "count",
    "expected_errors",
    "fraction",
    "in_options",
    "non_negative",
    "one_line",
    "positive",
    "report",
    "size_text",
    "speaking_options",
]
