"""The launcher's SIGTERM handler (gpuwatch run): it notes the request and never raises."""

from __future__ import annotations

import os
import signal
import sys
import weakref

import pytest

from gpuwatch.cli._child import handling, leave_if_requested, unwind_later, unwind_requested


class _Target:
    pass


def test_a_sigterm_in_a_weakref_callback_raises_nothing_there(monkeypatch) -> None:
    # The import system's module locks end in weakref callbacks. An exception raised there
    # is printed ("Exception ignored in ...") and dropped, and raised between the callback
    # taking the global import lock and its ``try``, it leaves that lock held, so every
    # other thread's next import waits forever: CI saw gpuwatch run hang so. The handler
    # must raise nothing, and the request must still be known.
    def callback(_ref: object) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs inside this callback
        for _ in range(1000):  # bytecode for the pending handler to run in
            pass

    swallowed: list[type[BaseException]] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: swallowed.append(u.exc_type))
    with handling({signal.SIGTERM: unwind_later}):
        assert unwind_requested() is None
        leave_if_requested()  # nothing asked: nothing happens
        target = _Target()
        ref = weakref.ref(target, callback)
        del target  # the callback runs here
        assert ref() is None
        assert unwind_requested() == signal.SIGTERM
        with pytest.raises(SystemExit) as exc:
            leave_if_requested()
        assert exc.value.code == 128 + signal.SIGTERM
    assert swallowed == []
    with handling({signal.SIGTERM: unwind_later}):
        assert unwind_requested() is None, "each handling() starts afresh"


def test_again_puts_the_handlers_back_after_a_loop_reset_them() -> None:
    before = signal.getsignal(signal.SIGHUP)
    with handling({signal.SIGHUP: unwind_later}) as again:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # what an asyncio loop's close() does
        again()
        assert signal.getsignal(signal.SIGHUP) is unwind_later
    assert signal.getsignal(signal.SIGHUP) == before
