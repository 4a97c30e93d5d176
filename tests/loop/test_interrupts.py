"""Ctrl-C during a run is raised between steps; a second one at once."""

from __future__ import annotations

import signal
import threading

import pytest

from onnxtrain.loop.interrupts import DeferredInterrupt, ImmediateInterrupt

pytestmark = pytest.mark.skipif(
    signal.getsignal(signal.SIGINT) is not signal.default_int_handler, reason="SIGINT has another handler here"
)


def test_the_first_ctrl_c_waits_for_check():
    with DeferredInterrupt() as interrupt:
        signal.raise_signal(signal.SIGINT)
        assert interrupt.requested
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()
        interrupt.check()  # taken once
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_raises_at_once():
    with DeferredInterrupt(), pytest.raises(ImmediateInterrupt):
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_outside_the_main_thread_nothing_changes():
    seen: list[object] = []

    def body() -> None:
        with DeferredInterrupt() as interrupt:
            seen.append(interrupt._installed)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [False]
