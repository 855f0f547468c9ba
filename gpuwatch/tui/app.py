"""The gpuwatch Textual app: a panel per device over one shared, zoomable time window.

Data flow (docs/architecture.md): samplers fill the session from their threads; a session listener
posts one mergeable :class:`NewData` message at a time; a one-shot timer redraws inside
``batch_update`` when the next frame is due (see :meth:`GpuwatchApp._schedule`). Nothing
here calls NVML.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shlex
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import partial
from typing import Any, Protocol

from textual import on
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Keymap
from textual.containers import VerticalScroll
from textual.dom import NoScreen
from textual.geometry import Region
from textual.message import Message
from textual.reactive import var
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Static, TabbedContent, TabPane, Tabs

from ..analysis.predicted import predictions
from ..analysis.rank_feed import jobs, rank_of
from ..fmt import ellipsis, fmt_bytes, fmt_clock, fmt_duration, printable
from ..session import Session, is_host
from ..session import navigate as nav
from ..session.model import Oom
from ..session.ports import SessionEvent
from . import marks
from ._text import Fitted, Part, markup_safe, plain_lines
from .actions import LIVE_ACTIONS, REPLAY_ACTIONS, bindings, help_keys
from .chart import TimelineChart
from .confirm import Confirm
from .dashboard_screen import DashboardScreen
from .keys import Key, KeyBar
from .overview import CSS_PATH as OVERVIEW_CSS
from .overview import GpuOverview, gpu_devices
from .panel import DevicePanel
from .parsed_css import SharedStylesheet
from .process_screen import ProcessScreen
from .processes import ProcessesView, ProcessTable
from .ranks import RanksView
from .tables import PeaksTable
from .theme import DEFAULT_THEME, VARIABLE_DEFAULTS, builtin_themes
from .thresholds import Thresholds
from .time_window import TimeWindow
from .transport import Seek, Transport

SHORT_BELOW = 36
"""Terminal rows below which panels are shown one at a time (80x24 gets ~12 chart rows)."""
NARROW_BELOW = 100
"""Terminal columns below which the status bar and keys are fitted more tightly."""

REDRAW_HZ = 20
"""The most frames a second, and how often a replay looks for a new one (its position
moves at its own speed). Live, the app wakes only when a frame is due (:meth:`_schedule`):
each wake-up of the event loop costs the dashboard's CPU, with nothing to draw."""
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
TABLE_HZ = 2
MARK_CELLS = 48
"""The most of a mark's text the status bar shows at the cursor (the Peaks tab lists it
whole)."""
MARK_FLOOR = 24
"""Where room is short, the mark's text is cut down to this many cells before anything
else in the status bar gives way (its first 20 or so characters stay readable at 80
columns); the rest of it goes only after the subtitle, window and count."""
SUBTITLE_FLOOR = 24
"""The status bar's subtitle (the file replayed, the recording and socket) is cut down to
this many cells, like the mark, before the window and the count give way: its start says
what is shown (a list of merged files would otherwise push them out)."""

PANEL_ROWS = 12
"""The rows a device panel needs (DevicePanel's min-height; a host panel's own height)."""
CHROME_ROWS = 5
"""Rows around the panels: status bar, tab strip, a line of notes and the key bar."""


class ChildLike(Protocol):
    """What the dashboard needs of a command started by ``gpuwatch run`` (launch.Child)."""

    pid: int
    log_path: Any
    command: list[str]

    @property
    def exit_status(self) -> int | None:
        """Its exit status as a shell sees it (128 + N: killed by signal N); None: running."""

    def poll(self) -> int | None:
        """The return code, or None while it runs."""

    def signal(self, sig: int) -> bool:
        """Send ``sig`` to its process group."""

    def torch_hint(self) -> str | None:
        """A line saying how to install torch, when it failed for want of it."""


