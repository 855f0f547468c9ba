"""The cluster view's app: the summary, the GPU grid and the ranks tab over Prometheus.

A thread worker asks Prometheus (every metric family in one instant query,
:func:`gpuwatch.cluster.fetch`, a GPU row's own figures only of the targets near the
grid's view, :meth:`ClusterApp.near`; under a host's panels only that host's figures) at the
scrape interval Prometheus reports, never faster than once a second
(:class:`.cadence.Cadence`); the app folds its answers into one
:class:`~gpuwatch.cluster.Cluster` when the worker ends and redraws. Nothing here waits
on the network: a slow or gone Prometheus costs a stale mark and one line, never a frozen
screen, and quitting cancels the worker, which leaves the query in flight to a thread
nobody waits for (:mod:`gpuwatch.cluster.background`). Every label is Prometheus' word
and shown as plain text (never markup).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from textual import events, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingsMap, Keymap
from textual.containers import VerticalScroll
from textual.content import Content
from textual.reactive import reactive
from textual.widgets import Input, Static, TabbedContent, TabPane, Tabs
from textual.worker import Worker, get_current_worker

from ...cluster import SLOW_EVERY, SORTS, Answers, Cluster, PromClient, fetch
from ...cluster.background import Cancelled, call
from ...cluster.text import label, ranks_lines
from ...fmt import fmt_duration, printable
from .._text import Fitted, Line, plain, plain_lines
from ..keymap import CLUSTER_IDS
from ..keys import Key, KeyBar, bar_keys, bindings_keys, help_rows, key_display, node_keys
from ..theme import DEFAULT_THEME, builtin_themes
from .cadence import Cadence
from .grid import Grid, GridRows, Row
from .host import HostScreen

CORE = ("gpuwatch_gpu_memory_total_bytes", "gpuwatch_gpu_memory_used_bytes")
"""A refresh that could read neither of these read nothing (the view marks every GPU stale)."""
MIN_INTERVAL = 1.0
"""Fastest refresh, whatever Prometheus' scrape interval (the issue: no faster than 1 s)."""
UNKNOWN_INTERVAL = 5.0
"""Refresh interval while Prometheus has not said its scrape interval (asked again then)."""
ASK_INTERVAL_EVERY = 60.0
"""Seconds between two readings of Prometheus' scrape interval."""

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


BAR = (
    ("sort", "Sort"),
    ("filter", "Filter"),
    ("show_tab('gpus')", "GPUs"),
    ("show_tab('ranks')", "Ranks"),
    ("refresh_now", "Refresh"),
    ("help", "Help"),
    ("quit", "Quit"),
)
"""The key bar's actions after ``Host`` (open), each on the key bound to it now."""
HELP_ORDER = (
    "open",
    "sort",
    "filter",
    "clear_filter",
    "show_tab('gpus')",
    "show_tab('ranks')",
    "refresh_now",
    "window(1)",
    "window(-1)",
    "back",
    "quit",
)
"""The help's actions, in its order (their words: each binding's tooltip)."""


