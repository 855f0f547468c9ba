"""The time window the panels show: its span, whether it follows live, where the cursor is.

Pure Python, no textual: the dashboard's key and mouse actions are methods here, so their
arithmetic is tested without a terminal.
"""

from __future__ import annotations

from dataclasses import dataclass

SECOND = 10**9
MIN_SPAN = 50 * 10**6  # 50 ms: a few samples at the fastest poll rate
MAX_SPAN = 7 * 24 * 3600 * SECOND


@dataclass
class TimeWindow:
    """A time window ``[end - span, end]``; ``end`` None means "follow the newest data".

    Attributes:
        span: Width of the window in ns.
        end: Right edge when paused; None when following live.
        cursor: Cursor time, or None for "no cursor" (legend shows the newest values).
        first: The session's first time (see :meth:`window`), kept up to date by the app.
    """

    span: int = 60 * SECOND
    end: int | None = None
    cursor: int | None = None
    first: int | None = None

    @property
    def following(self) -> bool:
        return self.end is None

    def limit(self, now: int) -> int:
        """The latest right edge: the newest time, or the first time plus the span while
        the session is younger than the window (so lines grow from the left)."""
        if self.first is not None and now - self.first < self.span:
            return self.first + self.span
        return now

    def window(self, now: int) -> tuple[int, int]:
        """The window to draw, given the newest time."""
        end = self.limit(now) if self.end is None else self.end
        return end - self.span, end

    def pause(self, now: int) -> None:
        """Freeze the window where it is."""
        if self.end is None:
            self.end = self.window(now)[1]

    def follow(self) -> None:
        """Follow the newest data again (the cursor goes)."""
        self.end = None
        self.cursor = None

    def toggle_follow(self, now: int) -> None:
        if self.following:
            self.pause(now)
        else:
            self.follow()

    def zoom(self, factor: float, now: int, anchor: int | None = None) -> None:
        """Scale the span by ``factor`` (<1 zooms in), keeping ``anchor`` in place.

        With no anchor (the keys), the window is centred on the cursor, as far as the
        session's start and newest time allow; without a cursor the right edge stays. A
        following view stays following when zoomed without a cursor or anchor. The
        anchor (the pointer, for the wheel) keeps its place on the screen.
        """
        new_span = int(min(MAX_SPAN, max(MIN_SPAN, self.span * factor)))
        if self.following and anchor is None and self.cursor is None:
            self.span = new_span
            return
        t0, t1 = self.window(now)
        if anchor is None and self.cursor is not None:
            self.pause(now)
            self.span = new_span
            end = self.cursor + new_span // 2
            if self.first is not None:
                end = max(end, self.first + new_span)
            self.end = min(self.limit(now), end)
            return
        if anchor is None:
            anchor = t1
        frac = (anchor - t0) / max(self.span, 1)
        self.span = new_span
        self.end = min(self.limit(now), anchor + int((1 - frac) * new_span))

    def pan(self, fraction: float, now: int) -> None:
        """Move the window by ``fraction`` of its span (negative: back in time).

        Stops at the newest data and at the session's start.
        """
        self.pause(now)
        assert self.end is not None
        end = self.end + int(fraction * self.span)
        if self.first is not None:
            end = max(end, self.first + self.span)
        self.end = min(end, self.limit(now))

    def set_cursor(self, t: int, now: int) -> None:
        """Put the cursor at ``t`` (pauses, so the cursor does not slide away)."""
        self.pause(now)
        self.cursor = t

    def move_cursor(self, cells: int, width: int, now: int) -> None:
        """Move the cursor by whole chart columns; the window scrolls to keep it in view."""
        if self.cursor is None:
            self.pause(now)
            self.cursor = min(now, self.window(now)[1])
        step = max(1, self.span // max(width, 1))
        self.cursor = min(now, self.cursor + cells * step)
        if self.first is not None:
            self.cursor = max(self.first, self.cursor)
        self.reveal(self.cursor, now)

    def reveal(self, t: int, now: int) -> None:
        """Scroll (not zoom) so that ``t`` is inside the window."""
        t0, t1 = self.window(now)
        if t < t0:
            self.end = t + self.span // 10 * 9
        elif t > t1:
            self.end = min(self.limit(now), t + self.span // 10)

    def jump(self, t: int, now: int) -> None:
        """Cursor to ``t``, window centred on it (jump to a phase, mark or spike)."""
        self.pause(now)
        self.cursor = t
        t0, t1 = self.window(now)
        if not t0 + self.span // 10 <= t <= t1 - self.span // 10:
            self.end = min(self.limit(now), t + self.span // 2)
