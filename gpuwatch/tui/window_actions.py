"""The keys that move the time window and the cursor, on every screen that shows it."""

from __future__ import annotations

from dataclasses import replace

from .transport import Dashboard


class WindowActions:
    """The keys that move the time window and the cursor, on each screen that shows the
    window: the main screen, and a process's timelines over it (``dashboard``: the main
    screen, which owns the window)."""

    @property
    def dashboard(self) -> Dashboard:
        """The screen whose window (``view``) the keys move."""
        raise NotImplementedError

    def action_toggle_follow(self) -> None:
        """Follow live data / freeze the window (and say which)."""
        d = self.dashboard
        d.view = d.view.toggled(d.now())
        d.notify(d.transport.follow_text(), timeout=2)

    def action_zoom(self, factor: float) -> None:
        """Scale the time window (around the cursor when there is one)."""
        d = self.dashboard
        d.view = d.view.zoomed(factor, d.now())

    def action_pan(self, fraction: float) -> None:
        """Move the window by a fraction of its width."""
        d = self.dashboard
        d.view = d.view.panned(fraction, d.now())

    def action_cursor(self, cells: int) -> None:
        """Move the cursor by chart columns (a replay's position with it)."""
        self.dashboard.transport.move_cursor(cells)

    def action_cursor_window(self, fraction: float) -> None:
        """Move the cursor by a fraction of the window (whole columns, at least one)."""
        cells = round(fraction * self.dashboard.plot_width())
        self.action_cursor(cells or (1 if fraction > 0 else -1))

    def action_clear_cursor(self) -> None:
        """Remove the cursor (the legend shows the newest values again)."""
        d = self.dashboard
        d.view = replace(d.view, cursor=None)