class ClusterApp(App[int]):
    """The cluster view.

    Args:
        client: Prometheus.
        matchers: ``--job`` and ``--match`` as label matchers.
        sort: The grid's first order (one of :data:`~gpuwatch.cluster.SORTS`).
        theme: A gpuwatch theme name.
        keymap: Binding ids to keys (:data:`~gpuwatch.tui.keymap.CLUSTER_IDS`), over the
            defaults.
    """

    TITLE = "gpuwatch cluster"
    CSS_PATH = Path(__file__).with_name("app.tcss")
    BINDINGS = [
        Binding(key, action, title, show=show, id=CLUSTER_IDS[action], tooltip=help)
        for key, action, title, help, show in (
            ("q", "quit", "Quit", "quit", True),
            ("s", "sort", "Sort", "sort: memory, headroom, host, rank", True),
            ("slash", "filter", "Filter", "filter by text (host, gpu, rank, phase, state)", True),
            ("escape", "clear_filter", "Clear filter", "clear the filter", False),
            ("r", "refresh_now", "Refresh", "refresh now", True),
            ("question_mark", "help", "Help", "this help", True),
            ("1", "show_tab('gpus')", "GPUs", "the GPUs grid", False),
            ("2", "show_tab('ranks')", "Ranks", "the ranks table", False),
        )
    ]

    sort: reactive[str] = reactive("host", init=False)
    """The grid's order (one of :data:`~gpuwatch.cluster.SORTS`)."""
    text: reactive[str] = reactive("", init=False)
    """The filter: rows whose text holds it show."""

    def __init__(
        self,
        client: PromClient,
        matchers: Sequence[tuple[str, str, str]] = (),
        *,
        sort: str = "host",
        theme: str | None = None,
        keymap: Keymap | None = None,
    ) -> None:
        super().__init__()
        if keymap:
            self.set_keymap(keymap)
        self.client = client
        self.matchers = list(matchers)
        self.cluster = Cluster()
        self.set_reactive(ClusterApp.sort, sort if sort in SORTS else "host")
        self._theme_name = theme or DEFAULT_THEME
        self.scrape: float | None = None
        """Prometheus' scrape interval (s), None until it has said."""
        self._asked = 0.0  # monotonic time the scrape interval was last asked
        self._cadence = Cadence(self, self._start, lambda: self.interval, "refresh")
        self._rows: list[tuple[str, Row]] = []
        self._near: frozenset[str] | None = None
        """The targets whose row figures the newest whole refresh asked (None: every
        target's: fetch may ask them all whatever it was given)."""
        self._layout = GridRows()
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
        keys = self._keys()
        host = [Key(keys["open"][0], "Host", "open_host")] if keys.get("open") else []
        self.key_bar.set_keys(host + bar_keys(keys, BAR))
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
        self._cadence.now()

    def _start(self) -> None:
        # Under a host's panels the grid, the summary and the ranks are hidden: only the
        # host's figures (its panels' titles) are asked; going back asks everything at once.
        stack = self.screen_stack
        if not stack:  # the view is closing (its screens gone) as a timer fires: ask nothing
            return
        host = stack[-1].host if isinstance(stack[-1], HostScreen) else None
        slow = self.refreshes % SLOW_EVERY == 0 or self.cluster.wants_slow()
        self._ask(self.cluster.live(), slow, host, self.near())

    def near(self) -> frozenset[str] | None:
        """The targets of the GPUs in the grid's rows in view and half a screen either
        side, whose row figures (utilisation, temperature, power, other processes) a
        refresh asks (:func:`~gpuwatch.cluster.fetch` asks every target's where they are too
        many); None: every target's (the grid not laid out yet, or every target near it)."""
        shown = self.grid.shown()
        if shown is None or not self._rows:
            return None
        gpus = self.cluster.gpus
        near = set()
        for key, _ in self._rows[shown.start : shown.stop]:
            kind, _, rest = key.partition("\x00")
            if kind == "gpu" and (cell := gpus.get(rest)) is not None:
                near.add(cell.instance)
        if near >= {g.instance for g in gpus.values()}:  # one query, as for a small cluster
            return None
        return frozenset(near)

    @work(thread=True, exclusive=True, group="refresh", exit_on_error=False)
    def _ask(
        self,
        live: set[str],
        slow: bool = True,
        host: str | None = None,
        near: frozenset[str] | None = None,
    ) -> tuple[Answers, float]:
        """On a worker thread: one refresh's answers (the :data:`~gpuwatch.cluster.SLOW`
        families too when ``slow``; only ``host``'s figures when given; the row figures of
        the ``near`` targets only), and when it began (monotonic)."""
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
                self.client,
                self.matchers,
                cancelled=lambda: worker.is_cancelled,
                live=live,
                slow=slow,
                host=host,
                near=near,
            )
        except Cancelled:
            raise
        except Exception as exc:  # never a traceback on the screen: one line
            why = f"{type(exc).__name__}: {exc}"
            answers = Answers(time.time(), errors=dict.fromkeys(CORE, why), host=host)
        return answers, began

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if not self._cadence.ended(event):
            return
        began = time.monotonic()
        result = event.worker.result
        if result is not None:
            answers, began = result
            self.apply(answers)
        self._cadence.done(began)

    def apply(self, answers: Answers) -> None:
        """Fold a refresh's answers in and redraw."""
        began = time.perf_counter()
        self.cluster.apply(answers)
        if answers.host is None:
            self._near = answers.near
        self.refreshes += 1
        self.redraw()
        self.latencies.append((answers.seconds, time.perf_counter() - began))

    def on_resize(self, event: events.Resize) -> None:
        self.call_after_refresh(self.redraw)  # the grid's new width drops or restores columns

    def _age(self) -> None:
        """Once a second: stale cells say for how long."""
        if any(g.state != "ok" for g in self.cluster.gpus.values()):
            self.redraw()

    def watch_sort(self) -> None:
        self.redraw()
        self._ask_near()

    def watch_text(self) -> None:
        self.redraw()
        self._ask_near()

    def redraw(self) -> None:
        """The summary, the error line, the grid and the ranks from the cluster as it is;
        skipped while a host's panels cover them (:meth:`HostScreen.action_back` redraws
        on the way back): at 64 hosts laying the grid out is a tenth of a refresh's CPU."""
        if isinstance(self.screen, HostScreen):
            return
        c = self.cluster
        view = [f"every {self.interval:g} s", f"sort {self.sort}"]
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
        # The grid's width less its scrollbar and the row's leading space: columns past it
        # are dropped by DROP_ORDER, never cut at the edge.
        room = (self.grid.size.width or self.size.width or 80) - 3
        layout = self._layout.layout(
            self.cluster, self.sort, self.text, room, time.time(), self.grid.shown()
        )
        self.grid_head.set(layout.head)
        self.grid.set_rows(layout.rows)
        self._rows = layout.rows

    def _selected_key(self) -> str | None:
        return self.grid.selected

    # ------------------------------------------------------------------ actions

    def action_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]

    def action_filter(self) -> None:
        self.filter_input.display = True
        self.filter_input.focus()

    def action_clear_filter(self) -> None:
        self.filter_input.value = ""
        self.filter_input.display = False
        self.text = ""
        self.grid.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.text = event.value

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

    def on_grid_scrolled(self, event: Grid.Scrolled) -> None:
        if not isinstance(self.screen, HostScreen):
            self._grid()  # the rows now in view, with their figures as they are
            self._ask_near()

    def _ask_near(self) -> None:
        """Refresh now if rows whose row figures the last refresh did not ask came into
        view (a scroll, another order or filter): they show ``-`` until it answers."""
        near, asked = self.near(), self._near
        if asked is not None and (near is None or not near <= asked):
            self.refresh_cluster()

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

    def get_key_display(self, binding: Binding) -> str:
        return key_display(binding) or super().get_key_display(binding)

    def action_help(self) -> None:
        from ..help import HelpScreen

        bindings = [*self.BINDINGS, *Grid.BINDINGS, *HostScreen.BINDINGS]
        tips = {b.action: b.tooltip for b in bindings if isinstance(b, Binding)}
        rows = help_rows(self._keys(), [(a, tips[a]) for a in HELP_ORDER])
        self.push_screen(HelpScreen(rows, CLUSTER_HELP))

    def _keys(self) -> dict[str, list[str]]:
        """The keys of the grid (open), the app's own, and a host's screen, as bound now
        (the keymap applied)."""
        keys = {**bindings_keys(self, BindingsMap(HostScreen.BINDINGS)), **node_keys(self.grid)}
        return {**keys, **node_keys(self)}

    async def action_quit(self) -> None:
        self.workers.cancel_all()  # a query in flight is left to a thread nobody waits for
        self.exit(0)
