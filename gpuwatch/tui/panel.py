"""One device's panel: header, timeline chart, phase band and a legend at the cursor."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.reactive import var

from ..analysis.breakdown import SAME, Breakdown
from ..analysis.forecast import level_ahead
from ..analysis.moment import Moment, moment
from ..analysis.predicted import PredictedLine
from ..fmt import fmt_bytes, fmt_clock, fmt_duration, printable
from ..session import MISSING_INT, Session, is_host
from ._text import Fitted, Line, markup_safe
from .band import BandMarker, BandRow, PhaseBand, fold_rows, label_width, process_spans
from .breakdown import BreakdownBar
from .chart import MONO_MARK, ChartFrame, Series, TimelineChart
from .thresholds import level_style, marked
from .thresholds import of as thresholds_of

LINE_LABELS = {
    "gpu": {
        "nvml": "nvidia-smi",
        "reserved": "reserved",
        "allocated": "allocated",
        "predicted": "predicted",
        "peak": "peak in phase",
        "forecast": "to come",
    },
    "host": {"nvml": "RAM used", "allocated": "RSS"},
}


@dataclass(frozen=True, slots=True)
class PanelRead:
    """What one frame of a panel draws, read under the session's lock in one go.

    Text, rows and lines made for this frame: none of the session's own containers.

    Attributes:
        title: The border title.
        header: The device's figures at the moment.
        legend: The lines' figures, the phase and the time.
        breakdown: The bar's split (a GPU with an instrumented process), or None.
        explained: The bar shows (an instrumented process has a row on the band).
        band: The band's rows fetched for :attr:`band_cells`, or None where they stand.
        band_cells: The plot cells the rows were fetched for.
        axis_width: The label column of the band and the chart.
        chart: The chart's frame for :attr:`dots` columns, or None where it holds one.
        dots: The chart's dot columns (0 before layout).
    """

    title: str
    header: Content
    legend: tuple[Content, ...]
    breakdown: Breakdown | None
    explained: bool
    band: tuple[BandRow, ...] | None
    band_cells: int
    axis_width: int
    chart: ChartFrame | None
    dots: int


class DevicePanel(Vertical):
    """Everything about one device (a GPU or the host).

    Args:
        session: The session to draw from.
        key: The device's key in the session.
    """

    DEFAULT_CSS = """
    DevicePanel {
        height: 1fr;
        min-height: 12;
        border: round $panel-lighten-2;
        border-title-color: $text;
        padding: 0 1 0 0;
    }
    DevicePanel:focus, DevicePanel:focus-within {
        border: round $primary;
    }
    DevicePanel.-secondary {
        height: 12;
    }
    DevicePanel > .panel-header {
        height: 1;
        color: $text-muted;
    }
    """

    MAX_BAND_ROWS = {"regular": 6, "short": 3}
    """Process rows in the band before the rest fold into ``+N more``."""

    can_focus = True

    fit: var[bool] = var(False)
    """The y axis fits the data (True) or reaches the device's total (False)."""

    def __init__(
        self, session: Session, key: str, predicted: Mapping[int, PredictedLine] | None = None
    ) -> None:
        super().__init__(id="panel-" + _css_id(key))
        self.session = session
        self.key = key
        # Predicted lines by pid, shared with the app (which keeps them up to date).
        self.predicted = predicted if predicted is not None else {}
        self.is_host = is_host(key)
        self.header = Line("", classes="panel-header", markup=False)
        self.chart = TimelineChart(self._fetch_chart, session.t_origin)
        self.band = PhaseBand(self._fetch_band)
        self.bar = BreakdownBar() if not self.is_host else None
        self.legend = Fitted(sep="  ", max_lines=2, classes="panel-legend")
        self.set_reactive(DevicePanel.fit, self.is_host)  # the host's total dwarfs an RSS
        self.place = ""  # "1/2 · tab ▸" when panels are stepped through (a short screen)
        self.short = False  # the app's short layout: fewer band rows
        self._title_shown: str | None = None  # the border title last set
        self._header_shown: object = None  # the header line last set (text, styles)

    def watch_fit(self) -> None:
        self.chart.forget_frame()  # the y scale is not part of the chart's cache key

    @property
    def device(self):
        return self.session.devices[self.key]

    def compose(self) -> ComposeResult:
        yield self.header
        yield self.chart
        yield self.band
        if self.bar is not None:
            yield self.bar
        yield self.legend

    def update_view(
        self, window: tuple[int, int], cursor: int | None, version: int, at: int | None = None
    ) -> None:
        """Show ``window``; figures at ``at`` (the cursor, else the newest or play position).

        What the frame draws is read in one :meth:`~gpuwatch.session.Session.read`
        (:class:`PanelRead`), then drawn from without the session.

        Args:
            window: ``(t0, t1)`` on the session's axis.
            cursor: The cursor (drawn on the chart and the band), or None.
            version: The session's data version (what the caches key on).
            at: The time the header, legend and breakdown describe; default the cursor,
                else the window's end (at most the newest time).
        """
        self.band.set_max_rows(self.MAX_BAND_ROWS["short" if self.short else "regular"])
        read = self.session.read(lambda: self._read(window, cursor, version, at))
        self._show(read, window, cursor, version)

    def _read(
        self, window: tuple[int, int], cursor: int | None, version: int, at: int | None
    ) -> PanelRead:
        """Everything one frame of the panel draws (under the session's lock)."""
        if at is None:
            at = cursor if cursor is not None else min(window[1], self.session.now())
        cells = self.band.wants(window, cursor, version)
        rows = None if cells is None else tuple(self._band_rows(*window, cells))
        shown = self.band.rows if rows is None else fold_rows(list(rows), self.band.max_rows)
        # The band's longest label sets the label column, and the chart's y axis matches
        # it, so the time axes of both stay aligned.
        width = label_width(shown)
        dots = self.chart.dot_columns(width)
        chart = None
        if dots and not self.chart.holds(window, version, dots):
            chart = self._chart_frame(*window, dots)
        # The bar explains an instrumented process's memory: a GPU without one has
        # nothing to split that the header does not say already.
        explained = self.bar is not None and bool(shown)
        now = self._moment(at, explained)
        return PanelRead(
            title=self._title(),
            header=self._header_text(now, window),
            legend=tuple(self._legend(now, chart or self.chart.frame_held())),
            breakdown=now.breakdown,
            explained=explained,
            band=rows,
            band_cells=cells or 0,
            axis_width=width,
            chart=chart,
            dots=dots,
        )

    def _show(
        self, read: PanelRead, window: tuple[int, int], cursor: int | None, version: int
    ) -> None:
        """Draw what :meth:`_read` took (no session here)."""
        if read.band is not None:
            self.band.take(window, cursor, version, read.band_cells, list(read.band))
        self.band.axis_width = read.axis_width
        self.chart.set_axis_width(read.axis_width)
        if read.chart is not None:
            self.chart.give(window, version, read.dots, read.chart)
        self.chart.update_view(window, cursor, version)
        # Setting a border title repaints the whole panel, chart included, even when it is
        # the same: only a new one is set.
        if read.title != self._title_shown:
            self._title_shown = read.title
            self.border_title = read.title
        header = read.header
        # Content's == ignores its styles: a level's new colour is a new header too.
        said = (header.plain, tuple(header.spans))
        if said != self._header_shown:  # an update repaints the line: only a new one
            self._header_shown = said
            self.header.text = header.plain
            self.header.update(header, layout=False)
        self.legend.set(list(read.legend))
        if self.bar is not None:
            if self.bar.display != read.explained:
                self.bar.display = read.explained
            if read.breakdown is not None:
                self.bar.show(read.breakdown)

    # ------------------------------------------------------------------ text

    def _title(self) -> str:
        return markup_safe(self._title_text())

    def _title_text(self) -> str:
        dev = self.device
        where = f"{dev.origin} · " if dev.origin else ""  # merged replay: which recording
        if dev.kind == "host":
            place = f" · {self.place}" if self.place else ""
            return f"{where}host · {dev.name}{place}"
        index = f"GPU {dev.index}" if dev.index is not None else "GPU"
        if dev.mig is not None and dev.index is not None:  # a MIG instance: as the overview
            index = f"GPU {dev.index}.{dev.mig[1]}"
        state = "" if dev.state == "ok" else f" · {dev.state.upper()}"
        place = f" · {self.place}" if self.place else ""
        return f"{where}{index} · {dev.name}{state}{place}"

    def _header_text(self, now: Moment, window: tuple[int, int]) -> Content:
        """The device's figures at the moment (the sample at or before it): memory and
        utilisation in their load level's colour (:mod:`.thresholds`)."""
        parts = self._host_parts(now, window) if self.is_host else self._gpu_parts(now)
        rate = self._rate_at(now.t)
        if rate is not None:
            parts.append((f"{rate:.0f} Hz", None))
        pieces: list[tuple[str, str] | str] = []
        for i, (text, style) in enumerate(parts):
            if i:
                pieces.append(" · ")
            pieces.append((printable(text), style) if style else printable(text))
        return Content.assemble(*pieces)

    def _host_parts(self, now: Moment, window: tuple[int, int]) -> list[tuple[str, str | None]]:
        """CPU busy %, load, RAM and swap, then what the RSS lines are."""
        host = self.session.host_table(self.key)
        # Every instrumented process on this host adds to the RSS line (GPU ones have
        # their band rows on their GPU's panel).
        procs = [p for p in self.session.active(*window) if p.host == self.key]
        count = f"RSS of {len(procs)} instrumented process{'es' if len(procs) != 1 else ''}"
        row = now.row
        if row is None:
            return [
                (f"{'no sample at this time' if len(host) else 'waiting'}", None),
                (count, None),
            ]
        levels = thresholds_of(self.app)
        no_color = self.app.no_color
        cpu = _figure(row, "cpu")
        used, total = _figure(row, "used"), _figure(row, "total")
        mem = levels.memory_level(used, total)
        parts: list[tuple[str, str | None]] = [
            (
                marked(f"CPU {_num(cpu, '%')}", levels.util_level(cpu), no_color),
                level_style(levels.util_level(cpu)),
            ),
        ]
        load = _figure(row, "load1")
        if load is not None:
            parts.append((f"load {load:.2f}", None))
        parts.append(
            (marked(f"RAM {fmt_bytes(used)} / {fmt_bytes(total)}", mem, no_color), level_style(mem))
        )
        swap_used, swap_total = _figure(row, "swap_used"), _figure(row, "swap_total")
        if swap_total:
            parts.append((f"swap {fmt_bytes(swap_used)} / {fmt_bytes(swap_total)}", None))
        elif swap_total == 0:
            parts.append(("no swap", None))
        parts.append((count, None))
        return parts

    def _gpu_parts(self, now: Moment) -> list[tuple[str, str | None]]:
        """State, memory used of the total, utilisation, temperature, power."""
        dev = self.device
        t, row = now.t, now.row
        parts: list[tuple[str, str | None]] = []
        table = self.session.gpu.get(self.key)
        if dev.state != "ok":
            parts.append((dev.note or dev.state, None))
        if row is None:
            if dev.source == "torch":
                parts.append(("torch figures only (NVML cannot see this GPU)", None))
            elif table is not None and len(table):
                parts.append(("no sample yet at this time", None))
            else:
                parts.append(("waiting for the first sample", None))
            return parts
        if dev.state == "lost" and table is not None and t >= (table.span() or (0, 0))[1]:
            parts.append(("last seen", None))
        levels = thresholds_of(self.app)
        no_color = self.app.no_color
        used, total = _figure(row, "used"), _figure(row, "total")
        mem = levels.memory_level(used, total)
        util = _figure(row, "util_gpu")
        busy = levels.util_level(util)
        parts.append(
            (marked(f"{fmt_bytes(used)} / {fmt_bytes(total)}", mem, no_color), level_style(mem))
        )
        parts.append((marked(f"util {_num(util, '%')}", busy, no_color), level_style(busy)))
        parts.append((f"{_num(_figure(row, 'temp'), '°C')}", None))
        power, limit = _figure(row, "power"), _figure(row, "power_limit")
        parts.append((f"{_num(power, ' W')} / {_num(limit, ' W')}", None))
        return parts

    def _rate_at(self, t: int) -> float | None:
        """Samples a second around ``t`` (the achieved NVML rate then), else the sampler's."""
        table = self.session.gpu.get(self.key)
        if table is not None and len(table) > 2:
            times = table.between(t - RATE_SPAN, t, columns=("t",))["t"]
            if len(times) >= 3:
                return (len(times) - 1) * 1e9 / max(1, int(times[-1] - times[0]))
        return self.session.sampler_rate.get(self.key)

    def _legend(self, now: Moment, frame: ChartFrame | None = None) -> list[Content]:
        """The lines' figures at the moment, for the lines ``frame`` draws (default the
        chart's)."""
        labels = LINE_LABELS["host" if self.is_host else "gpu"]
        frame = frame or self.chart.frame_held()
        roles = [s.role for s in frame.series] if frame else []
        values = dict(now.values)
        ahead = [line.hi[0] for line in frame.series if line.role == "forecast"] if frame else []
        if ahead:
            values["forecast"] = max(ahead)
        span, predicted_peak = self.phase_prediction(now)
        if span is not None and span.get("peak_alloc") is not None:
            values["peak"] = span["peak_alloc"]
        if predicted_peak is not None:
            # Set against the phase's exact peak, the prediction for that same peak (the
            # phase's explanation, as `info` gives it), not the line's value at this instant.
            values["predicted"] = predicted_peak
            labels = {**labels, "predicted": "predicted peak"}
        parts = []
        for role, label in labels.items():
            if role not in roles and role not in values:
                continue
            # The theme's variable, resolved when the legend is drawn: figures read
            # before the theme is applied (the first frame) or before a switch of theme
            # still show the lines' colours.
            color = f"$gw-{role}"
            # Without colour the swatch is the letter the chart puts on the line.
            swatch = MONO_MARK.get(role, "━") if self.app.no_color else "━"
            # Content, not markup: nothing to parse on every frame (and a phase name is
            # taken as it is, never as markup).
            text = f" {label} {fmt_bytes(values.get(role))}"
            parts.append(Content.assemble((swatch, color), text))
        if span is not None:
            step = f" step {span['step']}" if span.get("step") is not None else ""
            parts.append(Content.assemble((printable(span["name"]), "bold"), step))
        parts.append(Content(f"@ {fmt_clock(now.t - self.session.t_origin)}"))
        # A note about two figures goes last: where the width runs out, it is cut, never
        # a figure after it.
        note = self._above_nvml(now) if not self.is_host else ""
        if note:
            parts.append(Content(note))
        return parts

    # ------------------------------------------------------------------ data

    def moment_at(self, t: int, with_breakdown: bool = False) -> Moment:
        """The device at ``t``, read once (the bar's breakdown too when asked)."""
        return self.session.read(lambda: self._moment(t, with_breakdown))

    def _moment(self, t: int, with_breakdown: bool) -> Moment:
        return moment(self.session, self.key, t, self.predicted, with_breakdown)

    def values_at(self, t: int) -> dict[str, float | None]:
        """Each line's step-hold value at time ``t``."""
        return self.moment_at(t).values

    def span_at(self, t: int) -> dict | None:
        """The phase running at ``t`` on this device (first process that has one)."""
        return self.moment_at(t).span

    def _above_nvml(self, now: Moment) -> str:
        """A word when torch's reserved is above nvidia-smi's used: the two were read at
        different moments (NVML samples every ~100 ms), never a contradiction."""
        reserved, used = now.values.get("reserved"), now.values.get("nvml")
        if reserved is None or used is None or reserved <= used + SAME:
            return ""
        times = [int(r.torch["t"]) for r in now.readings if r.running and r.torch is not None]
        if now.row is None or not times:
            return "reserved above nvidia-smi"
        lag = max(times) - int(now.row["t"])
        if lag >= 0:
            return f"reserved above nvidia-smi: its sample is {fmt_duration(lag)} older"
        return f"reserved above nvidia-smi: torch's figure is {fmt_duration(-lag)} older"

    def phase_prediction(self, now: Moment) -> tuple[dict | None, float | None]:
        """The phase running at the moment (as :meth:`span_at`) and, when it ended with an
        exact peak, that phase's predicted peak from its explanation (None when nothing
        predicts it; the host's panel draws no predicted line)."""
        reading = now.span_reading
        if reading is None:
            return None, None
        if self.is_host:
            return reading.span, None
        found = now.explained.get(reading.proc.pid)
        return reading.span, float(found.predicted_at_peak) if found is not None else None

    def _fetch_chart(self, t0: int, t1: int, n: int) -> ChartFrame:
        """The chart's frame for a draw between frames (a resize), in a read of its own."""
        return self.session.read(lambda: self._chart_frame(t0, t1, n))

    def _chart_frame(self, t0: int, t1: int, n: int) -> ChartFrame:
        s = self.session
        series: list[Series] = []
        peak_seen = 0.0
        if self.is_host:
            lo, hi = s.host_window("used", t0, t1, n, self.key)
            series.append(Series("nvml", lo, hi))
            procs = s.processes_of_host(self.key)
            for proc in procs:
                # A line only shows between its first and last sample: one whose samples
                # all lie outside the window is not read (a settled process's stays in
                # its file).
                span = proc.rss.span()
                if span is None or span[1] < t0 or span[0] > t1:
                    continue
                lo, hi = proc.rss.minmax("rss", t0, t1, n)
                series.append(Series("allocated", lo, hi))
            if procs and not any(line.role == "allocated" for line in series):
                empty = np.full(n, np.nan)  # the line the legend names, with no sample here
                series.append(Series("allocated", empty, empty))
            total = self.device.total
        else:
            # Drawing order: where lines share a cell, the later one's colour shows.
            procs = s.processes_on(self.key)
            for proc in procs:
                predicted = self.predicted.get(proc.pid)
                if predicted is not None:
                    lo, hi = predicted.window(t0, t1, n)
                    series.append(Series("predicted", lo, hi))
                ahead = level_ahead(s, proc.pid)  # the highest peak of a phase still to come
                if ahead is not None:
                    series.append(Series("forecast", np.full(n, ahead), np.full(n, ahead)))
            if self.key in s.gpu and len(s.gpu[self.key]):
                lo, hi = s.gpu_window(self.key, "used", t0, t1, n)
                series.append(Series("nvml", lo, hi))
            for proc in procs:
                for role in ("reserved", "allocated"):
                    lo, hi = proc.torch_window(self.key, role, t0, t1, n)
                    series.append(Series(role, lo, hi))
            # The exact peaks last: on a short chart (80x24) they share their cells with
            # the predicted and reserved lines, and drawn under them they never showed.
            for proc in procs:
                peak = proc.peak_window(self.key, "peak_allocated", t0, t1, n)
                series.append(Series("peak", peak, peak))
            total = self.device.total
        for line in series:
            if np.isfinite(line.hi).any():
                peak_seen = max(peak_seen, float(np.nanmax(line.hi)))
        if self.fit or not total:
            ymax = _nice_ceiling(peak_seen * 1.1) if peak_seen > 0 else float(total or 1)
        else:
            ymax = float(total)
        return ChartFrame(series, ymax)

    def _fetch_band(self, t0: int, t1: int, cells: int) -> list[BandRow]:
        """The band's rows for a fetch between frames (a resize), in a read of its own."""
        return self.session.read(lambda: self._band_rows(t0, t1, cells))

    def _band_rows(self, t0: int, t1: int, cells: int) -> list[BandRow]:
        s = self.session
        rows = []
        now = s.now()
        marks, ooms = s.events_between(t0, t1)
        # Each process's markers, in the order of the events (one pass over them, not one
        # a process: a sweep has thousands of both).
        markers: dict[int, list[BandMarker]] = {}
        for m in marks:
            markers.setdefault(m.pid, []).append(BandMarker(m.t, m.level))
        for o in ooms:
            markers.setdefault(o.pid, []).append(BandMarker(o.t, "oom"))
        procs = self._band_processes(t0, t1)
        # Past the band's rows the rest fold into one that shows none of their phases:
        # their spans are not read (a sweep of thousands would read a chunk each).
        limit = max(1, self.band.max_rows)
        shown = len(procs) if len(procs) <= limit else limit - 1
        names = s.names
        for i, proc in enumerate(procs):
            mine = markers.get(proc.pid, [])
            if i >= shown:
                rows.append(BandRow(proc.short_label, [], mine))
                continue
            spans = process_spans(proc, names, t0, t1, cells, now)
            rows.append(BandRow(proc.short_label, spans, mine))  # the title names the host
        return rows

    def _band_processes(self, t0: int, t1: int) -> list:
        """Processes with a row on this panel's band: those on it alive in the window."""
        s = self.session
        alive = {p.pid for p in s.active(t0, t1)}
        if self.is_host:  # GPU processes have their rows on their GPU's panel
            procs = [p for p in s.processes_of_host(self.key) if not p.devices]
        else:
            procs = s.processes_on(self.key)
        procs = [p for p in procs if p.pid in alive]
        return sorted(procs, key=_rank_order)


RATE_SPAN = 2 * 10**9
"""How far back the header looks to tell the sampling rate at a time (2 s)."""


def _rank_order(proc) -> tuple[int, int]:
    rank = proc.hello.get("rank")
    return (rank if isinstance(rank, int) else 1 << 30, proc.pid)


def _figure(row: Mapping[str, float | int], column: str) -> float | None:
    """A sample's figure, None where it is unknown (NaN, or the missing marker a damaged
    chunk of a recording reads as): never shown as a number."""
    v = row.get(column)
    if v is None or v == MISSING_INT:
        return None
    v = float(v)
    return None if math.isnan(v) else v


def _num(v: float | None, unit: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.0f}{unit}"


def _nice_ceiling(v: float) -> float:
    """Round up to 1, 2 or 5 times a power of two-ish GiB fraction for a tidy axis."""
    if v <= 0:
        return 1.0
    mag = 2 ** math.floor(math.log2(v))
    for mult in (1, 1.25, 1.5, 2):
        if v <= mult * mag:
            return mult * mag
    return 2 * mag


def _css_id(key: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in key)
