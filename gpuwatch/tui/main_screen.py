"""The dashboard's screen: its widgets, keys and actions, and when it draws a frame.

Data flow (docs/architecture.md): samplers fill the session from their threads; a session
listener posts one mergeable :class:`NewData` message at a time; a one-shot timer
(:class:`~gpuwatch.tui.frame_clock.FrameClock`) redraws inside ``batch_update`` when the
next frame is due. Nothing here calls NVML.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol

from textual import on
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.dom import NoScreen
from textual.message import Message
from textual.reactive import var
from textual.widgets import TabbedContent, TabPane, Tabs

from ..analysis.predicted import predictions
from ..analysis.rank_feed import jobs, rank_of
from ..fmt import fmt_bytes, printable
from ..session import Session
from ..session import navigate as nav
from ..session.frame import FrameState
from ..session.model import Oom
from ..session.ports import SessionEvent
from . import marks
from .actions import LIVE_ACTIONS, REPLAY_ACTIONS, bindings
from .chart import TimelineChart
from .dashboard_screen import DashboardScreen
from .forecast_parts import ForecastParts
from .frame_clock import REDRAW_HZ, FrameClock
from .keys import Key, KeyBar, bar_keys, bound_keys, help_rows, node_keys
from .overview import GpuOverview
from .panel import DevicePanel
from .panel_list import PanelList
from .process_screen import ProcessScreen
from .processes import KEYS as PROCESS_KEYS
from .processes import ProcessesView, ProcessTable
from .ranks import RanksView
from .status_line import DashboardParts, NotesLine, StatusLine
from .tables import PeaksTable
from .time_window import TimeWindow
from .transport import Seek, Transport
from .window_actions import WindowActions

TABLE_HZ = 2
STATUS_HZ = 10
"""How often the status line asks the transport whether what it says from outside the
frame (the subtitle, the warning: a recording that stopped) changed. Those come from
callables, with no event to wait on, and a stopped recording must show at once even
where no frame follows (a paused view, a clock that stands still); two cheap calls."""
PANEL_ROWS = 12
"""The rows a device panel needs (DevicePanel's min-height; a host panel's own height)."""
CHROME_ROWS = 5
"""Rows around the panels: status line, tab strip, a line of notes and the key bar."""


class ChildLike(Protocol):
    """What the dashboard needs of a command ``gpuwatch run`` started (LaunchedCommand)."""

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


class MainScreen(WindowActions, DashboardScreen):
    """The dashboard: a panel per device over one shared, zoomable time window, and tabs.

    Args:
        session: What to show.
        transport: What drives it (live, or a replay's player); attached here.
        child: The command started by ``gpuwatch run`` (its output gets a tab), or None.
    """

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
        self, session: Session, transport: Transport, child: ChildLike | None = None
    ) -> None:
        super().__init__(id="_default")
        self.session = session
        self.transport = transport
        self.child = child
        # The session's shared predicted lines (the exporter reads the same ones).
        self.predicted = predictions(session)
        self.frames = FrameClock(
            lambda wait, call: self.app.set_timer(wait, call, name="frame"), self._look
        )
        self._drawn_key: object = None
        self._timelines_stale = False  # a frame came while another tab was shown
        self._tables_version: object = -1
        # What the status line said that no frame key follows: redrawn when it changes.
        self._status_said: tuple[str, str | None] | None = None
        self.redraws = 0
        # The session as the last frame read it (one read a frame; see _frame).
        self.state: FrameState = session.frame_state(lambda first: (first, first))
        # The overview: None follows the layout (shown when the panels do not all fit),
        # True / False is the user's choice (g / enter).
        self._overview_choice: bool | None = None
        self._plot_width_at: tuple[object, int] | None = None  # (size, width) of the charts
        self._ranks_added = False
        self._make_widgets()
        transport.attach(self)

    @property
    def dashboard(self) -> MainScreen:
        return self

    def _make_widgets(self) -> None:
        # Kept as attributes: a screen on top must not hide them from the timers.
        session = self.session
        self.status_bar = StatusLine(id="status")
        DashboardParts(self).install(self.status_bar)
        # A phase still to come that will not fit (docs/foresight.md), among the warnings.
        self.status_bar.add_source("forecast", ForecastParts(session), before="cursor")
        self.notes_bar = NotesLine(id="notes")
        self.tabs = TabbedContent(initial="timelines")
        self.panel_list = PanelList(self.session, self.predicted, id="panels")
        self.overview = GpuOverview(session, self.predicted, id="overview")
        self.overview_scroll = VerticalScroll(self.overview, id="overview-scroll")
        self.overview_scroll.can_focus = False  # the overview itself takes the keys
        self.overview_scroll.display = False
        self.peaks_table = PeaksTable(session, id="peaks-table")
        self.peaks_table.predicted = self.predicted
        self.marks_table = marks.MarksTable(session, id="marks-table")
        self.process_table = ProcessTable(session, id="process-table")
        self.process_table.opener = self.open_process
        # The Ranks tab appears once the session has a job of two or more ranks.
        self.ranks_view = RanksView(session, id="ranks-view")
        self.key_bar = KeyBar()

    def compose(self) -> ComposeResult:
        yield self.status_bar
        yield self.notes_bar
        yield from self.transport.widgets()
        with self.tabs:
            with TabPane("Timelines", id="timelines"):
                yield self.overview_scroll
                # The devices known now are in the first layout: mounted from on_mount,
                # the first frame came without them and three full redraws followed.
                with self.panel_list:
                    yield from self.panel_list.new_panels()
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
        yield self.key_bar

    def on_mount(self) -> None:
        if self.app.return_code is not None:
            return  # quitting already (a SIGTERM that came first): nothing to draw
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
        self.set_interval(1 / TABLE_HZ, self._refresh_tables)
        self.set_interval(1 / STATUS_HZ, self._refresh_status)
        self._tick()

    def _on_session_change(self, event: SessionEvent) -> None:
        # Runs on sampler threads, hundreds of times a second (see FrameClock.data_wakes).
        if self.frames.data_wakes(self.view.following):
            self.post_message(NewData())

    @on(NewData)
    def _new_data(self) -> None:
        self.frames.data_seen()
        if not self.view.following:
            self._tick()  # a paused view shows new data in it now; following, the timer does

    # ------------------------------------------------------------------ panels

    def _sync_panels(self) -> None:
        """Mount a panel for every device the session knows (:class:`PanelList`)."""
        self.panel_list.sync()
        self._arrange_panels()

    def _arrange_panels(self) -> None:
        # Training that moves to the CPU (or back) places the overview anew.
        if self.panel_list.reorder():
            self._drawn_key = None

    @property
    def panels(self) -> list[DevicePanel]:
        """Device panels in display order (:attr:`PanelList.panels`)."""
        return self.panel_list.panels

    # ------------------------------------------------------------------ drawing

    def now(self) -> int:
        """The newest time: the clock when live, the playback position when replaying."""
        return self.transport.now()

    def _look(self) -> None:
        # A look that comes after the last screen went (quitting) has nothing to draw.
        if self.app.screen_stack:
            self._tick()

    def _tick(self) -> None:
        """Redraw if anything visible changed, then look again when the next frame is due
        (:class:`~gpuwatch.tui.frame_clock.FrameClock`: following live, once a chart
        column; paused, when the data changed)."""
        self.frames.due = None
        self._frame()
        self.frames.schedule(self.transport.polled, self.transport.until)

    def _frame(self) -> None:
        """Draw the frame, if its key is not the one drawn (see :meth:`_tick`). A frame
        drawn reads the session once (:meth:`~gpuwatch.session.Session.frame_state`); its
        widgets draw from :attr:`state`."""
        now = self.now()
        key, now = self.transport.frame_key(now) or self.frames.key(
            self.view, now, self.plot_width(), self.session.version
        )
        key = (key, self.size, self.short)
        if key == self._drawn_key:
            if self._status_changed():
                self._update_status()
            return
        self._drawn_key = key
        view = self.view
        state = self.state = self.session.frame_state(
            lambda first: (view if first == view.first else replace(view, first=first)).window(now)
        )
        if len(self.panel_list.by_key) != len(state.devices):
            self._sync_panels()
        # Each process that sent facts (cached per completed step).
        self.session.read(self.predicted.update)
        first = state.time_range[0]
        if first != view.first:  # the data's start, not a change of view: no redraw
            self.set_reactive(MainScreen.view, replace(view, first=first))
        window, version = state.window, state.version
        at = self.transport.figures_time(window)
        # Live and following: the newest lists; else (a cursor, a replay) those at ``at``.
        self.process_table.at = None if state.live and view.following else at
        with self.app.batch_update():
            self._draw(window, version, at)
        self._plot_width_at = None  # the panels' axes may have moved
        self._follow_tables()
        self.redraws += 1

    def _draw(self, window: tuple[int, int], version: int, at: int) -> None:
        self._place_overview()
        self._timelines_stale = self.tabs.active != "timelines"
        if self._timelines_stale:
            pass  # under another tab: drawn when it shows again (_tab_shown)
        elif self.overview_shown:  # the panels are hidden: not drawn (the cost of 8)
            self.overview.update_view(at, version)
        else:
            self.panel_list.place(self.stepping, self.short)
            self.panel_list.update_in_view(window, self.view.cursor, version, at)
        self._update_status(window)
        self.key_bar.set_keys(self.footer_keys())
        stack = self.app.screen_stack
        screen = stack[-1] if stack else None  # none: closing
        if isinstance(screen, ProcessScreen):
            screen.update_view(window, self.view.cursor, version, at)

    @on(PanelList.CameIntoView)
    def _panels_moved(self) -> None:
        self._drawn_key = None
        self.frames.look_in(1 / REDRAW_HZ)

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
        """The status line (:class:`~gpuwatch.tui.status_line.StatusLine`) and the notes."""
        self.status_bar.show(window or self.view.window(self.now()))
        t = self.transport
        self._status_said = (t.subtitle(), t.warning())
        self.notes_bar.show(t.notes_text(self.state.notes), self.short)

    def _status_changed(self) -> bool:
        """Has what the status line shows from outside the frame (the subtitle, the warning)
        changed since it was drawn? A recording can stop while the frame stays the same
        (paused, or a clock that stands still); a note is a new version, a new frame."""
        t = self.transport
        return self._status_said != (t.subtitle(), t.warning())

    def _refresh_status(self) -> None:
        # Between frames (see STATUS_HZ); before the first frame there is nothing to redo.
        if self._status_said is None:
            return
        if self.session.read(lambda: len(self.session.notes)) != len(self.state.notes):
            # A new note (a recording that stopped says why) is drawn now, in a frame of its
            # own: with a clock that stands still the next look may be a second away.
            self._drawn_key = None
            self._tick()
        elif self._status_changed():
            self._update_status()

    def _follow_tables(self) -> None:
        """The Peaks tab highlights the phase, and the mark, at the cursor."""
        if self.tabs.active == "peaks":
            self.peaks_table.follow(self.view.cursor)
            self.marks_table.follow(self.view.cursor)

    @property
    def short(self) -> bool:
        """The terminal is short (``-short``): one panel at a time."""
        try:
            screen = self.panel_list.screen
        except NoScreen:  # not mounted yet, or the app is closing
            return False
        return screen.has_class("-short")

    @property
    def stepping(self) -> bool:
        """One panel at a time (a short terminal) and more than one panel to step through."""
        return self.short and len(self.panel_list.by_key) > 1

    def footer_keys(self) -> list[Key]:
        """The key bar's entries, most important first (help and quit always fit): the
        mode's key-bar actions, then those of the moment, each on the key that runs it now
        (the active bindings, a keymap's keys among them)."""
        # The overview's "open" while it shows (focus may not be on it yet).
        bound = self.keys_now()
        bound["open"] = node_keys(self.overview).get("open", [])
        keys = bar_keys(bound, ((a.action, a.title) for a in self.transport.actions if a.footer))
        at = next((i + 1 for i, k in enumerate(keys) if k.action == self.transport.tab_after), 1)
        timelines = self.tabs.active == "timelines"
        extra = []
        if self.overview_shown and timelines:
            extra.append(("open", "Open GPU", "next_panel(1)"))
        elif self.stepping:
            extra.append(("next_panel(1)", "Next panel", "next_panel(1)"))
        if timelines and not self.overview_shown and self.state.gpus > 1:
            extra.append(("overview", "Overview", "overview"))
        keys[at:at] = [Key(bound[b][0], label, a) for b, label, a in extra if b in bound]
        if "command_palette" in bound:
            keys.append(Key(bound["command_palette"][0], "palette", "command_palette"))
        return keys

    def keys_now(self) -> dict[str, list[str]]:
        """Each action and the keys bound to it now (:func:`~.keys.bound_keys`); an action
        whose key the focused widget's bindings list first (a panel list's scroll keys),
        or that focus has yet to reach (a tab switching), on this screen's own keys."""
        return {**node_keys(self), **bound_keys(self)}

    def plot_width(self) -> int:
        """The charts' plot width in columns (a chart not drawn yet: 100)."""
        # Asked at every tick (20 a second) to key the frame: kept until a frame is drawn
        # or the terminal's size changes, as asking each panel's chart costs more.
        size = self.size
        if self._plot_width_at is not None and self._plot_width_at[0] == size:
            return self._plot_width_at[1]
        widths = (p.chart.plot_width for p in self.panel_list.by_key.values())
        width = next((w for w in widths if w > 0), 100)
        self._plot_width_at = (size, width)
        return width

    # ------------------------------------------------------------------ overview

    def panels_fit(self) -> bool:
        """Do the GPU panels all fit on the screen at once (else the overview shows)?

        One GPU always does; on a short terminal (one panel at a time) two do not; else
        each needs :data:`PANEL_ROWS`, and the host's strip as much. A run that trains on
        the CPU alone (no instrumented process on a GPU) keeps the panels: its phases are
        on the host's, which comes first (issue 37), and the overview's GPU rows hold
        nothing of it; ``g`` still opens the overview.
        """
        gpus = self.state.gpus
        if gpus < 2 or self.panel_list.host_run:
            return True
        if self.short:
            return False
        host = any(p.is_host for p in self.panel_list.by_key.values())
        return (gpus + host) * PANEL_ROWS <= self.size.height - CHROME_ROWS

    def _place_overview(self) -> None:
        """Show the overview or the panels, as chosen (else as the layout says)."""
        choice = self._overview_choice
        shown = (not self.panels_fit()) if choice is None else choice
        timelines = self.tabs.active == "timelines"
        if shown == self.overview_shown:
            # The overview takes the keys while it shows: a hidden panel cannot keep the
            # focus, and focus lost on the way (a panel blurred as its list hid, the tab
            # strip's focus from before any device came) would leave the arrows and enter
            # to nobody. Under another tab, focus is that tab's (a frame between a tab key
            # and its focus moving took it back to the overview).
            if shown and timelines and self.focused is not self.overview:
                self.overview.focus()
            return
        self.overview_shown = shown
        if not timelines:
            return
        if shown:
            panel = self.focused_panel()
            if panel is not None:
                self.overview.select_key(panel.key)
            self.overview.focus()
        elif self.overview.has_focus:
            # Given way to a run on the CPU: its host panel, first; else the selected GPU's.
            host_run = self.panel_list.host_run
            self.panel_list.focus_on(None if host_run else self.overview.selected_key)

    def watch_overview_shown(self, shown: bool) -> None:
        self.overview_scroll.display = shown
        self.panel_list.display = not shown

    def open_panel(self, key: str) -> None:
        """Leave the overview for the panel of device ``key``."""
        self._overview_choice = False
        self._place_overview()
        self.call_after_refresh(self.panel_list.focus_on, key)
        self.panel_list.focus_on(key)
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

    # ------------------------------------------------------------------ tables

    def _refresh_tables(self) -> None:
        # A hello saying where a process trains can reorder the panels: looked at here, at
        # TABLE_HZ, not each frame (a pass over the processes per device).
        self._arrange_panels()
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
        if self._ranks_added:  # hidden too, for the faults the status line counts
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
        if not self.session.read(self._has_job):
            return None
        self._ranks_added = True
        return self.tabs.add_pane(TabPane("Ranks", self.ranks_view, id="ranks"))

    def _has_job(self) -> bool:
        procs = list(self.session.processes.values())
        if sum(rank_of(p) is not None for p in procs) < 2:
            return False
        return any(len(job) >= 2 for job in jobs(self.session))

    async def action_show_ranks(self) -> None:
        """Show the Ranks tab (added first if the session has ranks it has not shown)."""
        if not self._ranks_added:
            added = self._add_ranks_tab()
            if added is None:
                self.notify("no job of two or more ranks in this session", timeout=2)
                return
            await added
        self.action_show_tab("ranks")

    # ------------------------------------------------------------------ helpers

    def focused_panel(self) -> DevicePanel | None:
        """The panel holding focus (on the overview: the selected GPU's), else the first."""
        by_key = self.panel_list.by_key
        if self.overview_shown and self.overview.selected_key in by_key:
            return by_key[self.overview.selected_key]
        node = self.focused
        while node is not None:
            if isinstance(node, DevicePanel):
                return node
            node = node.parent  # type: ignore[assignment]
        panels = self.panels
        return panels[0] if panels else None

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

    def action_toggle_fit(self) -> None:
        """Scale GPU y axes to the data / to the device total (and say which)."""
        gpus = [panel for panel in self.panel_list.by_key.values() if not panel.is_host]
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
        self.app.push_screen(ProcessScreen(self.session, row))

    def action_help(self) -> None:
        """Show the help screen: each action of the mode, on the keys that run it now."""
        from .help import HelpScreen  # Markdown's imports cost a first frame ~25 ms: on demand

        rows = help_rows(self.keys_now(), ((a.action, a.help) for a in self.transport.actions))
        table = node_keys(self.process_table)  # its keys while it has the focus
        process_rows = help_rows(table, ((a, h) for _, a, h in PROCESS_KEYS))
        self.app.push_screen(HelpScreen(rows, process_keys=process_rows))

    async def action_quit(self) -> None:
        """Quit (the app asks first while a command it started still runs)."""
        await self.app.action_quit()

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
