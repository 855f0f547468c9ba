"""``gpuwatch cluster``: every GPU Prometheus knows, a host's timelines on enter, the ranks.

A thread worker asks Prometheus (one instant query per metric family,
:func:`gpuwatch.cluster.fetch`) at the scrape interval Prometheus reports, never faster
than once a second; the app folds its answers into one :class:`~gpuwatch.cluster.Cluster`
when the worker ends and redraws. Nothing here waits on the network: a slow or gone
Prometheus costs a stale mark and one line, never a frozen screen, and quitting cancels
the worker, which leaves the query in flight to a thread nobody waits for
(:mod:`gpuwatch.cluster.background`). Every label is Prometheus' word and shown as plain
text (never markup).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

from rich.segment import Segment
from rich.style import Style
from textual import events, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.geometry import Region, Size
from textual.message import Message
from textual.screen import Screen
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.timer import Timer
from textual.widgets import Input, Static, TabbedContent, TabPane, Tabs
from textual.worker import Worker, WorkerState, get_current_worker

from ..cluster import SORTS, Answers, Cluster, PromClient, fetch
from ..cluster.background import Cancelled, call
from ..cluster.history import HostHistory, load
from ..cluster.text import HEAD, cell_columns, fit_columns, label, panel_title, ranks_lines
from ..fmt import ellipsis, fmt_duration, printable
from ._text import Fitted, Line, markup_safe, plain, plain_lines
from .band import BandRow, BandSpan, PhaseBand
from .chart import ChartFrame, TimelineChart
from .chart import Series as ChartSeries
from .keys import Key, KeyBar
from .theme import DEFAULT_THEME, builtin_themes

CORE = ("gpuwatch_gpu_memory_total_bytes", "gpuwatch_gpu_memory_used_bytes")
"""A refresh that could read neither of these read nothing (the view marks every GPU stale)."""
MIN_INTERVAL = 1.0
"""Fastest refresh, whatever Prometheus' scrape interval (the issue: no faster than 1 s)."""
UNKNOWN_INTERVAL = 5.0
"""Refresh interval while Prometheus has not said its scrape interval (asked again then)."""
ASK_INTERVAL_EVERY = 60.0
"""Seconds between two readings of Prometheus' scrape interval."""
WINDOWS = (60, 300, 900, 3600, 6 * 3600)
"""The drill-down's time windows in seconds (``+``/``-`` step through them)."""
DEFAULT_WINDOW = 300

CLUSTER_HELP = """\
# gpuwatch cluster

One row per GPU that gpuwatch exporters report to Prometheus, grouped by host: NVML's
used memory against the total (the bar), the ranks on it, the phase its process was in at
the newest scrape (and the step), the exact allocator peak of the last step against the
predicted peak, and the state: *ok*; *lost* (NVML lost the GPU); *stale* (the newest
refresh did not have its series: its exporter stopped answering, or Prometheus did not
answer; the last good figures stay, with their age).

The *Ranks* tab sets the ranks side by side: per phase the highest and lowest peak and
their ranks, and the ranks that stand out. `enter` on a row opens its host's timelines
(NVML used, torch reserved and allocated, predicted, peaks per phase, the phases as a band),
read from Prometheus at its scrape resolution. See docs/cluster.md.

## Keys

| key | action |
| --- | --- |
{keys}
"""


def refresh_interval(scrape: float | None) -> float:
    """Seconds between refreshes for a scrape interval (None: not known yet)."""
    return max(MIN_INTERVAL, scrape if scrape is not None else UNKNOWN_INTERVAL)


Row = list[tuple[str, "Style | None"]]
"""A grid row: its text in styled runs (plain strings, already printable and padded)."""

MEMORY, STATE = HEAD.index("memory"), HEAD.index("state")

CURSOR = Style(reverse=True)
CURSOR_BLURRED = Style(underline=True)
STYLES = {
    name: Style.parse(name) if name else None
    for name in ("", "bold", "dim", "red", "yellow", "green", "bold red")
}