class NewData(Message):
    """The session changed. Mergeable: a queue holds at most one."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, NewData)


class PanelList(VerticalScroll, inherit_bindings=False):
    """The device panels: they scroll, but ``home`` and ``end`` are the dashboard's.

    In the one-panel layout (80x24) a panel has the focus, and a scrolling container's own
    ``home`` / ``end`` (scroll to top / bottom) took the keys before the app saw them.
    """

    BINDINGS = [b for b in VerticalScroll.BINDINGS if b.key not in ("home", "end")]  # type: ignore[union-attr]

    class Scrolled(Message):
        """The list scrolled: panels out of view may have come into it."""

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if round(old_value) != round(new_value):
            self.post_message(self.Scrolled())


class GpuwatchApp(App[int]):
    """The dashboard over a :class:`~gpuwatch.session.Session` (live or replayed).

    Args:
        session: What to show.
        theme_name: A theme from ``themes/`` (default ``gpuwatch-dark``).
        subtitle: Shown in the status bar (socket path, file name...), or a function that
            says it anew at each refresh (the live sources: recording, or why not).
        warning: A warning the status bar always shows (a recording that stopped), or None.
        clock: Returns the newest time to show (default :meth:`Session.now`).
        transport: What drives the dashboard (default: live, from ``clock``, ``subtitle``
            and ``warning``); :class:`~gpuwatch.tui.replay.ReplayTransport` replays.
        keymap: Binding ids to keys (see :data:`~gpuwatch.tui.keymap.KEY_IDS`), over the
            defaults.
        child: The command started by ``gpuwatch run``: its output gets a tab, its state
            the status bar, and quitting while it runs asks first.
        quit_if: Asked once the app has mounted: True quits at once (a SIGTERM that came
            before the app took the signal over).
        thresholds: Where memory and utilisation turn from low to mid to high (default
            nvitop's: see :mod:`~gpuwatch.tui.thresholds`).
    """

    TITLE = "gpuwatch"
    readonly = False
    """``--readonly``: no signal goes to a process from this dashboard (as nvitop's)."""
    # A short terminal (80x24) shows one device panel at a time (tab steps through them),
    # a one-line tab strip and notes; a narrow one fits the status bar and keys to its width.
    VERTICAL_BREAKPOINTS = [(0, "-short"), (SHORT_BELOW, "-tall")]
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (NARROW_BELOW, "-wide")]
    CSS_PATH = [OVERVIEW_CSS, "app.tcss"]
    # Both modes' keys, the replay's first: where a key means two things, the mode's
    # transport turns the other off (check_action).
    BINDINGS = bindings(REPLAY_ACTIONS, LIVE_ACTIONS)

    overview_shown: var[bool] = var(False)
    """The Timelines tab shows the overview (every GPU at a glance), not the panels."""
    # Every assignment redraws, an equal window too: the transport's assignments also
    # stand for its own change (a seek, play or pause) that the frame must show.
    view: var[TimeWindow] = var(TimeWindow(), init=False, always_update=True)
    """The time window the panels show: replaced (never changed) by keys, the mouse and
    the transport; :meth:`watch_view` redraws."""

    def __init__(
        self,
        session: Session,
        *,
        theme_name: str | None = None,
        subtitle: str | Callable[[], str] = "",
        warning: Callable[[], str | None] | None = None,
        clock: Callable[[], int] | None = None,
        transport: Transport | None = None,
        keymap: Keymap | None = None,
        child: ChildLike | None = None,
        quit_if: Callable[[], bool] | None = None,
        thresholds: Thresholds | None = None,
    ) -> None:
        self.thresholds = thresholds or Thresholds()  # the load levels' (flags, config)
        self.transport = transport or Transport(clock or session.now, subtitle, warning)
        self.transport.attach(self)
        super().__init__()
        # What another app of this process parsed is not parsed again (a served visitor's
        # process finds what its fork server parsed drawing the dashboard once).
        self.stylesheet = SharedStylesheet(variables=self.get_css_variables())
        if keymap:
            self.set_keymap(keymap)
        self.session = session
        self.child = child
        self._quit_if = quit_if
        self._child_status: int | None = None
        # What the status bar said that no frame key follows: redrawn when it changes.
        self._status_said: tuple[str, str | None, str] | None = None
        self._theme_name = theme_name or DEFAULT_THEME
        # Set before the first styling pass, which then reads our theme's variables: set
        # in on_mount, every widget was restyled (and all CSS parsed again) before the
        # first frame, which a browser visitor waits for.
        for theme in builtin_themes():
            self.register_theme(theme)
        self.theme = self._theme_name
        self._panels: dict[str, DevicePanel] = {}
        self._arranged: tuple[str, ...] = ()  # the panels' keys in the order they stand
        self._host_run = False  # instrumented processes train on the host, none on a GPU
        self._notes: tuple[str, bool] = ("", False)  # the notes shown, and on a short screen
        # The session's shared predicted lines (the exporter reads the same ones).
        self.predicted = predictions(session)
        self._pending = False
        self._posted = 0.0
        self._drawn_key: object = None
        self._timelines_stale = False  # a frame came while another tab was shown
        self._panels_behind: list[DevicePanel] = []  # out of view at the last frame
        self._shown_version = -1  # the data version a paused view keys its frames on
        self._shown_at = -FOLLOW_FRAME_NS  # when it last moved (monotonic ns)
        self._tables_version: object = -1
        self.redraws = 0
        # The next look for a frame (see _schedule): its timer, and when it fires
        # (monotonic seconds). _due is when the frame key changes next: following, a time
        # of the transport's clock (ns); paused, a monotonic ns; None: not known.
        self._frame_timer: Timer | None = None
        self._frame_at = 0.0
        self._due: tuple[str, int] | None = None
        # The overview: None follows the layout (shown when the panels do not all fit),
        # True / False is the user's choice (g / enter).
        self._overview_choice: bool | None = None
        self._plot_width_at: tuple[object, int] | None = None  # (size, width) of the charts

    # ------------------------------------------------------------------ setup

    def get_theme_variable_defaults(self) -> dict[str, str]:
        # Every gw-* variable exists from the first frame, whatever theme is current
        # (one of Textual's own themes, picked from the palette, defines none of them).
        return {**super().get_theme_variable_defaults(), **VARIABLE_DEFAULTS}

    def get_default_screen(self) -> Screen:
        return DashboardScreen(id="_default")

    def compose(self) -> ComposeResult:
        # Kept as attributes: a modal screen on top must not hide them from the timers.
        self.status_bar = Fitted(id="status")
        self.notes_bar = Static("", id="notes")
        self.notes_bar.display = False
        self.tabs = TabbedContent(initial="timelines")
        self.panel_list = PanelList(id="panels")
        self.overview = GpuOverview(self.session, self.predicted, id="overview")
        self.overview_scroll = VerticalScroll(self.overview, id="overview-scroll")
        self.overview_scroll.can_focus = False  # the overview itself takes the keys
        self.overview_scroll.display = False
        self.peaks_table = PeaksTable(self.session, id="peaks-table")
        self.peaks_table.predicted = self.predicted
        self.marks_table = marks.MarksTable(self.session, id="marks-table")
        self.process_table = ProcessTable(self.session, id="process-table")
        self.process_table.opener = self.open_process
        # The Ranks tab appears once the session has a job of two or more ranks.
        self.ranks_view = RanksView(self.session, id="ranks-view")
        self._ranks_added = False
        yield self.status_bar
        yield self.notes_bar
        yield from self.transport.widgets()
        with self.tabs:
            with TabPane("Timelines", id="timelines"):
                yield self.overview_scroll
                # The devices known now are in the first layout: mounted from on_mount,
                # the first frame came without them and three full redraws followed.
                with self.panel_list:
                    yield from self._new_panels()
            with TabPane("Peaks", id="peaks"):
                yield self.peaks_table
                yield self.marks_table
                yield self.peaks_table.detail
            with TabPane("Processes", id="processes"):
                yield ProcessesView(self.process_table, id="processes-view")
            if self.child is not None:
                from .log import LogView  # only `gpuwatch run` has a log: replay skips it

                with TabPane("Log", id="log"):
                    yield LogView(self.child.log_path, id="child-log")
        self.key_bar = KeyBar()
        yield self.key_bar

    def on_mount(self) -> None:
        self.transport.mount()
        self.session.subscribe(self._on_session_change)
        # The tab strip would swallow the arrow keys meant for the cursor: tabs switch by
        # click or 1/2/3 instead, and focus starts on the first device panel.
        self.tabs.query_one(Tabs).can_focus = False
        self._sync_panels()
        if self.panels:
            self.panels[0].focus()
        self._place_overview()
        # A replay (or a live session that already has a job) shows its Ranks tab from the
        # first frame, not from the first table refresh half a second later.
        self._add_ranks_tab()
        # A closed terminal (SIGHUP) or a kill (SIGTERM) quits cleanly: the recording is
        # flushed, the socket removed, and `gpuwatch run` stops its command.
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGHUP, signal.SIGTERM):
                loop.add_signal_handler(sig, self.exit)
        # A SIGTERM that came before those handlers, and whose exception was swallowed
        # where it landed, still quits (checked after them: none falls between).
        if self._quit_if is not None and self._quit_if():
            self.exit()
            return
        self.set_interval(1 / TABLE_HZ, self._refresh_tables)
        self._tick()

    def _on_session_change(self, event: SessionEvent) -> None:
        # Runs on sampler threads, hundreds of times a second: post at most one message
        # until the UI has seen it, and at most one per frame interval, so the samplers
        # never wake the UI more often than it can draw.
        if self._pending or self.view.following:  # following, the frame timer draws it
            return
        now = time.monotonic()
        if now - self._posted < 1 / REDRAW_HZ:
            return
        self._pending = True
        self._posted = now
        self.post_message(NewData())

    @on(NewData)
    def _new_data(self) -> None:
        self._pending = False
        if not self.view.following:
            self._tick()  # a paused view shows new data in it now; following, the timer does

    def _sync_panels(self) -> None:
        """Mount a panel for every device the session knows, in :meth:`_order`."""
        for panel in self._new_panels():
            self.panel_list.mount(panel)
        self._arrange_panels()

    def _new_panels(self) -> list[DevicePanel]:
        """A panel for every device the session knows that has none yet, in :meth:`_order`."""
        keys = [k for k in sorted(self.session.devices, key=self._order) if k not in self._panels]
        for key in keys:
            self._panels[key] = DevicePanel(self.session, key, self.predicted)
        return [self._panels[k] for k in keys]

    def _arrange_panels(self) -> None:
        """Keep the panels in :meth:`_order` (a process that trains on the CPU makes the
        host panel first when its hello comes); the first panel keeps the focus it had."""
        panels = self.panels
        # Training on the CPU alone, the GPUs show nothing of it: the panels, the host's
        # first, are the first screen even where they do not all fit (see panels_fit).
        trains = [(p.is_host, self._trains_on(p.key)) for p in panels]
        host_run = any(h and t for h, t in trains) and not any(t and not h for h, t in trains)
        if host_run != self._host_run:
            self._host_run = host_run
            self._drawn_key = None  # the next frame places the overview (or the panels)
        keys = tuple(p.key for p in panels)
        if keys == self._arranged:
            return
        first = self._panels[self._arranged[0]] if self._arranged else None
        self._arranged = keys
        for before, panel in itertools.pairwise(panels):
            self.panel_list.move_child(panel, after=before)
        # With GPUs to show, a host panel is a small strip, unless it is where training runs.
        gpus = any(not p.is_host for p in panels)
        for panel in panels:
            if panel.is_host:
                panel.set_class(gpus and not self._trains_on(panel.key), "-secondary")
        if panels and first is not panels[0] and (first is None or first.has_focus_within):
            panels[0].focus(scroll_visible=False)
            self.panel_list.scroll_home(animate=False)

    def _trains_on(self, key: str) -> bool:
        """Does an instrumented process report its memory on this panel: a GPU its
        allocator reads, or the host for one that uses no GPU (torch on the CPU)."""
        if is_host(key):
            return any(not p.devices for p in self.session.processes_of_host(key))
        return bool(self.session.processes_on(key))

    def _order(self, key: str) -> tuple[str, bool, bool, int, str]:
        """Panels by recording, the ones an instrumented process trains on first (whatever
        its device), then GPUs by index, the host last."""
        dev = self.session.devices[key]
        index = dev.index if dev.index is not None else 1 << 30
        return (dev.origin, not self._trains_on(key), dev.kind == "host", index, key)

    @property
    def panels(self) -> list[DevicePanel]:
        """Device panels in display order."""
        return [self._panels[k] for k in sorted(self._panels, key=self._order)]

    # ------------------------------------------------------------------ drawing

    def now(self) -> int:
        """The newest time: the clock when live, the playback position when replaying."""
        return self.transport.now()

    def _tick(self) -> None:
        """Redraw if anything visible changed, then look again when the next frame is due.

        Following live, the window moves continuously but the chart can only show it in
        whole columns, and new samples only touch the newest column: so the frame is keyed
        on the column the clock is in, and redraws happen once a column (at most
        :data:`REDRAW_HZ` a second), with the newest column at most one column behind.
        Paused, the frame is keyed on the session's data version.
        """
        self._due = None
        self._frame()
        self._schedule()

    def _frame(self) -> None:
        """Draw the frame, if its key is not the one drawn (see :meth:`_tick`)."""
        now = self.now()
        key, now = self.transport.frame_key(now) or self.frame_key(now)
        short = self.short
        key = (key, self.size, short)
        if key == self._drawn_key:
            if self._status_changed():
                self._update_status()
            return
        self._drawn_key = key
        if len(self._panels) != len(self.session.devices):
            self._sync_panels()
        self._update_predictions()
        first = self.session.time_range()[0]
        if first != self.view.first:  # the data's start, not a change of view: no redraw
            self.set_reactive(GpuwatchApp.view, replace(self.view, first=first))
        window = self.view.window(now)
        version = self.session.version
        at = self.transport.figures_time(window)
        # Live and following: the newest lists; else (a cursor, a replay) those at ``at``.
        self.process_table.at = None if self.session.live and self.view.following else at
        with self.batch_update():
            self._place_overview()
            self._timelines_stale = self.tabs.active != "timelines"
            if self._timelines_stale:
                pass  # under another tab: drawn when it shows again (_tab_shown)
            elif self.overview_shown:  # the panels are hidden: not drawn (the cost of 8)
                self.overview.update_view(at, version)
            else:
                self._place_panels()
                self._update_panels(window, version, at)
            self._update_status(window)
            self.key_bar.set_keys(self.footer_keys())
            screen = self.screen_stack[-1] if self.screen_stack else None  # none: closing
            if isinstance(screen, ProcessScreen):
                screen.update_view(window, self.view.cursor, version, at)
        self._plot_width_at = None  # the panels' axes may have moved
        self._follow_tables()
        self.redraws += 1

    def _update_panels(self, window: tuple[int, int], version: int, at: int) -> None:
        """Update the panels in view; those scrolled out of it (a run on the CPU keeps every
        GPU's panel below the host's) are updated when they come into view."""
        view = self.panel_list.region
        self._panels_behind = []
        for panel in self._panels.values():
            if self._out_of_view(panel, view):
                self._panels_behind.append(panel)
                continue
            panel.update_view(window, self.view.cursor, version, at)
        if self._panels_behind:  # a new layout can bring them into view without a scroll
            self.call_after_refresh(self._panels_moved)

    @staticmethod
    def _out_of_view(panel: DevicePanel, view: Region) -> bool:
        region = panel.region
        return bool(region and view) and not region.overlaps(view)  # laid out, and outside

    @on(PanelList.Scrolled)
    def _panels_moved(self) -> None:
        view = self.panel_list.region
        if any(not self._out_of_view(p, view) for p in self._panels_behind):
            self._drawn_key = None
            self._look_in(1 / REDRAW_HZ)

    def _schedule(self) -> None:
        """Look for the next frame when it can come, and not before.

        Following live, the frame key changes when the clock enters the next step
        (:meth:`frame_key`); paused, when data that came is due to show; in between nothing
        is drawn, and waking up :data:`REDRAW_HZ` times a second to find that out was most
        of an idle dashboard's CPU. With no frame due, it looks every
        :data:`FOLLOW_FRAME_NS` (what the status bar says outside the frame is looked at
        by :meth:`_refresh_tables` too, a resize by :meth:`on_resize`); a replay, whose
        position moves at its own speed, looks :data:`REDRAW_HZ` times a second. A key or
        the mouse redraws at once (:meth:`redraw`).
        """
        wait = FOLLOW_FRAME_NS / 1e9
        if self.transport.polled:
            wait = 1 / REDRAW_HZ
        elif self._due is not None:
            clock, t = self._due
            if clock == "clock":
                until = self.transport.until(t)
            else:
                until = (t - time.monotonic_ns()) / 1e9
            # A step can be longer than FOLLOW_FRAME_NS (a wide window on a narrow chart):
            # no look in between, but one at least every second.
            wait = min(max(until, 0.0) + FRAME_SLACK, 1.0)
        self._look_in(wait)

    def _look_in(self, wait: float) -> None:
        """Tick in ``wait`` seconds, unless a tick is already due before then."""
        at = time.monotonic() + wait
        timer = self._frame_timer
        if timer is not None:
            # That one looks first (or within a millisecond: the same look, as the
            # clocks read it), and schedules the next.
            if self._frame_at <= at + 0.001:
                return
            timer.stop()
        self._frame_at = at
        self._frame_timer = self.set_timer(wait, partial(self._timer_tick, at), name="frame")

    def _timer_tick(self, at: float) -> None:
        # A timer's callback is queued when it fires: one stopped after that still comes,
        # and one that comes after the last screen went (quitting) has nothing to draw.
        if at != self._frame_at or not self.screen_stack:
            return
        self._frame_timer = None
        self._tick()

    def on_resize(self) -> None:
        # A new size is a new frame: looked for at once (the screen takes its breakpoint
        # classes, -short, a moment after the app its size), not at the next due frame.
        self._look_in(1 / REDRAW_HZ)

    def _follow_tables(self) -> None:
        """The Peaks tab highlights the phase, and the mark, at the cursor."""
        if self.tabs.active == "peaks":
            self.peaks_table.follow(self.view.cursor)
            self.marks_table.follow(self.view.cursor)

    @property
    def short(self) -> bool:
        """The terminal is short (see :data:`SHORT_BELOW`): one panel at a time."""
        try:
            screen = self.panel_list.screen
        except NoScreen:  # not mounted yet, or the app is closing
            return False
        return screen.has_class("-short")

    @property
    def stepping(self) -> bool:
        """One panel at a time (a short terminal) and more than one panel to step through."""
        return self.short and len(self._panels) > 1

    # ------------------------------------------------------------------ overview

    def panels_fit(self) -> bool:
        """Do the GPU panels all fit on the screen at once (else the overview shows)?

        One GPU always does; on a short terminal (one panel at a time) two do not; else
        each needs :data:`PANEL_ROWS`, and the host's strip as much. A run that trains on
        the CPU alone (no instrumented process on a GPU) keeps the panels: its phases are
        on the host's, which comes first (issue 37), and the overview's GPU rows hold
        nothing of it; ``g`` still opens the overview.
        """
        gpus = sum(d.kind == "gpu" for d in list(self.session.devices.values()))
        if gpus < 2 or self._host_run:
            return True
        if self.short:
            return False
        host = any(p.is_host for p in self._panels.values())
        return (gpus + host) * PANEL_ROWS <= self.size.height - CHROME_ROWS

    def _place_overview(self) -> None:
        """Show the overview or the panels, as chosen (else as the layout says)."""
        choice = self._overview_choice
        shown = (not self.panels_fit()) if choice is None else choice
        if shown == self.overview_shown:
            if shown and isinstance(self.focused, DevicePanel):  # hidden: it cannot keep it
                self.overview.focus()
            return
        self.overview_shown = shown
        if self.tabs.active != "timelines":
            return
        if shown:
            panel = self.focused_panel()
            if panel is not None:
                self.overview.select_key(panel.key)
            self.overview.focus()
        elif self.overview.has_focus:
            # Given way to a run on the CPU: its host panel, first; else the selected GPU's.
            self._focus_panel(None if self._host_run else self.overview.selected_key)

    def watch_overview_shown(self, shown: bool) -> None:
        self.overview_scroll.display = shown
        self.panel_list.display = not shown

    def _focus_panel(self, key: str | None) -> None:
        target = self._panels.get(key) if key is not None else None
        if target is None:
            panels = self.panels
            target = panels[0] if panels else None
        if target is not None:
            target.focus(scroll_visible=False)
            self.panel_list.scroll_to_widget(target, animate=False, top=True)

    def open_panel(self, key: str) -> None:
        """Leave the overview for the panel of device ``key``."""
        self._overview_choice = False
        self._place_overview()
        self.call_after_refresh(self._focus_panel, key)
        self._focus_panel(key)
        self.redraw()

    def action_overview(self) -> None:
        """Show the overview, every GPU at a glance (the selection on the panel's GPU)."""
        if self.tabs.active != "timelines":
            self.action_show_tab("timelines")
        panel = self.focused_panel()
        self._overview_choice = True
        self._place_overview()
        if panel is not None:
            self.overview.select_key(panel.key)
        self.overview.focus()
        self.redraw()

    @on(TabbedContent.TabActivated)
    def _tab_shown(self, event: TabbedContent.TabActivated) -> None:
        # A click on the tab's title comes here without action_show_tab's redraw.
        if self._timelines_stale and self.tabs.active == "timelines":
            self.redraw()

    @on(GpuOverview.Opened)
    def _overview_opened(self, event: GpuOverview.Opened) -> None:
        self.open_panel(event.key)

    def _place_panels(self) -> None:
        """Tell each panel where it is among the others, and the layout, when stepping."""
        panels = self.panels
        stepping, short = self.stepping, self.short
        for i, panel in enumerate(panels):
            panel.place = f"{i + 1}/{len(panels)} tab ▸" if stepping else ""
            panel.short = short

    def footer_keys(self) -> list[Key]:
        """The key bar's entries, most important first (help and quit always fit)."""
        keys = [
            Key(a.key_display or a.keys.split(",")[0], a.title, a.action)
            for a in self.transport.actions
            if a.footer
        ]
        at = next((i + 1 for i, k in enumerate(keys) if k.action == self.transport.tab_after), 1)
        timelines = self.tabs.active == "timelines"
        if self.overview_shown and timelines:
            keys.insert(at, Key("enter", "Open GPU", "next_panel(1)"))
        elif self.stepping:
            keys.insert(at, Key("tab", "Next panel", "next_panel(1)"))
        if timelines and not self.overview_shown and len(gpu_devices(self.session)) > 1:
            keys.insert(at + self.stepping, Key("g", "Overview", "overview"))
        keys.append(Key("^p", "palette", "command_palette"))
        return keys

    def frame_key(self, now: int) -> tuple[object, int]:
        """What identifies a frame, and the time to draw it at (see :meth:`_tick`)."""
        if self.view.following:
            col = max(1, self.view.span // max(self.plot_width(), 1))
            # Step by whole columns, and by at least FOLLOW_FRAME_NS: a wide window moves
            # a column every few hundred ms, a narrow one would otherwise redraw at 20 Hz.
            step = col * max(1, -(-FOLLOW_FRAME_NS // col))
            self._due = ("clock", (now // step + 1) * step)
            return ("follow", now // step, self.view.span), (now // step) * step
        return ("paused", self._paused_version()), now

    def _paused_version(self) -> int:
        """The data version a paused view's frames are keyed on: the session's, at most
        once per :data:`FOLLOW_FRAME_NS` (the timer draws what arrived in between)."""
        version = self.session.version
        if version != self._shown_version:
            at = time.monotonic_ns()
            if at - self._shown_at >= FOLLOW_FRAME_NS:
                self._shown_version, self._shown_at = version, at
            else:  # shown when its interval is over
                self._due = ("monotonic", self._shown_at + FOLLOW_FRAME_NS)
        return self._shown_version

    def _update_predictions(self) -> None:
        """Predict each process that sent facts (cached per completed step)."""
        self.predicted.update()

    def _refresh_tables(self) -> None:
        # A hello saying where a process trains can reorder the panels: looked at here, at
        # TABLE_HZ, not each frame (a pass over the processes per device).
        self._arrange_panels()
        if self._status_said is not None and self._status_changed():  # between frames
            self._update_status()
        # The Processes tab shows the figures at the cursor: a new cursor is a new table.
        version = (self.session.version, self.process_table.at)
        if version == self._tables_version:
            return
        self._tables_version = version
        self._add_ranks_tab()
        if self.tabs.active == "peaks":
            self.peaks_table.refresh_rows()
            self.marks_table.refresh_rows()
            self._follow_tables()
        elif self.tabs.active == "processes":
            self.process_table.refresh_rows()
        if self._ranks_added:  # hidden too, for the faults the status bar counts
            faults = self.ranks_view.faults
            self.ranks_view.refresh_rows(hidden=self.tabs.active != "ranks")
            if self.ranks_view.faults != faults:
                self._update_status()

    def has_ranks(self) -> bool:
        """Does the session hold a job of two or more ranks (the Ranks tab is shown)."""
        return self._ranks_added

    def _add_ranks_tab(self) -> Any:
        """Add the Ranks tab once a job of two or more ranks is known; returns what to
        await, or None. (A hello may come after a process's first message: looked for at
        each table refresh until found, a pass over the processes.)"""
        if self._ranks_added:
            return None
        procs = list(self.session.processes.values())
        if sum(rank_of(p) is not None for p in procs) < 2:
            return None
        if not any(len(job) >= 2 for job in jobs(self.session)):
            return None
        self._ranks_added = True
        return self.tabs.add_pane(TabPane("Ranks", self.ranks_view, id="ranks"))

    async def action_show_ranks(self) -> None:
        """Show the Ranks tab (added first if the session has ranks it has not shown)."""
        if not self._ranks_added:
            added = self._add_ranks_tab()
            if added is None:
                self.notify("no job of two or more ranks in this session", timeout=2)
                return
            await added
        self.action_show_tab("ranks")

    def watch_view(self) -> None:
        # The first frame draws the window the transport opened on.
        if self.redraws:
            self.redraw()

    def redraw(self) -> None:
        """Redraw now (after a key or mouse action)."""
        self.transport.redrawing()
        self._drawn_key = None
        self._tick()

    def _update_status(self, window: tuple[int, int] | None = None) -> None:
        """The status bar, one line, fitted to the terminal's width.

        Shown in this order: ``gpuwatch`` and the mode, the warnings (rank faults,
        rejected or dropped messages, a recording that stopped), the cursor's time, the
        mark or OOM nearest the cursor, the window, the instrumented count, the command,
        and the subtitle (the file replayed, or the recording and socket).

        Where the room is short they give way in another order (:func:`fit_ranked`): the
        mark's text is cut first, down to :data:`MARK_FLOOR` cells (its symbol, time and
        the start of what it says), and the subtitle to :data:`SUBTITLE_FLOOR`; then the
        count goes, then the window, then the rest of the subtitle (cut with an ellipsis
        while 8 cells are left for it), the command, the rest of the mark and the cursor.
        So what the cursor reads stays readable at 80 columns, and the file's name before
        the counts. The mode and the warnings never give way: a safety message must show.
        """
        s = self.session
        window = window or self.view.window(self.now())
        # The processes the bands show: those alive in the window.
        procs = len(s.active(*window))
        rejects = sum(s.rejects.values())
        dropped = sum(p.dropped for p in s.processes.values())
        parts: list[Part] = [Part(f"[b]gpuwatch[/b] · {self.transport.mode_text()}")]
        faults = self.ranks_view.faults
        if faults:  # the job's ranks disagree: the Ranks tab says how
            parts.append(Part(f"[$warning]! {faults} rank fault{'s' * (faults != 1)} (5)[/]"))
        if rejects:
            parts.append(Part(f"[$warning]{rejects} rejected[/]"))
        if dropped:
            parts.append(Part(f"[$warning]{dropped} dropped[/]"))
        warning = self.transport.warning()
        if warning:
            parts.append(Part(f"[$warning]{markup_safe(warning)}[/]"))
        if self.view.cursor is not None:
            # What the cursor reads: the time, and the mark or OOM nearest to it in the
            # window with what it says.
            parts.append(Part(f"cursor {fmt_clock(self.view.cursor - s.t_origin)}", keep=6))
            near = marks.nearest(s, self.view.cursor, *window)
            if near is not None:
                at = f"{marks.symbol(near)} {fmt_clock(near.t - s.t_origin)} "
                said = ellipsis(self.marks_table.describe(near, short=True), MARK_CELLS)
                text = markup_safe(at + said)
                parts.append(Part(text, keep=5, floor=len(at) + MARK_FLOOR))
        parts.append(Part(f"window {fmt_duration(self.view.span)}", keep=2))
        parts.append(Part(f"{procs} instrumented", keep=1))
        if self.child is not None:
            parts.append(Part(self._child_text(), keep=4))
        subtitle = self.transport.subtitle()
        if subtitle:
            parts.append(Part(markup_safe(subtitle), keep=3, floor=SUBTITLE_FLOOR))
        self.status_bar.set(parts)
        notes = self.transport.notes_text()
        self._status_said = (subtitle, warning, notes)
        short = self.short
        if (notes, short) != self._notes:  # height auto: a new note needs a layout pass
            self._notes = (notes, short)
            lines = notes.split("\n") if notes else []
            # A short screen has one line for them: joined, and cut with an ellipsis (CSS).
            self.notes_bar.update(plain_lines([" · ".join(lines)] if short else lines))
            self.notes_bar.display = bool(notes)

    def _status_changed(self) -> bool:
        """Has what the status bar shows from outside the frame (the subtitle, the warning,
        the notes) changed since it was drawn? A recording can stop while the frame stays
        the same (paused, or a clock that stands still)."""
        t = self.transport
        return self._status_said != (t.subtitle(), t.warning(), t.notes_text())

    def _child_text(self) -> str:
        assert self.child is not None
        code = self.child.poll()
        if code is None:
            return f"running pid {self.child.pid} (4: log)"
        status = self.child.exit_status
        if self._child_status is None:
            self._child_status = status
            self.session.child_exited(self.child.pid, status)
            torch = self.child.torch_hint()
            hint = f"\n{torch}" if torch else ""
            self.notify(
                f"the command exited with status {status}{hint}",
                severity="information" if status == 0 else "error",
                timeout=10 if hint else 6,
                markup=False,  # "gpuwatch[torch]" is not a style
            )
        colour = "$success" if status == 0 else "$error"
        return f"[{colour}]command exited {status}[/]"

    # ------------------------------------------------------------------ helpers

    def focused_panel(self) -> DevicePanel | None:
        """The panel holding focus (on the overview: the selected GPU's), else the first."""
        if self.overview_shown and self.overview.selected_key in self._panels:
            return self._panels[self.overview.selected_key]
        node = self.focused
        while node is not None:
            if isinstance(node, DevicePanel):
                return node
            node = node.parent  # type: ignore[assignment]
        panels = self.panels
        return panels[0] if panels else None

    def plot_width(self) -> int:
        """The charts' plot width in columns (a chart not drawn yet: 100)."""
        # Asked at every tick (20 a second) to key the frame: kept until a frame is drawn
        # or the terminal's size changes, as asking each panel's chart costs more.
        size = self.size
        if self._plot_width_at is not None and self._plot_width_at[0] == size:
            return self._plot_width_at[1]
        width = next(
            (p.chart.plot_width for p in self._panels.values() if p.chart.plot_width > 0), 100
        )
        self._plot_width_at = (size, width)
        return width

    def reference_time(self, direction: int) -> int:
        """Where jumps start from: the cursor; without one, the window's left edge when
        going forward and its right edge (at most the newest time) when going back."""
        if self.view.cursor is not None:
            return self.view.cursor
        now = self.now()
        t0, t1 = self.view.window(now)
        return t0 - 1 if direction > 0 else min(t1, now) + 1

    def jump(self, t: int | None, what: str) -> None:
        """Cursor to ``t`` (None: say there is no ``what`` there)."""
        if t is None:
            self.notify(f"no {what} there", severity="warning", timeout=2)
            return
        self.view = self.view.jumped(t, self.now())

    # ------------------------------------------------------------------ actions

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """A ``transport(...)`` action is on where the mode's transport has it. Off, its
        key goes to the key's next binding (``space`` plays a replay, follows live)."""
        if action == "transport":
            return bool(parameters) and self.transport.can(str(parameters[0]))
        return True

    def action_transport(self, name: str, *args: object) -> None:
        """Run the mode's own action ``name`` (:mod:`gpuwatch.tui.transport`)."""
        getattr(self.transport, f"action_{name}")(*args)

    def action_toggle_follow(self) -> None:
        """Follow live data / freeze the window (and say which)."""
        self.view = self.view.toggled(self.now())
        self.notify(self.transport.follow_text(), timeout=2)

    def action_zoom(self, factor: float) -> None:
        """Scale the time window (around the cursor when there is one)."""
        self.view = self.view.zoomed(factor, self.now())

    def action_pan(self, fraction: float) -> None:
        """Move the window by a fraction of its width."""
        self.view = self.view.panned(fraction, self.now())

    def action_cursor(self, cells: int) -> None:
        """Move the cursor by chart columns (a replay's position with it)."""
        self.transport.move_cursor(cells)

    def action_cursor_window(self, fraction: float) -> None:
        """Move the cursor by a fraction of the window (whole columns, at least one)."""
        cells = round(fraction * self.plot_width())
        self.action_cursor(cells or (1 if fraction > 0 else -1))

    def action_clear_cursor(self) -> None:
        """Remove the cursor (the legend shows the newest values again)."""
        self.view = replace(self.view, cursor=None)

    def tell_events(self, t: int) -> None:
        """Say what the marks and OOMs at ``t`` (where a jump landed) say."""
        for event in marks.at(self.session, t)[:3]:
            oom = isinstance(event, Oom)
            self.notify(
                f"{marks.symbol(event)} {self.marks_table.describe(event, pid=True)}",
                severity="error" if oom else "information",
                timeout=8 if oom else 5,
                markup=False,
            )

    def tell_spike(self, found: nav.Spike) -> None:
        """Say which spike ``s`` landed on and what measured it."""
        what = nav.SPIKE_WORDS.get(found.source, found.source)
        if found.source == "phase":
            step = f" (step {found.step})" if found.step is not None else ""
            where = f"{printable(found.phase or '?')}{step}"
            text = f"largest spike: {fmt_bytes(found.value)}, {what} of {where}"
        else:
            text = f"largest spike: {fmt_bytes(found.value)}, {what} (no exact phase peaks)"
        self.notify(text, timeout=4, markup=False)

    def action_toggle_fit(self) -> None:
        """Scale GPU y axes to the data / to the device total (and say which)."""
        gpus = [panel for panel in self._panels.values() if not panel.is_host]
        if not gpus:
            self.notify("no GPU panel: the host's axis is its RAM", timeout=2)
            return
        fit = not gpus[0].fit  # one state for all: a mixed set is made even
        for panel in gpus:
            panel.fit = fit
        what = "fitted to the data" if fit else "the device's total"
        self.notify(f"y axis: {what}", timeout=2)
        self.redraw()

    def action_next_panel(self, step: int) -> None:
        """Focus the next (or previous) device panel, and scroll it into view."""
        panels = self.panels
        if not panels:
            return
        if self.tabs.active != "timelines":
            self.action_show_tab("timelines")
        if self.overview_shown:
            key = self.overview.selected_key
            if key is not None:
                self.open_panel(key)
                return
        current = self.focused_panel()
        i = panels.index(current) if current in panels else -step
        target = panels[(i + step) % len(panels)]
        target.focus(scroll_visible=False)
        self.panel_list.scroll_to_widget(target, animate=False, top=True)
        self.redraw()

    def action_show_tab(self, tab: str) -> None:
        """Switch between timelines, peaks, processes, ranks and the command's log."""
        if tab == "log" and self.child is None:
            text, timeout = self.transport.no_log
            self.notify(text, timeout=timeout)
            return
        if tab == "ranks" and not self._ranks_added:
            return  # action_show_ranks adds it first
        self.tabs.active = tab
        # Focus follows the tab (focusing a widget in another tab would switch back to it).
        targets = {
            "peaks": self.peaks_table,
            "processes": self.process_table,
            "ranks": self.ranks_view,
        }
        if tab == "log":
            from .log import LogView

            targets["log"] = self.query_one(LogView)
        target = targets.get(tab)
        if target is not None:
            target.focus()
        elif self.overview_shown:
            self.overview.focus()
        elif self.panels:
            self.panels[0].focus()
        self._tables_version = -1
        self._refresh_tables()
        self.redraw()  # the key bar: the overview's keys only on its tab

    def open_process(self, row: Any) -> None:
        """Open a process's own timelines (``enter`` on the Processes tab)."""
        self.push_screen(ProcessScreen(self.session, row))

    async def action_quit(self) -> None:
        """Quit; while a command started by ``gpuwatch run`` still runs, ask first."""
        child = self.child
        if child is None or child.poll() is not None:
            self.exit()
            return

        def answered(stop: bool | None) -> None:
            if stop:
                child.signal(signal.SIGTERM)  # gpuwatch run escalates after the app closes
                self.exit()

        self.push_screen(
            Confirm(
                ellipsis(shlex.join(child.command), 70),
                f"pid {child.pid} is still running. Stop it and quit?",
            ),
            answered,
        )

    def action_help(self) -> None:
        """Show the help screen."""
        from .help import HelpScreen  # Markdown's imports cost a first frame ~25 ms: on demand

        self.push_screen(HelpScreen(help_keys(self.transport.actions)))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Every gpuwatch action in the command palette, beside Textual's own."""
        yield from super().get_system_commands(screen)
        for a in self.transport.actions:
            if a.action == "quit":
                continue
            yield SystemCommand(a.title, a.help, _bind(self, a.action))

    # ------------------------------------------------------------------ mouse

    @on(TimelineChart.CursorSet)
    def _cursor_set(self, event: TimelineChart.CursorSet) -> None:
        self.view = self.view.with_cursor(event.t, self.now())

    @on(TimelineChart.Zoom)
    def _zoom_at(self, event: TimelineChart.Zoom) -> None:
        self.view = self.view.zoomed(event.factor, self.now(), anchor=event.t)

    @on(Seek)
    def _seek(self, event: Seek) -> None:
        self.transport.seek_fraction(event.fraction)

    @on(TimelineChart.Pan)
    def _pan(self, event: TimelineChart.Pan) -> None:
        self.action_pan(event.fraction)


def _bind(app: App, action: str) -> Callable[[], object]:
    async def run() -> None:
        await app.run_action(action)

    return run
