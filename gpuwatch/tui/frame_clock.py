"""When the dashboard draws: the frame key, the next look for a frame, and data wake-ups.

A frame is drawn when its key changes (see :meth:`FrameClock.key`); in between the app
sleeps. :class:`FrameClock` holds that timing and nothing else: it reads time from an
injected clock and arms its one timer through an injected ``set_timer``, so its logic is
tested without running the app (tests/tui/test_frames.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from .time_window import TimeWindow

REDRAW_HZ = 20
"""The most frames a second, and how often a replay looks for a new one (its position
moves at its own speed). Live, the app wakes only when a frame is due
(:meth:`FrameClock.wait`): each wake-up of the event loop costs the dashboard's CPU, with
nothing to draw."""
FOLLOW_FRAME_NS = 500_000_000
"""Following live, frames are at least this far apart (2 a second, nvitop's rate is 1):
repainting a full screen costs Textual ~25 ms, and this keeps the cost of drawing a
dashboard of 8 GPUs at 100 Hz small (``benchmarks/bench_chart.py`` part 2 measures it).
Key presses redraw at once; new data in a paused view shows at once too, then at most
once per this interval (at 20 a second, every sample redrawing all panels, a paused 8-GPU
dashboard took over half a core)."""
FRAME_SLACK = 0.002
"""Seconds a look for a frame waits past the time its key changes: a timer may fire a
little early (Textual's sleeps are shortened by half a millisecond)."""


class Stoppable(Protocol):
    """A timer that can be stopped (Textual's :class:`~textual.timer.Timer`)."""

    def stop(self) -> None:
        """Stop it: its callback does not come."""


SetTimer = Callable[[float, Callable[[], None]], Stoppable]
"""Call a function once, so many seconds from now (``App.set_timer``)."""


class FrameClock:
    """The dashboard's frame timing.

    Following live, the window moves continuously but a chart shows it in whole columns:
    the frame is keyed on the column step the clock is in, and the next look comes when
    the clock enters the next one. Paused, the frame is keyed on the session's data
    version, at most once per :data:`FOLLOW_FRAME_NS`. With no frame due, it looks every
    :data:`FOLLOW_FRAME_NS`; a polled transport (a replay) :data:`REDRAW_HZ` times a second.

    Args:
        set_timer: Arms the one timer (Textual's ``set_timer``).
        tick: What a look runs (the screen's tick: draw if due, then :meth:`schedule`).
        clock: Monotonic nanoseconds (``time.monotonic_ns``; a test's own clock).
    """

    def __init__(
        self,
        set_timer: SetTimer,
        tick: Callable[[], None],
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._set_timer = set_timer
        self._tick = tick
        self.clock = clock
        self.due: tuple[str, int] | None = None
        """When the frame key changes next: ("clock", a time of the transport's clock) or
        ("monotonic", ns of :attr:`clock`); None: not known."""
        self._timer: Stoppable | None = None
        self._at = 0.0  # when the armed look fires (seconds of ``clock``)
        self._shown_version = -1  # the data version a paused view keys its frames on
        self._shown_at = -FOLLOW_FRAME_NS  # when it last moved (ns of ``clock``)
        self._pending = False  # a data wake-up is posted and not yet seen
        self._posted = -1.0  # when the last one was posted (seconds of ``clock``)

    def _seconds(self) -> float:
        return self.clock() / 1e9

    # ------------------------------------------------------------------ keys

    def key(self, view: TimeWindow, now: int, plot_width: int, version: int) -> tuple[object, int]:
        """What identifies the frame at ``now``, and the time to draw it at; sets :attr:`due`."""
        if view.following:
            col = max(1, view.span // max(plot_width, 1))
            # Step by whole columns, and by at least FOLLOW_FRAME_NS: a wide window moves
            # a column every few hundred ms, a narrow one would otherwise redraw at 20 Hz.
            step = col * max(1, -(-FOLLOW_FRAME_NS // col))
            self.due = ("clock", (now // step + 1) * step)
            return ("follow", now // step, view.span), (now // step) * step
        return ("paused", self.paused_version(version)), now

    def paused_version(self, version: int) -> int:
        """The data version a paused view's frames are keyed on: ``version``, at most once
        per :data:`FOLLOW_FRAME_NS` (the timer draws what arrived in between)."""
        if version != self._shown_version:
            at = self.clock()
            if at - self._shown_at >= FOLLOW_FRAME_NS:
                self._shown_version, self._shown_at = version, at
            else:  # shown when its interval is over
                self.due = ("monotonic", self._shown_at + FOLLOW_FRAME_NS)
        return self._shown_version

    # ------------------------------------------------------------------ looks

    def wait(self, polled: bool, until: Callable[[int], float]) -> float:
        """Seconds until the next look: when :attr:`due` comes, at most a second away.

        Args:
            polled: The transport's position moves by itself (a replay): look
                :data:`REDRAW_HZ` times a second.
            until: Seconds until the transport's clock reaches a time.
        """
        if polled:
            return 1 / REDRAW_HZ
        if self.due is None:
            return FOLLOW_FRAME_NS / 1e9
        clock, t = self.due
        left = until(t) if clock == "clock" else (t - self.clock()) / 1e9
        # A step can be longer than FOLLOW_FRAME_NS (a wide window on a narrow chart):
        # no look in between, but one at least every second.
        return min(max(left, 0.0) + FRAME_SLACK, 1.0)

    def schedule(self, polled: bool, until: Callable[[int], float]) -> None:
        """Look again when the next frame can come (:meth:`wait`), and not before."""
        self.look_in(self.wait(polled, until))

    def look_in(self, wait: float) -> None:
        """Look in ``wait`` seconds, unless a look is already due before then."""
        at = self._seconds() + wait
        if self._timer is not None:
            # That one looks first (or within a millisecond: the same look, as the
            # clocks read it), and schedules the next.
            if self._at <= at + 0.001:
                return
            self._timer.stop()
        self._at = at
        self._timer = self._set_timer(wait, lambda: self._fire(at))

    def _fire(self, at: float) -> None:
        # A timer's callback is queued when it fires: one stopped after that still comes.
        if at != self._at:
            return
        self._timer = None
        self._tick()

    # ------------------------------------------------------------------ data

    def data_wakes(self, following: bool) -> bool:
        """Should new data wake the screen now (post one message)? Called on sampler
        threads, hundreds of times a second: at most one message until it is seen
        (:meth:`data_seen`), one per frame interval, none while following (the timer
        draws it)."""
        if self._pending or following:
            return False
        now = self._seconds()
        if now - self._posted < 1 / REDRAW_HZ:
            return False
        self._pending = True
        self._posted = now
        return True

    def data_seen(self) -> None:
        """The data wake-up came: the next change may post another."""
        self._pending = False
