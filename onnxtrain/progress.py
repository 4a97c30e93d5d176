"""Progress bars for training loops (``fit``, the ``onnxtrain`` command), drawn by tqdm.

A bar is drawn on standard output when it is a terminal (or when asked to with
``enabled=True``, as ``fit(verbose=1)`` does); otherwise nothing is drawn, so
logs and pipes get only the lines the caller prints itself. ``leave=True``
keeps the finished bar on screen.
"""

from __future__ import annotations

import sys
from typing import IO

from tqdm import tqdm


def stdout_is_terminal() -> bool:
    """Whether standard output is an interactive terminal."""
    isatty = getattr(sys.stdout, "isatty", None)
    return bool(isatty and isatty())


class Progress:
    """A progress bar over ``total`` units, or nothing when disabled.

    Use as a context manager; ``update(n)`` advances it, ``describe(text)``
    sets the text after the bar (the latest loss, say), and ``write(line)``
    prints a line above the bar (or plainly when there is no bar).
    """

    def __init__(
        self,
        total: int | None,
        description: str = "",
        *,
        enabled: bool | None = None,
        leave: bool = False,
        file: IO[str] | None = None,
    ) -> None:
        self._file = sys.stdout if file is None else file
        shown = stdout_is_terminal() if enabled is None else bool(enabled)
        self._bar: tqdm | None = (
            tqdm(total=total, desc=description, file=self._file, dynamic_ncols=True, leave=leave) if shown else None
        )

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def shown(self) -> bool:
        """Whether a bar is drawn."""
        return self._bar is not None

    def update(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def describe(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def write(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=self._file)
        else:
            print(line, file=self._file, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


__all__ = ["Progress", "stdout_is_terminal"]