class Grid(ScrollView, can_focus=True):
    """The GPU rows, drawn line by line: only the rows in view are painted each frame.

    A DataTable re-laid-out its whole table at each cell update: 128 GPUs took seconds of
    CPU a refresh. Here a refresh replaces the rows' texts, and painting costs the rows
    on screen. ``up``/``down``/``pageup``/``pagedown``/``home``/``end`` move the cursor,
    ``enter`` opens the row's host.
    """

    BINDINGS = [
        Binding("up", "move(-1)", "Up", show=False),
        Binding("down", "move(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "move(-1000000)", "First row", show=False),
        Binding("end", "move(1000000)", "Last row", show=False),
        Binding("enter", "open", "Open host", show=False),
    ]
    DEFAULT_CSS = """
    Grid { height: 1fr; }
    """

    class Opened(Message):
        """Enter on a row (its key)."""

        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.rows: list[tuple[str, Row]] = []
        self.cursor = 0
        self._strips: dict[tuple[int, int, bool], Strip] = {}

    @property
    def selected(self) -> str | None:
        return self.rows[self.cursor][0] if 0 <= self.cursor < len(self.rows) else None

    def set_rows(self, rows: list[tuple[str, Row]]) -> None:
        """Show ``rows``; the cursor stays on the same key where it still is."""
        key = self.selected
        self.rows = rows
        keys = [k for k, _ in rows]
        self.cursor = keys.index(key) if key in keys else min(self.cursor, max(0, len(rows) - 1))
        self._strips.clear()
        size = Size(max((sum(len(t) for t, _ in r) for _, r in rows), default=0), len(rows))
        if size != self.virtual_size:  # a new size lays the screen out again
            self.virtual_size = size
        self.refresh()

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.size.width
        if index >= len(self.rows):
            return Strip.blank(width, self.rich_style)
        selected = index == self.cursor and self.has_focus
        cache = (index, width + scroll_x, selected)
        strip = self._strips.get(cache)
        if strip is None:
            base = self.rich_style
            if index == self.cursor:
                base += CURSOR if self.has_focus else CURSOR_BLURRED
            segments = [
                Segment(t, base + st if st is not None else base) for t, st in self.rows[index][1]
            ]
            strip = Strip(segments).crop_extend(0, width + scroll_x, base)
            self._strips[cache] = strip
        return strip.crop(scroll_x, scroll_x + width)

    def on_focus(self) -> None:
        self._strips.clear()
        self.refresh()

    def on_blur(self) -> None:
        self._strips.clear()
        self.refresh()

    def action_move(self, delta: int) -> None:
        if not self.rows:
            return
        self.cursor = max(0, min(len(self.rows) - 1, self.cursor + delta))
        self._strips.clear()
        self.scroll_to_region(Region(0, self.cursor, 1, 1), animate=False)
        self.refresh()

    def action_page(self, direction: int) -> None:
        self.action_move(direction * max(1, self.size.height - 1))

    def action_open(self) -> None:
        if self.selected is not None:
            self.post_message(self.Opened(self.selected))

    def on_click(self, event: events.Click) -> None:
        index = self.scroll_offset.y + event.y
        if 0 <= index < len(self.rows):
            if index == self.cursor and event.chain > 1:
                self.action_open()
            self.cursor = index
            self._strips.clear()
            self.refresh()


class ClusterApp(App[int]):
    """The cluster view.

    Args:
        client: Prometheus.
        matchers: ``--job`` and ``--match`` as label matchers.
        sort: The grid's first order (one of :data:`~gpuwatch.cluster.SORTS`).
        theme: A gpuwatch theme name.
    """

    TITLE = "gpuwatch cluster"
    CSS = """
    #summary { height: auto; max-height: 2; background: $panel; color: $text; padding: 0 1; }
    #error { height: auto; color: $warning; padding: 0 1; }
    #filter { height: 3; }
    TabbedContent { height: 1fr; }
    TabbedContent > ContentSwitcher { height: 1fr; }
    #grid { height: 1fr; }
    #grid-head { height: 1; text-style: bold; }
    #ranks-scroll { height: 1fr; }
    """
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("s", "sort", "Sort"),
        Binding("slash", "filter", "Filter"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("r", "refresh_now", "Refresh"),
        Binding("question_mark", "help", "Help"),
        Binding("1", "show_tab('gpus')", "GPUs", show=False),
        Binding("2", "show_tab('ranks')", "Ranks", show=False),
    ]

    def __init__(
        self,
        client: PromClient,
        matchers: Sequence[tuple[str, str, str]] = (),
        *,
        sort: str = "host",
        theme: str | None = None,
    ) -> None:
        super().__init__()
        self.client = client
        self.matchers = list(matchers)
        self.cluster = Cluster()
        self.sort = sort if sort in SORTS else "host"
        self.text = ""
        self._theme_name = theme or DEFAULT_THEME
        self.scrape: float | None = None
        """Prometheus' scrape interval (s), None until it has said."""
        self._asked = 0.0  # monotonic time the scrape interval was last asked
        self._next: Timer | None = None  # the next refresh, while none is in flight
        self._asking = False
        self._again = False  # `r` while a refresh was in flight: another at once after it
        self._rows: list[tuple[str, Row]] = []
        self._error_shown = ""
        self._ranks_shown: list[str] = []
        self.refreshes = 0
        self.latencies: deque[tuple[float, float]] = deque(maxlen=4096)
        """Seconds of each refresh: its queries, and folding them in and redrawing."""

    def compose(self) -> ComposeResult:
        self.summary = Fitted(id="summary", max_lines=2)
        self.error_line = Static("", id="error", markup=False)
        self.error_line.display = False
        self.filter_input = Input(placeholder="filter: host, gpu, rank, phase, state", id="filter")
        self.filter_input.display = False
        self.grid_head = Line("", markup=False, id="grid-head")
        self.grid = Grid(id="grid")
        self.ranks_view = Static("", id="ranks", markup=False)
        yield self.summary
        yield self.error_line
        with TabbedContent(initial="gpus"):
            with TabPane("GPUs", id="gpus"):
                yield self.filter_input
                yield self.grid_head
                yield self.grid
            with TabPane("Ranks", id="ranks-tab"), VerticalScroll(id="ranks-scroll"):
                yield self.ranks_view
        self.key_bar = KeyBar()
        yield self.key_bar

    def on_mount(self) -> None:
        for theme in builtin_themes():
            self.register_theme(theme)
        self.theme = self._theme_name
        self.query_one(Tabs).can_focus = False
        self.key_bar.set_keys(
            [
                Key("enter", "Host", "open_host"),
                Key("s", "Sort", "sort"),
                Key("/", "Filter", "filter"),
                Key("1/2", "GPUs/Ranks", "show_tab('gpus')"),
                Key("r", "Refresh", "refresh_now"),
                Key("?", "Help", "help"),
                Key("q", "Quit", "quit"),
            ]
        )
        self.summary.set([Content(f"asking {printable(self.client.base)} …")])
        self.grid.focus()
        self.refresh_cluster()
        self.set_interval(1.0, self._age)

    # ------------------------------------------------------------------ refreshes

    @property
    def interval(self) -> float:
        """Seconds between two refreshes."""
        return refresh_interval(self.scrape)

    def refresh_cluster(self) -> None:
        """Ask Prometheus now (after the refresh in flight, if one is)."""
        if self._next is not None:
            self._next.stop()
            self._next = None
        if self._asking:
            self._again = True
            return
        self._asking = True
        self._ask(self.cluster.live())

    @work(thread=True, exclusive=True, group="refresh", exit_on_error=False)
    def _ask(self, live: set[str]) -> tuple[Answers, float]:
        """On a worker thread: one refresh's answers, and when it began (monotonic)."""
        worker = get_current_worker()
        began = time.monotonic()
        if self.scrape is None or began - self._asked > ASK_INTERVAL_EVERY:
            # Best effort: a server that will not say keeps the interval it had. Asked
            # again now and then: a reloaded configuration may change it.
            self._asked = began
            try:
                self.scrape = call(self.client.scrape_interval, lambda: worker.is_cancelled)
            except Cancelled:
                raise
            except Exception:
                pass
        try:
            answers = fetch(
                self.client, self.matchers, cancelled=lambda: worker.is_cancelled, live=live
            )
        except Cancelled:
            raise
        except Exception as exc:  # never a traceback on the screen: one line
            why = f"{type(exc).__name__}: {exc}"
            answers = Answers(time.time(), errors=dict.fromkeys(CORE, why))
        return answers, began

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group != "refresh" or event.state not in (
            WorkerState.SUCCESS,
            WorkerState.ERROR,
        ):
            return
        self._asking = False
        began = time.monotonic()
        if event.state == WorkerState.SUCCESS and event.worker.result is not None:
            answers, began = event.worker.result
            self.apply(answers)
        if self._again:
            self._again = False
            self.refresh_cluster()
        else:
            wait = max(0.0, self.interval - (time.monotonic() - began))
            self._next = self.set_timer(wait, self.refresh_cluster)

    def apply(self, answers: Answers) -> None:
        """Fold a refresh's answers in and redraw."""
        began = time.perf_counter()
        self.cluster.apply(answers)
        self.refreshes += 1
        self.redraw()
        self.latencies.append((answers.seconds, time.perf_counter() - began))

    def on_resize(self, event: events.Resize) -> None:
        self.call_after_refresh(self.redraw)  # the grid's new width drops or restores columns

    def _age(self) -> None:
        """Once a second: stale cells say for how long."""
        if any(g.state != "ok" for g in self.cluster.gpus.values()):
            self.redraw()

    def redraw(self) -> None:
        c = self.cluster
        interval = self.interval
        view = [f"every {interval:g} s", f"sort {self.sort}"]
        if self.text:
            view.append(f"filter {label(self.text, 30)}")
        parts = c.summary_parts(view)
        # Host names are Prometheus' word: plain text, never markup; what does not fit goes.
        self.summary.set([Content(printable(p)) for p in parts])
        error = ""
        if c.error:
            since = ""
            if c.refreshed is not None:
                age = max(0.0, time.time() - c.refreshed)
                since = f" (figures from {fmt_duration(age * 1e9)} ago)"
            error = f"! {c.error}{since}"
        if error != self._error_shown:  # an update lays the screen out again: only on change
            self._error_shown = error
            self.error_line.update(plain(error))
            self.error_line.display = bool(error)
        self._grid()
        self._ranks()

    def _ranks(self) -> None:
        """The ranks table, while its tab shows (laying it out costs what the grid does)."""
        if self.query_one(TabbedContent).active != "ranks-tab":
            return
        lines = ranks_lines(self.cluster) or ["No process reports a rank."]
        if lines != self._ranks_shown:
            self._ranks_shown = lines
            self.ranks_view.update(plain_lines(lines))

    def _grid(self) -> None:
        """The grid's rows: a line per host, then its GPUs, the columns aligned."""
        now = time.time()
        rows: list[tuple[str, list[tuple[str, str]]]] = []
        for host, gpus in self.cluster.cells(self.sort, self.text):
            note = printable(self.cluster.host_note(gpus))
            style = "bold red" if "lost:" in note else "dim"
            rows.append((f"host\x00{host}", [(label(host, 40), "bold"), (note, style)]))
            for g in gpus:
                cols = cell_columns(g, now)
                bar_style = "red" if g.fill > 0.95 else "yellow" if g.fill > 0.85 else "green"
                if g.state != "ok":
                    bar_style = "dim"
                state = {"ok": "", "lost": "bold red", "stale": "yellow"}.get(g.state, "")
                styles = [""] * len(HEAD)
                styles[MEMORY], styles[STATE] = bar_style, state
                cols[0] = "  " + cols[0]
                rows.append((f"gpu\x00{g.key}", list(zip(cols, styles, strict=True))))
        for host, note in self.cluster.lost_lines(self.text):
            rows.append(
                (f"host\x00{host}", [(label(host, 40), "bold"), (printable(note), "bold red")])
            )
        widths = [len(h) for h in HEAD]
        for key, cells in rows:
            if key.startswith("gpu"):
                widths = [max(w, len(c)) for w, (c, _) in zip(widths, cells, strict=True)]
        # The grid's width less its scrollbar and the row's leading space: columns past it
        # are dropped by DROP_ORDER, never cut at the edge.
        room = (self.grid.size.width or self.size.width or 80) - 3
        keep, widths = fit_columns(widths, room)
        head = [HEAD[k].ljust(w)[:w] for k, w in zip(keep, widths, strict=True)]
        self.grid_head.set(" " + "  ".join(head))
        out: list[tuple[str, Row]] = []
        for key, cells in rows:
            if key.startswith("host"):
                (name, style), (note, nstyle) = cells
                runs = [(" " + name, STYLES[style]), ("  ", None), (note, STYLES[nstyle])]
            else:
                runs = [(" ", None)]
                for k, w in zip(keep, widths, strict=True):
                    cell, style = cells[k]
                    runs += [(ellipsis(cell, w).ljust(w), STYLES[style]), ("  ", None)]
                runs.pop()
            out.append((key, runs))
        self.grid.set_rows(out)
        self._rows = out

    def _selected_key(self) -> str | None:
        return self.grid.selected

    # ------------------------------------------------------------------ actions

    def action_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        self.redraw()

    def action_filter(self) -> None:
        self.filter_input.display = True
        self.filter_input.focus()

    def action_clear_filter(self) -> None:
        self.filter_input.value = ""
        self.filter_input.display = False
        self.text = ""
        self.grid.focus()
        self.redraw()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.text = event.value
        self.redraw()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.grid.focus()

    def action_refresh_now(self) -> None:
        self.refresh_cluster()

    def action_show_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = "gpus" if tab == "gpus" else "ranks-tab"
        if tab == "gpus":
            self.grid.focus()  # enter opens the selected row's host
        self._ranks()

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self._ranks()  # a click on the tab

    def action_open_host(self) -> None:
        key = self._selected_key()
        if key is not None:
            self._open_row(key)

    def on_grid_opened(self, event: Grid.Opened) -> None:
        self._open_row(event.key)

    def _open_row(self, key: str) -> None:
        kind, _, rest = key.partition("\x00")
        if kind == "host":
            self.open_host(rest)
        elif kind == "gpu":
            cell = self.cluster.gpus.get(rest)
            if cell is not None:
                self.open_host(cell.host)

    def open_host(self, host: str) -> None:
        """Show ``host``'s panels."""
        self.push_screen(HostScreen(self, host))

    def action_help(self) -> None:
        from .help import HelpScreen

        self.push_screen(
            HelpScreen(
                [
                    ("enter", "the selected host's timelines (escape: back)"),
                    ("s", "sort: memory, headroom, host, rank"),
                    ("/", "filter by text (host, gpu, rank, phase, state); escape clears"),
                    ("1 / 2", "the GPUs grid / the ranks table"),
                    ("r", "refresh now"),
                    ("+ / -", "on a host: a longer / shorter window"),
                    ("q", "quit"),
                ],
                CLUSTER_HELP,
            )
        )

    async def action_quit(self) -> None:
        self.workers.cancel_all()  # a query in flight is left to a thread nobody waits for
        self.exit(0)


class GpuBlock(Vertical):
    """One GPU of the host: a title, the dashboard's chart and its phase band."""

    DEFAULT_CSS = """
    GpuBlock { height: 14; border: round $panel-lighten-2; }
    GpuBlock > TimelineChart { height: 1fr; }
    """

    def __init__(self, screen: HostScreen, gpu: str) -> None:
        super().__init__()
        self.host_screen = screen
        self.gpu = gpu
        self.border_title = f"GPU {markup_safe(gpu)}"  # a title is markup; the label is not
        origin = screen.history.start if screen.history is not None else 0
        self.chart = TimelineChart(self._chart, origin)
        self.band = PhaseBand(self._band)

    def compose(self) -> ComposeResult:
        yield self.chart
        yield self.band

    def _chart(self, t0: int, t1: int, n: int) -> ChartFrame:
        h = self.host_screen.history
        if h is None:
            return ChartFrame([], 1.0)
        series = []
        for role in ("predicted", "nvml", "reserved", "allocated", "peak"):
            lo, hi = h.window(self.gpu, role, t0, t1, n)
            series.append(ChartSeries(role, lo, hi))
        total = h.total(self.gpu)
        if not total:
            seen = [float(x.hi[x.hi == x.hi].max()) for x in series if (x.hi == x.hi).any()]
            total = max(seen) * 1.1 if seen else 1.0
        return ChartFrame(series, float(total))

    def _band(self, t0: int, t1: int, cells: int) -> list[BandRow]:
        h = self.host_screen.history
        if h is None:
            return []
        return [
            BandRow(
                lane.label,
                [BandSpan(r.name, r.t0, r.t1, 0) for r in lane.runs if r.t1 >= t0 and r.t0 <= t1],
                [],
            )
            for lane in h.lanes.get(self.gpu, [])
        ]


class HostScreen(Screen):
    """One host's panels from range queries at the scrape resolution (escape: back)."""

    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("plus,equals_sign", "window(1)", "Longer"),
        Binding("minus", "window(-1)", "Shorter"),
        Binding("q", "back", "Back", show=False),
    ]
    DEFAULT_CSS = """
    #host-title { height: 1; background: $panel; padding: 0 1; }
    """

    def __init__(self, owner: ClusterApp, host: str) -> None:
        super().__init__()
        self.owner = owner
        self.host = host
        self.history: HostHistory | None = None
        self.window_s = DEFAULT_WINDOW
        self.version = 0
        self._blocks: dict[str, GpuBlock] = {}
        self._next: Timer | None = None
        self._asking = False
        self._again = False

    def compose(self) -> ComposeResult:
        self.title_line = Line("", markup=False, id="host-title")
        yield self.title_line
        self.scroll = VerticalScroll()
        yield self.scroll
        keys = KeyBar()
        keys.set_keys([Key("+/-", "Window", "window(1)"), Key("esc", "Back", "back")])
        yield keys

    def on_mount(self) -> None:
        self.title_line.set(f"{label(self.host, 60)} · asking Prometheus …")
        self.reload()

    def reload(self) -> None:
        """Ask for the timelines now (after the queries in flight, if any are)."""
        if self._next is not None:
            self._next.stop()
            self._next = None
        if self._asking:
            self._again = True
            return
        self._asking = True
        self._load(self.window_s)

    @work(thread=True, exclusive=True, group="host", exit_on_error=False)
    def _load(self, window_s: float) -> tuple[HostHistory | None, str | None, float]:
        """On a worker thread (cancelled when the screen goes): the host's timelines, why
        they could not be read, and when the load began (monotonic)."""
        worker = get_current_worker()
        began = time.monotonic()
        owner = self.owner
        try:
            history = load(
                owner.client,
                self.host,
                owner.matchers,
                seconds=window_s,
                step=owner.scrape or owner.interval,
                cancelled=lambda: worker.is_cancelled,
            )
        except Cancelled:
            raise
        except Exception as exc:  # one line, the last good timelines kept
            return None, f"{type(exc).__name__}: {exc}", began
        return history, history.error, began

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group != "host" or event.state not in (
            WorkerState.SUCCESS,
            WorkerState.ERROR,
        ):
            return
        event.stop()  # the app's handler is for its own refreshes
        self._asking = False
        began = time.monotonic()
        if event.state == WorkerState.SUCCESS and event.worker.result is not None:
            history, error, began = event.worker.result
            self._loaded(history, error)
        if self._again:
            self._again = False
            self.reload()
        else:
            wait = max(0.0, self.owner.interval - (time.monotonic() - began))
            self._next = self.set_timer(wait, self.reload)

    def _loaded(self, history: HostHistory | None, error: str | None) -> None:
        if history is not None and (history.lines or history.lanes or self.history is None):
            self.history = history
        h = self.history
        title = f"{label(self.host, 60)} · last {fmt_duration(self.window_s * 1e9)}"
        if h is not None:
            title += f" · step {fmt_duration(h.step)} · {len(h.gpus())} GPUs"
        if error:
            title += f" · ! {first(error)} (timelines kept)"
        self.title_line.set(title)
        if h is None:
            return
        for gpu in h.gpus():
            if gpu not in self._blocks:
                block = self._blocks[gpu] = GpuBlock(self, gpu)
                self.scroll.mount(block)
        self.version += 1
        for gpu, block in self._blocks.items():
            cell = self.owner.cluster.gpus.get(f"{self.host}:{gpu}")
            title = markup_safe(panel_title(gpu, cell))  # a title is markup; labels are not
            if block.border_title != title:
                block.border_title = title
            block.chart.origin = h.start
            block.chart.update_view((h.start, h.end), None, self.version)
            block.band.update_view((h.start, h.end), None, self.version)

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_window(self, direction: int) -> None:
        i = WINDOWS.index(self.window_s) if self.window_s in WINDOWS else 1
        self.window_s = WINDOWS[max(0, min(len(WINDOWS) - 1, i + direction))]
        self.reload()


def first(text: str, limit: int = 120) -> str:
    """One printable line of at most ``limit`` characters."""
    line = printable(text.splitlines()[0] if text else "")
    return line[:limit]
