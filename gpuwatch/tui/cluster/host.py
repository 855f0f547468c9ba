"""A host's drill-down: a panel per GPU with its timelines and phase band (escape: back).

The timelines come from Prometheus' range queries at the scrape resolution, kept across
refreshes by :class:`~gpuwatch.cluster.history.Timelines`: each refresh asks only the
range that is new since the last one, never the whole window again.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.reactive import reactive
from textual.screen import Screen
from textual.worker import Worker, get_current_worker

from ...cluster import Cluster, PromClient
from ...cluster.background import Cancelled
from ...cluster.history import HostHistory, Timelines
from ...cluster.text import label, panel_title
from ...fmt import fmt_duration, printable
from .._text import Line, markup_safe
from ..band import BandRow, BandSpan, PhaseBand
from ..chart import ChartFrame, TimelineChart
from ..chart import Series as ChartSeries
from ..keymap import CLUSTER_IDS
from ..keys import KeyBar, bar_keys, bound_keys
from .cadence import Cadence

WINDOWS = (60, 300, 900, 3600, 6 * 3600)
"""The drill-down's time windows in seconds (``+``/``-`` step through them)."""
DEFAULT_WINDOW = 300


class Source(Protocol):
    """What the drill-down reads of the cluster view: Prometheus and the grid's cells."""

    client: PromClient
    matchers: list[tuple[str, str, str]]
    cluster: Cluster

    @property
    def scrape(self) -> float | None: ...

    @property
    def interval(self) -> float: ...

    def redraw(self) -> None:
        """Draw the grid again (it is not drawn while the panels cover it)."""

    def refresh_cluster(self) -> None:
        """Ask for the whole cluster now (only the host's figures are asked under its
        panels)."""


class GpuBlock(Vertical):
    """One GPU of the host: a title, the dashboard's chart and its phase band."""

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


class HostScreen(Screen[None]):
    """One host's panels from range queries at the scrape resolution (escape: back).

    Attributes:
        history: The newest timelines (None until the first answer).
        version: How many times the panels were given new timelines.
    """

    CSS_PATH = Path(__file__).with_name("host.tcss")
    BINDINGS = [
        Binding("escape,q", "back", "Back", id=CLUSTER_IDS["back"], tooltip="on a host: back"),
        Binding(
            "plus,equals_sign",
            "window(1)",
            "Longer",
            id=CLUSTER_IDS["window(1)"],
            tooltip="on a host: a longer window",
        ),
        Binding(
            "minus",
            "window(-1)",
            "Shorter",
            id=CLUSTER_IDS["window(-1)"],
            tooltip="on a host: a shorter window",
        ),
    ]

    window_s: reactive[int] = reactive(DEFAULT_WINDOW, init=False)
    """Seconds of history shown (one of :data:`WINDOWS`)."""

    def __init__(self, owner: Source, host: str) -> None:
        super().__init__()
        self.owner = owner
        self.host = host
        self.history: HostHistory | None = None
        self.version = 0
        self._blocks: dict[str, GpuBlock] = {}
        self._timelines = Timelines(host, owner.matchers)
        self._cadence = Cadence(self, self._start, lambda: self.owner.interval, "host")

    def compose(self) -> ComposeResult:
        self.title_line = Line("", markup=False, id="host-title")
        yield self.title_line
        self.scroll = VerticalScroll()
        yield self.scroll
        yield KeyBar()

    def on_screen_resume(self) -> None:
        # Once the screen is active its bindings are (the keymap applied).
        keys = bound_keys(self)
        shown = [("window(1)", "Longer"), ("window(-1)", "Shorter"), ("back", "Back")]
        self.query_one(KeyBar).set_keys(bar_keys(keys, shown))

    def on_mount(self) -> None:
        self.title_line.set(f"{label(self.host, 60)} · asking Prometheus …")
        self.reload()

    def reload(self) -> None:
        """Ask for the timelines now (after the queries in flight, if any are)."""
        self._cadence.now()

    def _start(self) -> None:
        self._load(self.window_s)

    @work(thread=True, exclusive=True, group="host", exit_on_error=False)
    def _load(self, window_s: float) -> tuple[HostHistory | None, str | None, float]:
        """On a worker thread (cancelled when the screen goes): the host's timelines, why
        they could not be read, and when the load began (monotonic)."""
        worker = get_current_worker()
        began = time.monotonic()
        owner = self.owner
        try:
            history = self._timelines.update(
                owner.client,
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
        if not self._cadence.ended(event):
            return
        event.stop()  # the app's handler is for its own refreshes
        began = time.monotonic()
        result = event.worker.result
        if result is not None:
            history, error, began = result
            self._loaded(history, error)
        self._cadence.done(began)

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

    def watch_window_s(self) -> None:
        self.reload()

    def action_back(self) -> None:
        self.app.pop_screen()
        self.owner.redraw()  # the grid as the refreshes under the panels left the cluster
        self.owner.refresh_cluster()  # and every host asked again at once

    def action_window(self, direction: int) -> None:
        i = WINDOWS.index(self.window_s) if self.window_s in WINDOWS else 1
        self.window_s = WINDOWS[max(0, min(len(WINDOWS) - 1, i + direction))]


def first(text: str, limit: int = 120) -> str:
    """One printable line of at most ``limit`` characters."""
    line = printable(text.splitlines()[0] if text else "")
    return line[:limit]
