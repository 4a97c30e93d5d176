"""Ctrl-C during a run, taken at a safe point: between steps, never halfway through one.

A ``KeyboardInterrupt`` raised in the middle of a step (after the optimizer
recorded its update and before it counted the step, say) would leave a state
that no step count describes. While a run lasts, :class:`DeferredInterrupt`
makes SIGINT only note the request; the loop calls :meth:`check` between
steps, which raises ``KeyboardInterrupt`` there. A second Ctrl-C before that
raises :class:`ImmediateInterrupt` at once. Only the main thread receives signals, and only Python's own
handler is replaced: elsewhere, or with a handler of the application's,
nothing changes.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any


class ImmediateInterrupt(KeyboardInterrupt):
    """The second Ctrl-C: raised at once, wherever the run is (its state may be halfway through a step)."""


class DeferredInterrupt:
    """A context manager under which SIGINT is raised as ``KeyboardInterrupt`` at :meth:`check` only."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> DeferredInterrupt:
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._note)
            self._installed = True
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:  # asked twice: stop now
            raise ImmediateInterrupt
        self.requested = True

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` if Ctrl-C was pressed since the run began."""
        if self.requested:
            self.requested = False
            raise KeyboardInterrupt


__all__ = ["DeferredInterrupt", "ImmediateInterrupt"]
