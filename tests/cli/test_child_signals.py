"""The launcher's SIGTERM handler when Python swallows its exception (gpuwatch run)."""

from __future__ import annotations

import os
import signal
import sys
import weakref

from gpuwatch.cli._child import handling, unwind_requested, unwinding


class _Target:
    pass


def test_a_sigterm_swallowed_in_a_weakref_callback_is_still_known(monkeypatch) -> None:
    # The import system's module locks end in weakref callbacks; an exception raised there
    # is printed ("Exception ignored in ...") and dropped. CI saw gpuwatch run's SIGTERM
    # land in one and the dashboard run on. The request must survive that.
    def callback(_ref: object) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs inside this callback
        for _ in range(1000):  # bytecode for the pending handler to run in
            pass

    swallowed: list[type[BaseException]] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: swallowed.append(u.exc_type))
    with handling({signal.SIGTERM: unwinding}):
        assert unwind_requested() is None
        target = _Target()
        ref = weakref.ref(target, callback)
        del target  # the callback runs here; its SystemExit does not escape
        assert ref() is None
        assert unwind_requested() == signal.SIGTERM
    assert swallowed == [SystemExit]  # what Python prints as "Exception ignored"
    with handling({signal.SIGTERM: unwinding}):
        assert unwind_requested() is None, "each handling() starts afresh"
