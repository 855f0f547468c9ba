"""The gpuwatch Textual app: a panel per device over one shared, zoomable time window.

Data flow (DESIGN.md): samplers fill the session from their threads; a session listener
posts one mergeable :class:`NewData` message at a time; a timer redraws at most
:data:`REDRAW_HZ` times a second inside ``batch_update``. Nothing here calls NVML.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Footer, Static

from ..fmt import fmt_duration
from ..session import HOST, Session
from .chart import TimelineChart
from .panel import DevicePanel
from .theme import DEFAULT_THEME, builtin_themes
from .view import SECOND, View

REDRAW_HZ = 20


class NewData(Message):
    """The session changed. Mergeable: a queue holds at most one."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, NewData)


class GpuwatchApp(App[int]):
    """The dashboard over a :class:`~gpuwatch.session.Session` (live or replayed).

    Args:
        session: What to show.
        theme_name: A theme from ``themes/`` (default ``gpuwatch-dark``).
        subtitle: Shown in the status bar (socket path, file name...).
        clock: Returns the newest time to show (default :meth:`Session.now`); a replay
            passes its playback position.
    """

    TITLE = "gpuwatch"
    CSS = """
    Screen {
        layout: vertical;
    }
    #status {
        height: 1;
        background: $panel;
        color: $text;
        padding: 0 1;
    }
    #notes {
        height: auto;
        color: $warning;
        padding: 0 1;
    }
    #panels {
        height: 1fr;
    }
    """

    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("f", "toggle_follow", "Follow/pause"),
        Binding("plus,equals_sign", "zoom_in", "Zoom in", key_display="+"),
        Binding("minus", "zoom_out", "Zoom out", key_display="-"),
        Binding("left", "cursor(-1)", "Cursor ←", show=False),
        Binding("right", "cursor(1)", "Cursor →", show=False),
        Binding("shift+left", "pan(-0.25)", "Pan ←", show=False),
        Binding("shift+right", "pan(0.25)", "Pan →", show=False),
        Binding("y", "toggle_fit", "Fit/total"),
    ]

    def __init__(
        self,
        session: Session,
        *,
        theme_name: str | None = None,
        subtitle: str = "",
        clock: Callable[[], int] | None = None,
    ) -> None:
        super().__init__()
        self.session = session
        self.clock = clock or session.now
        self.view = View()
        self.subtitle_text = subtitle
        self._theme_name = theme_name or DEFAULT_THEME
        self._panels: dict[str, DevicePanel] = {}
        self._pending = False
        self._drawn_version = -1
        self.redraws = 0

    # ------------------------------------------------------------------ setup

    def compose(self) -> ComposeResult:
        yield Static("", id="status")
        yield Static("", id="notes")
        yield VerticalScroll(id="panels")
        yield Footer()

    def on_mount(self) -> None:
        for theme in builtin_themes():
            self.register_theme(theme)
        self.theme = self._theme_name
        self.session.subscribe(self._on_session_change)
        self._sync_panels()
        self.set_interval(1 / REDRAW_HZ, self._tick)
        self._tick()

    def _on_session_change(self, kind: str, args: tuple[Any, ...]) -> None:
        # Runs on sampler threads: post at most one message until the UI has seen it.
        if not self._pending:
            self._pending = True
            self.post_message(NewData())

    @on(NewData)
    def _new_data(self) -> None:
        self._pending = False

    def _sync_panels(self) -> None:
        """Mount a panel for every device the session knows (GPUs first, host last)."""
        keys = sorted(self.session.devices, key=lambda k: (k == HOST, self._order(k)))
        container = self.query_one("#panels", VerticalScroll)
        for key in keys:
            if key not in self._panels:
                panel = DevicePanel(self.session, key)
                self._panels[key] = panel
                container.mount(panel)

    def _order(self, key: str) -> tuple[int, str]:
        dev = self.session.devices[key]
        return (dev.index if dev.index is not None else 1 << 30, key)

    # ------------------------------------------------------------------ drawing

    def now(self) -> int:
        """The newest time: the clock when live, the playback position when replaying."""
        return self.clock()

    def _tick(self) -> None:
        version = self.session.version
        if version == self._drawn_version and not self.view.following:
            return
        self._drawn_version = version
        if len(self._panels) != len(self.session.devices):
            self._sync_panels()
        now = self.now()
        window = self.view.window(now)
        with self.batch_update():
            for panel in self._panels.values():
                panel.update_view(window, self.view.cursor, version)
            self._update_status(now)
        self.redraws += 1

    def redraw(self) -> None:
        """Redraw now (after a key or mouse action)."""
        self._drawn_version = -1
        self._tick()

    def _update_status(self, now: int) -> None:
        s = self.session
        mode = "LIVE" if self.view.following else "PAUSED"
        procs = len([p for p in s.processes.values() if p.ended is None])
        rejects = sum(s.rejects.values())
        dropped = sum(p.dropped for p in s.processes.values())
        parts = [
            f"[b]gpuwatch[/b] · {mode}",
            f"window {fmt_duration(self.view.span)}",
            f"{procs} instrumented",
        ]
        if rejects:
            parts.append(f"[$warning]{rejects} rejected[/]")
        if dropped:
            parts.append(f"[$warning]{dropped} dropped[/]")
        if self.view.cursor is not None:
            parts.append(f"cursor {fmt_duration(self.view.cursor - s.t_origin)}")
        if self.subtitle_text:
            parts.append(self.subtitle_text)
        self.query_one("#status", Static).update(" · ".join(parts))
        self.query_one("#notes", Static).update("\n".join(s.notes))

    # ------------------------------------------------------------------ actions

    def _plot_width(self) -> int:
        for panel in self._panels.values():
            if panel.chart.plot_width > 0:
                return panel.chart.plot_width
        return 100

    def action_toggle_follow(self) -> None:
        """Follow live data / freeze the window."""
        self.view.toggle_follow(self.now())
        self.redraw()

    def action_zoom_in(self) -> None:
        """Halve the time window."""
        self.view.zoom(0.5, self.now())
        self.redraw()

    def action_zoom_out(self) -> None:
        """Double the time window."""
        self.view.zoom(2.0, self.now())
        self.redraw()

    def action_pan(self, fraction: float) -> None:
        """Move the window by a fraction of its width."""
        self.view.pan(fraction, self.now(), self.session.time_range()[0])
        self.redraw()

    def action_cursor(self, cells: int) -> None:
        """Move the cursor by chart columns."""
        self.view.move_cursor(cells, self._plot_width(), self.now())
        self.redraw()

    def action_toggle_fit(self) -> None:
        """Scale the y axis to the data / to the device total."""
        for panel in self._panels.values():
            if panel.key != HOST:
                panel.fit = not panel.fit
                panel.chart.invalidate()
        self.redraw()

    @on(TimelineChart.CursorSet)
    def _cursor_set(self, event: TimelineChart.CursorSet) -> None:
        self.view.set_cursor(event.t, self.now())
        self.redraw()


__all__ = ["SECOND", "GpuwatchApp", "NewData"]
