"""``gpuwatch cluster``: every GPU Prometheus knows, a host's timelines on enter, the ranks.

A thread asks Prometheus (one instant query per metric family, :func:`gpuwatch.cluster.fetch`)
at the scrape interval Prometheus reports, never faster than once a second, and hands the
answers to the app, which folds them into one :class:`~gpuwatch.cluster.Cluster` and
redraws. Nothing here waits on the network: a slow or gone Prometheus costs a stale mark
and one line, never a frozen screen. Every label is Prometheus' word and shown as plain
text (never markup).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.geometry import Region, Size
from textual.message import Message
from textual.screen import Screen
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Input, Static, TabbedContent, TabPane, Tabs

from ..cluster import SORTS, Answers, Cluster, PromClient, fetch
from ..cluster.history import HostHistory, load
from ..cluster.text import HEAD, cell_columns, label, ranks_lines
from ..fmt import fmt_duration, printable
from ._text import Fitted, Line, markup_safe, plain, plain_lines
from .band import BandRow, BandSpan, PhaseBand
from .chart import ChartFrame, TimelineChart
from .chart import Series as ChartSeries
from .keys import Key, KeyBar
from .theme import DEFAULT_THEME, builtin_themes

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


class Poller:
    """Asks Prometheus on its own thread and hands each answer to ``deliver``.

    Args:
        client: Prometheus.
        matchers: Added to every query.
        deliver: Called (on the poller's thread) with each refresh's answers and the
            interval until the next.
    """

    def __init__(
        self,
        client: PromClient,
        matchers: Sequence[tuple[str, str, str]],
        deliver: Callable[[Answers, float], None],
    ) -> None:
        self.client = client
        self.matchers = list(matchers)
        self.deliver = deliver
        self.scrape: float | None = None
        self._asked = 0.0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuwatch-cluster", daemon=True)

    @property
    def interval(self) -> float:
        return refresh_interval(self.scrape)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def now(self) -> None:
        """Refresh at once (``r``)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            if self.scrape is None or began - self._asked > ASK_INTERVAL_EVERY:
                # Best effort: a server that will not say keeps the interval it had. Asked
                # again now and then: a reloaded configuration may change it.
                self._asked = began
                with contextlib.suppress(Exception):
                    self.scrape = self.client.scrape_interval() or self.scrape
            try:
                answers = fetch(self.client, self.matchers)
            except Exception as exc:  # never a traceback on the screen: one line
                answers = Answers(time.time(), errors={"all": f"{type(exc).__name__}: {exc}"})
                answers.errors["gpuwatch_gpu_memory_total_bytes"] = answers.errors["all"]
                answers.errors["gpuwatch_gpu_memory_used_bytes"] = answers.errors["all"]
            if self._stop.is_set():
                return
            self.deliver(answers, self.interval)
            self._wake.wait(max(0.0, self.interval - (time.monotonic() - began)))
            self._wake.clear()


Row = list[tuple[str, "Style | None"]]
"""A grid row: its text in styled runs (plain strings, already printable and padded)."""

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
    #summary { height: 1; background: $panel; color: $text; padding: 0 1; }
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
        self.poller = Poller(client, self.matchers, self._delivered)
        self._rows: list[tuple[str, Row]] = []
        self._error_shown = ""
        self._ranks_shown: list[str] = []
        self.refreshes = 0
        self.latencies: deque[tuple[float, float]] = deque(maxlen=4096)
        """Seconds of each refresh: its queries, and folding them in and redrawing."""

    def compose(self) -> ComposeResult:
        self.summary = Fitted(id="summary")
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
        self.poller.start()
        self.set_interval(1.0, self._age)

    def on_unmount(self) -> None:
        self.poller.stop()

    # ------------------------------------------------------------------ refreshes

    def _delivered(self, answers: Answers, interval: float) -> None:
        """On the poller's thread: hand the answers to the app's thread."""
        with contextlib.suppress(RuntimeError):  # the app is closing
            self.call_from_thread(self.apply, answers)

    def apply(self, answers: Answers) -> None:
        """Fold a refresh's answers in and redraw."""
        began = time.perf_counter()
        self.cluster.apply(answers)
        self.refreshes += 1
        self.redraw()
        self.latencies.append((answers.seconds, time.perf_counter() - began))

    def _age(self) -> None:
        """Once a second: stale cells say for how long."""
        if any(g.state != "ok" for g in self.cluster.gpus.values()):
            self.redraw()

    def redraw(self) -> None:
        c = self.cluster
        interval = self.poller.interval
        parts = [*c.summary_parts(), f"every {interval:g} s", f"sort {self.sort}"]
        if self.text:
            parts.append(f"filter {self.text}")
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
                styles = ["", bar_style, "", "", "", "", state]
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
        self.grid_head.set(" " + "  ".join(h.ljust(w) for h, w in zip(HEAD, widths, strict=True)))
        out: list[tuple[str, Row]] = []
        for key, cells in rows:
            if key.startswith("host"):
                (name, style), (note, nstyle) = cells
                runs = [(" " + name, STYLES[style]), ("  ", None), (note, STYLES[nstyle])]
            else:
                runs = [(" ", None)]
                for (cell, style), w in zip(cells, widths, strict=True):
                    runs += [(cell.ljust(w), STYLES[style]), ("  ", None)]
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
        self.poller.now()

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
        self.poller.stop()
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
        self._stop = threading.Event()
        self._wake = threading.Event()

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
        threading.Thread(target=self._run, name="gpuwatch-host", daemon=True).start()

    def on_unmount(self) -> None:
        self._stop.set()
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            interval = self.owner.poller.interval
            step = self.owner.poller.scrape or interval
            try:
                history = load(
                    self.owner.client,
                    self.host,
                    self.owner.matchers,
                    seconds=self.window_s,
                    step=step,
                )
            except Exception as exc:  # one line, the last good timelines kept
                history = None
                error = f"{type(exc).__name__}: {exc}"
            else:
                error = history.error
            if self._stop.is_set():
                return
            with contextlib.suppress(RuntimeError):
                self.app.call_from_thread(self._loaded, history, error)
            self._wake.wait(max(0.0, interval - (time.monotonic() - began)))
            self._wake.clear()

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
        for block in self._blocks.values():
            block.chart.origin = h.start
            block.chart.update_view((h.start, h.end), None, self.version)
            block.band.update_view((h.start, h.end), None, self.version)

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_window(self, direction: int) -> None:
        i = WINDOWS.index(self.window_s) if self.window_s in WINDOWS else 1
        self.window_s = WINDOWS[max(0, min(len(WINDOWS) - 1, i + direction))]
        self._wake.set()


def first(text: str, limit: int = 120) -> str:
    """One printable line of at most ``limit`` characters."""
    line = printable(text.splitlines()[0] if text else "")
    return line[:limit]
