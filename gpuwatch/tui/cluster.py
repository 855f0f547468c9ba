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
from collections.abc import Callable, Sequence

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Input, Static, TabbedContent, TabPane, Tabs

from ..analysis.ranks import format_ranks
from ..cluster import SORTS, Answers, Cluster, PromClient, fetch
from ..cluster.history import HostHistory, load
from ..cluster.text import HEAD, cell_columns, label
from ..fmt import fmt_duration, printable
from ._text import Line, plain, plain_lines
from .band import BandRow, BandSpan, PhaseBand
from .chart import ChartFrame, TimelineChart
from .chart import Series as ChartSeries
from .keys import Key, KeyBar
from .theme import DEFAULT_THEME, builtin_themes

MIN_INTERVAL = 1.0
"""Fastest refresh, whatever Prometheus' scrape interval (the issue: no faster than 1 s)."""
UNKNOWN_INTERVAL = 5.0
"""Refresh interval while Prometheus has not said its scrape interval (asked again then)."""
WINDOWS = (60, 300, 900, 3600, 6 * 3600)
"""The drill-down's time windows in seconds (``+``/``-`` step through them)."""
DEFAULT_WINDOW = 300
COLUMN_KEYS = ("gpu", "bar", "used", "rank", "phase", "peak", "state")

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
        deliver: Called (on the poller's thread) with each refresh's answers.
        sleep: Stands in for waiting between refreshes (tests).
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
            if self.scrape is None:
                # Best effort: a server that will not say keeps the default interval.
                with contextlib.suppress(Exception):
                    self.scrape = self.client.scrape_interval()
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


class Grid(DataTable):
    """The GPU rows: ``home``/``end`` go to the first/last row (the columns always fit)."""

    BINDINGS = [
        Binding("home", "scroll_top", "First row", show=False),
        Binding("end", "scroll_bottom", "Last row", show=False),
    ]


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
        self._rows: list[tuple[str, list[object]]] = []
        self.refreshes = 0
        self.last_fetch_s = 0.0
        self.last_draw_s = 0.0

    def compose(self) -> ComposeResult:
        self.summary = Line("", markup=False, id="summary")
        self.error_line = Static("", id="error", markup=False)
        self.error_line.display = False
        self.filter_input = Input(placeholder="filter: host, gpu, rank, phase, state", id="filter")
        self.filter_input.display = False
        self.grid = Grid(id="grid", cursor_type="row", zebra_stripes=False)
        self.ranks_view = Static("", id="ranks", markup=False)
        yield self.summary
        yield self.error_line
        with TabbedContent(initial="gpus"):
            with TabPane("GPUs", id="gpus"):
                yield self.filter_input
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
        for name, key in zip(HEAD, COLUMN_KEYS, strict=True):
            self.grid.add_column(name, key=key)
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
        self.summary.set(f"asking {printable(self.client.base)} …")
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
        self.last_fetch_s = answers.seconds
        self.redraw()
        self.last_draw_s = time.perf_counter() - began

    def _age(self) -> None:
        """Once a second: stale cells say for how long."""
        if any(g.state != "ok" for g in self.cluster.gpus.values()):
            self.redraw()

    def redraw(self) -> None:
        c = self.cluster
        interval = self.poller.interval
        extra = f" · every {interval:g} s" + (f" · sort {self.sort}" if self.sort else "")
        if self.text:
            extra += f" · filter {printable(self.text)}"
        self.summary.set(printable(c.summary()) + extra)  # host names are Prometheus' word
        if c.error:
            since = ""
            if c.refreshed is not None:
                age = max(0.0, time.time() - c.refreshed)
                since = f" (figures from {fmt_duration(age * 1e9)} ago)"
            self.error_line.update(plain(f"! {c.error}{since}"))
        self.error_line.display = bool(c.error)
        self._grid()
        self.ranks_view.update(plain_lines(format_ranks(c.ranks) or ["No process reports a rank."]))

    def _grid(self) -> None:
        now = time.time()
        rows: list[tuple[str, list[object]]] = []
        for host, gpus in self.cluster.cells(self.sort, self.text):
            odd = sum(g.state != "ok" for g in gpus)
            head = Text(label(host, 40), style="bold")
            note = f"{len(gpus)} GPUs" + (f", {odd} not ok" if odd else "")
            rows.append((f"host\x00{host}", [head, "", Text(note, style="dim"), "", "", "", ""]))
            for g in gpus:
                cols = cell_columns(g, now)
                style = {"ok": "", "lost": "bold red", "stale": "yellow"}.get(g.state, "")
                bar_style = "red" if g.fill > 0.95 else "yellow" if g.fill > 0.85 else "green"
                if g.state != "ok":
                    bar_style = "dim"
                cells: list[object] = [
                    plain("  " + cols[0]),
                    Text(cols[1], style=bar_style),
                    plain(cols[2]),
                    plain(cols[3]),
                    plain(cols[4]),
                    plain(cols[5]),
                    Text(cols[6], style=style),
                ]
                rows.append((f"gpu\x00{g.key}", cells))
        keys = [k for k, _ in rows]
        if keys == [k for k, _ in self._rows]:
            columns = [c.key for c in self.grid.ordered_columns]
            for (key, new), (_, old) in zip(rows, self._rows, strict=True):
                for col, a, b in zip(columns, new, old, strict=True):
                    if str(a) != str(b) or getattr(a, "style", None) != getattr(b, "style", None):
                        self.grid.update_cell(key, col, a, update_width=True)
        else:
            selected = self._selected_key()
            self.grid.clear()
            for key, cells in rows:
                self.grid.add_row(*cells, key=key)
            if selected in keys:
                self.grid.move_cursor(row=keys.index(selected))
        self._rows = rows

    def _selected_key(self) -> str | None:
        if not self._rows or self.grid.row_count == 0:
            return None
        row = self.grid.cursor_row
        return self._rows[row][0] if 0 <= row < len(self._rows) else None

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

    def action_open_host(self) -> None:
        key = self._selected_key()
        if key is not None:
            self._open_row(key)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self._open_row(str(event.row_key.value))

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
        self.border_title = f"GPU {printable(gpu)}"
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
