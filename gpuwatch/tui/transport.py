"""What drives the dashboard: the live sources' clock, or a player over a recording.

The dashboard (:class:`~gpuwatch.tui.main_screen.MainScreen`) is one class for both modes; a
transport gives it the newest time, the mode's own keys (its action table, and ``action_*`` methods
that the table's ``transport(...)`` actions run) and the words of its status bar. A key
whose action the transport lacks is off (:meth:`MainScreen.check_action`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, Protocol

from textual.message import Message
from textual.notifications import SeverityLevel
from textual.timer import Timer
from textual.widget import Widget

from ..session import Session
from ..session import navigate as nav
from .actions import LIVE_ACTIONS, Action
from .panel import DevicePanel
from .time_window import TimeWindow


class Dashboard(Protocol):
    """What a transport needs of the dashboard it drives (its main screen,
    :class:`~gpuwatch.tui.main_screen.MainScreen`)."""

    session: Session
    view: TimeWindow
    transport: Transport

    def now(self) -> int:
        """The newest time (the transport's)."""

    def redraw(self) -> None:
        """Redraw now."""

    def plot_width(self) -> int:
        """The charts' plot width in columns."""

    def focused_panel(self) -> DevicePanel | None:
        """The device panel the keys are about."""

    def reference_time(self, direction: int) -> int:
        """Where a jump in ``direction`` starts from."""

    def jump(self, t: int | None, what: str) -> None:
        """Cursor to ``t`` (None: say there is no ``what`` there)."""

    def tell_events(self, t: int) -> None:
        """Say what the marks and OOMs at ``t`` say."""

    def tell_spike(self, found: nav.Spike) -> None:
        """Say which spike a jump landed on."""

    def notify(
        self,
        message: str,
        *,
        severity: SeverityLevel = "information",
        timeout: float | None = None,
    ) -> None:
        """A toast."""

    def set_interval(self, interval: float, callback: Callable[[], Any] | None = None) -> Timer:
        """Call ``callback`` every ``interval`` seconds."""


class Seek(Message):
    """Seek to ``fraction`` of the recording (a click on the replay's scrubber)."""

    def __init__(self, fraction: float) -> None:
        super().__init__()
        self.fraction = fraction


class Transport:
    """Live: the window follows the session's newest time.

    Args:
        clock: Returns the newest time to show.
        subtitle: Shown in the status bar (the socket, the recording), or a function that
            says it anew at each refresh (the live sources: recording, or why not).
        warning: A warning the status bar always shows (a recording that stopped), or None.
    """

    actions: tuple[Action, ...] = LIVE_ACTIONS
    """The keys this mode has, in the help screen's and the key bar's order."""
    tab_after = "zoom(2.0)"
    """The key bar's "tab Next panel" follows this action's key (when panels are stepped)."""
    no_log = ("no command is running under gpuwatch", 2.0)
    """What ``4`` says when there is no command's output to show, and for how long."""
    polled = False
    """Does the app look for a new frame at each of its ticks (``REDRAW_HZ`` a second)?
    Live, it wakes only when the clock makes a new frame due (:meth:`until`)."""

    def __init__(
        self,
        clock: Callable[[], int],
        subtitle: str | Callable[[], str] = "",
        warning: Callable[[], str | None] | None = None,
    ) -> None:
        self.clock = clock
        self._subtitle = subtitle
        self._warning = warning
        self._dashboard: Dashboard | None = None

    @property
    def dashboard(self) -> Dashboard:
        """The dashboard this transport drives (set when its screen is made)."""
        assert self._dashboard is not None, "attach() first"
        return self._dashboard

    def attach(self, dashboard: Dashboard) -> None:
        """Drive ``dashboard``."""
        self._dashboard = dashboard

    def can(self, name: str) -> bool:
        """Does this mode have the transport action ``name``?"""
        return callable(getattr(self, f"action_{name}", None))

    # ------------------------------------------------------------------ what the app asks

    def now(self) -> int:
        """The newest time to show."""
        return self.clock()

    def subtitle(self) -> str:
        """The status bar's last words."""
        return self._subtitle() if callable(self._subtitle) else self._subtitle

    def warning(self) -> str | None:
        """A warning the status bar always shows, or None."""
        return self._warning() if self._warning is not None else None

    def widgets(self) -> Iterable[Widget]:
        """Widgets of this mode, placed under the notes bar."""
        return ()

    def mount(self) -> None:
        """The app is mounting: set the mode's first view, start its timers."""

    def frame_key(self, now: int) -> tuple[object, int] | None:
        """The frame's key and time (see ``MainScreen._tick``), or None: the app's."""
        return None

    def until(self, t: int) -> float:
        """Seconds until :meth:`now` reaches ``t`` (live, :meth:`now` is a clock: the next
        frame is due at a known time; see :attr:`polled`)."""
        return (t - self.now()) / 1e9

    def figures_time(self, window: tuple[int, int]) -> int:
        """The time the headers and legends describe: the cursor, else the newest time."""
        view = self.dashboard.view
        if view.cursor is not None:
            return view.cursor
        return min(window[1], self.now())

    def mode_text(self) -> str:
        """The first words of the status bar."""
        return "LIVE" if self.dashboard.view.following else "PAUSED"

    def follow_text(self) -> str:
        """What ``f`` just did."""
        if self.dashboard.view.following:
            return "following the newest data"
        return "paused: the window stays"

    def notes_text(self, notes: Iterable[str]) -> str:
        """The notes bar: what the session has to say (no driver, not recording...), from
        the frame's ``notes``."""
        return "\n".join(notes)

    def move_cursor(self, cells: int) -> None:
        """Move the cursor by chart columns."""
        app = self.dashboard
        app.view = app.view.cursor_moved(cells, app.plot_width(), self.now())

    def redrawing(self) -> None:
        """A key or the mouse is about to redraw the dashboard."""

    def seek_fraction(self, fraction: float) -> None:
        """Seek to ``fraction`` of the recording (live: nothing to seek)."""

    # ------------------------------------------------------------------ actions

    def action_home(self) -> None:
        """Show the session's start."""
        app = self.dashboard
        first = app.session.read(app.session.time_range)[0]
        app.view = replace(app.view, end=first + app.view.span, cursor=None)

    def action_end(self) -> None:
        """Follow the newest data."""
        self.dashboard.view = self.dashboard.view.followed()

    def action_jump_boundary(self, direction: int) -> None:
        """Cursor to the previous / next phase boundary on the focused device."""
        app = self.dashboard
        panel = app.focused_panel()
        key = panel.key if panel else None
        s, at = app.session, app.reference_time(direction)

        def boundary() -> int | None:
            on = key if key is not None and nav.has_phases(s, key) else None
            return nav.next_boundary(s, at, direction, on)

        t = s.read(boundary)
        app.jump(t, "phase boundary")

    def action_jump_event(self, direction: int) -> None:
        """Cursor to the previous / next mark or OOM, and say what it says."""
        app = self.dashboard
        times = app.session.read(lambda: nav.events(app.session, None))
        t = nav.step_to(times, app.reference_time(direction), direction)
        if t is not None:
            app.tell_events(t)
        app.jump(t, "mark")

    def action_jump_spike(self) -> None:
        """Cursor to the largest spike of the focused device (see :func:`nav.spike`)."""
        app = self.dashboard
        panel = app.focused_panel()
        if panel is None:
            return
        found = app.session.read(lambda: nav.spike(app.session, panel.key))
        if found is not None:
            app.tell_spike(found)
        app.jump(found.t if found else None, "spike")
