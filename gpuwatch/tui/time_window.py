"""The time window the panels show: its span, whether it follows live, where the cursor is.

Pure Python, no textual: the dashboard's key and mouse actions are methods here, each
returning the window it leads to, so their arithmetic is tested without a terminal.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

SECOND = 10**9
MIN_SPAN = 50 * 10**6  # 50 ms: a few samples at the fastest poll rate
MAX_SPAN = 7 * 24 * 3600 * SECOND


@dataclass(frozen=True)
class TimeWindow:
    """A time window ``[end - span, end]``; ``end`` None means "follow the newest data".

    A value: each change (a key, the mouse, the transport) builds a new one, so the app
    holds it in one ``var`` and redraws once per change, however many fields moved.

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

    def paused(self, now: int) -> TimeWindow:
        """Frozen where it is."""
        return self if self.end is not None else replace(self, end=self.window(now)[1])

    def followed(self) -> TimeWindow:
        """Following the newest data again (the cursor goes)."""
        return replace(self, end=None, cursor=None)

    def toggled(self, now: int) -> TimeWindow:
        """Paused if following, else following."""
        return self.paused(now) if self.following else self.followed()

    def zoomed(self, factor: float, now: int, anchor: int | None = None) -> TimeWindow:
        """The span scaled by ``factor`` (<1 zooms in), ``anchor`` kept in place.

        With no anchor (the keys), the window is centred on the cursor, as far as the
        session's start and newest time allow; without a cursor the right edge stays. A
        following view stays following when zoomed without a cursor or anchor. The
        anchor (the pointer, for the wheel) keeps its place on the screen.
        """
        span = int(min(MAX_SPAN, max(MIN_SPAN, self.span * factor)))
        if self.following and anchor is None and self.cursor is None:
            return replace(self, span=span)
        if anchor is None and self.cursor is not None:
            end = self.cursor + span // 2
            if self.first is not None:
                end = max(end, self.first + span)
            zoomed = replace(self.paused(now), span=span)
            return replace(zoomed, end=min(zoomed.limit(now), end))
        t0, t1 = self.window(now)
        if anchor is None:
            anchor = t1
        frac = (anchor - t0) / max(self.span, 1)
        zoomed = replace(self, span=span)
        return replace(zoomed, end=min(zoomed.limit(now), anchor + int((1 - frac) * span)))

    def panned(self, fraction: float, now: int) -> TimeWindow:
        """Moved by ``fraction`` of its span (negative: back in time).

        Stops at the newest data and at the session's start.
        """
        end = self.window(now)[1] + int(fraction * self.span)
        if self.first is not None:
            end = max(end, self.first + self.span)
        return replace(self, end=min(end, self.limit(now)))

    def with_cursor(self, t: int, now: int) -> TimeWindow:
        """The cursor at ``t`` (paused, so the cursor does not slide away)."""
        return replace(self.paused(now), cursor=t)

    def cursor_moved(self, cells: int, width: int, now: int) -> TimeWindow:
        """The cursor moved by whole chart columns; the window scrolls to keep it in view."""
        view = self
        if view.cursor is None:
            view = view.with_cursor(min(now, view.window(now)[1]), now)
        assert view.cursor is not None
        step = max(1, view.span // max(width, 1))
        cursor = min(now, view.cursor + cells * step)
        if view.first is not None:
            cursor = max(view.first, cursor)
        return replace(view, cursor=cursor).revealing(cursor, now)

    def revealing(self, t: int, now: int) -> TimeWindow:
        """Scrolled (not zoomed) so that ``t`` is inside the window."""
        t0, t1 = self.window(now)
        if t < t0:
            return replace(self, end=t + self.span // 10 * 9)
        if t > t1:
            return replace(self, end=min(self.limit(now), t + self.span // 10))
        return self

    def jumped(self, t: int, now: int) -> TimeWindow:
        """The cursor at ``t``, the window centred on it (a phase, mark or spike)."""
        view = self.with_cursor(t, now)
        t0, t1 = view.window(now)
        if not t0 + view.span // 10 <= t <= t1 - view.span // 10:
            return replace(view, end=min(view.limit(now), t + view.span // 2))
        return view
