"""One process's own timelines: GPU memory and host RSS, SM % and CPU %, and its phases.

Opened by ``enter`` on a row of the Processes tab. It draws with the panel's widgets (the
timeline chart, the phase band) over the dashboard's window: the cursor, zoom, pan and
follow keys are the dashboard's (:class:`~gpuwatch.tui.actions.WindowActions`, bound from
its action table, a keymap's keys with them) and move this screen as they move the panels.
``escape`` clears the cursor, then closes; ``backspace`` closes.
"""

from __future__ import annotations

import numpy as np
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen

from ..analysis.processes import ProcRow, listed_line
from ..fmt import fmt_bytes, fmt_duration, printable
from ..session import Session
from ._text import Line
from .actions import LIVE_ACTIONS, bindings
from .band import BandMarker, BandRow, PhaseBand, label_width, process_spans
from .chart import ChartFrame, Series, TimelineChart
from .keymap import KEY_IDS
from .keys import Key, KeyBar, bar_keys, bound_keys
from .transport import Dashboard
from .window_actions import WindowActions

Lines = tuple[np.ndarray, np.ndarray]

MEMORY_ROLES = {"gpu": "nvml", "rss": "allocated"}
PERCENT_ROLES = {"sm": "reserved", "cpu": "predicted"}
"""Theme roles (colours) of this screen's lines."""

WINDOW_KEYS = ("cursor", "cursor_window", "zoom", "pan", "toggle_follow", "quit")
"""The dashboard's actions bound here too (by the name before their arguments)."""
SHOWN = (
    ("zoom(0.5)", "Zoom in"),
    ("zoom(2.0)", "Zoom out"),
    ("toggle_follow", "Follow / pause"),
    ("quit", "Quit"),
)
"""The key bar's actions and labels after ``Back`` and ``Cursor``, each on the key that
runs it now."""


class ProcessScreen(WindowActions, Screen[None]):
    """The timelines of process ``row.pid``.

    Args:
        session: The session.
        row: The process's row as the Processes tab showed it.
    """

    DEFAULT_CSS = """
    ProcessScreen > Vertical {
        border: round $primary;
        padding: 0 1 0 0;
    }
    ProcessScreen .process-line {
        height: 1;
        color: $text-muted;
    }
    ProcessScreen #process-memory {
        height: 2fr;
    }
    ProcessScreen #process-percent {
        height: 1fr;
    }
    """

    BINDINGS = [
        Binding("escape", "escape", "Back", show=False, id=KEY_IDS["escape"]),
        Binding("backspace", "close", "Back", show=False, id=KEY_IDS["backspace"]),
        *bindings([a for a in LIVE_ACTIONS if a.action.split("(")[0] in WINDOW_KEYS]),
    ]

    def __init__(self, session: Session, row: ProcRow) -> None:
        super().__init__()
        self.session = session
        self.row = row
        self.pid = row.pid
        self.header = Line("", classes="process-line", markup=False)
        self.memory = TimelineChart(self._fetch_memory, session.t_origin, id="process-memory")
        self.percent = TimelineChart(self._fetch_percent, session.t_origin, id="process-percent")
        self.percent.unit = "%"
        self.band = PhaseBand(self._fetch_band)
        self.legend = Line("", classes="process-line")  # gpuwatch's own text: markup
        self.keys = KeyBar()

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = printable(self._title())
            yield self.header
            yield self.memory
            yield self.percent
            yield self.band
            yield self.legend
        yield self.keys

    @property
    def dashboard(self) -> Dashboard:
        return self.app.dashboard  # type: ignore[attr-defined]

    def on_mount(self) -> None:
        keys = bound_keys(self)
        arrows = "".join(keys[a][0] for a in ("cursor(-1)", "cursor(1)") if keys.get(a))
        cursor = [Key(arrows, "Cursor", "cursor(1)")] if arrows else []
        back = bar_keys(keys, [("escape", "Back")])
        self.keys.set_keys(back + cursor + bar_keys(keys, SHOWN))
        self.dashboard.redraw()

    async def action_quit(self) -> None:
        """Quit (as on the dashboard)."""
        await self.app.action_quit()

    def _title(self) -> str:
        r = self.row
        who = f"pid {r.shown_pid}" + (
            f" ({r.container_pid} in its container)" * bool(r.container_pid)
        )
        rank = "" if r.rank is None else f" · rank {r.rank}"
        return f"{who} · {r.user or '?'}{rank} · {(r.command or r.name)[:120]}"

    # ------------------------------------------------------------------ drawing

    def update_view(
        self, window: tuple[int, int], cursor: int | None, version: int, at: int
    ) -> None:
        """Show ``window`` with the figures at ``at`` (as a panel's update_view): what the
        frame draws is read in one :meth:`~gpuwatch.session.Session.read`."""
        read = self.session.read(lambda: self._read(window, cursor, version, at))
        rows, cells, width, frames, header, listed = read
        if rows is not None:
            self.band.take(window, cursor, version, cells, rows)
        self.band.axis_width = width
        for chart, (dots, frame) in zip((self.memory, self.percent), frames, strict=True):
            chart.set_axis_width(width)
            if frame is not None:
                chart.give(window, version, dots, frame)
            chart.update_view(window, cursor, version)
        self.band.display = listed
        self.header.set(printable(header))
        self.legend.set(self._legend())

    def _read(
        self, window: tuple[int, int], cursor: int | None, version: int, at: int
    ) -> tuple[list[BandRow] | None, int, int, list[tuple[int, ChartFrame | None]], str, bool]:
        """The band's rows (None where they stand) and the cells they are for, the label
        column, each chart's dot columns and frame (None where it holds one), the header
        and whether the process has a row on the band (under the session's lock)."""
        cells = self.band.wants(window, cursor, version)
        rows = None if cells is None else self._band_rows(*window, cells)
        width = label_width(self.band.rows if rows is None else rows)
        frames: list[tuple[int, ChartFrame | None]] = []
        for chart, fetch in ((self.memory, self._memory), (self.percent, self._percent)):
            dots = chart.dot_columns(width)
            wanted = dots and not chart.holds(window, version, dots)
            frames.append((dots, fetch(*window, dots) if wanted else None))
        header = self._header(self.figures_at(at), cursor)
        listed = self.session.processes.get(self.pid) is not None
        return rows, cells or 0, width, frames, header, listed

    def figures_at(self, t: int) -> dict[str, float | None]:
        """GPU memory, SM %, CPU % and RSS of the process at ``t`` (None: unknown)."""
        out: dict[str, float | None] = {"gpu": None, "sm": None, "cpu": None, "rss": None}
        for table in self._gpu_tables():
            snap = table.group_at(t)
            if snap is None:
                continue
            mine = snap["pid"] == self.pid
            if not mine.any():
                continue
            for col, key in (("used", "gpu"), ("sm", "sm"), ("cpu", "cpu"), ("rss", "rss")):
                v = float(snap[col][mine][0]) if col in snap else float("nan")
                if np.isfinite(v) and v > -(1 << 62):
                    out[key] = (out[key] or 0) + v if key in ("gpu", "sm") else v
        proc = self.session.processes.get(self.pid)
        if proc is not None:
            last = proc.rss.at(t)
            if last:
                out["rss"] = float(last["rss"])
                cpu = last.get("cpu")
                if cpu is not None and np.isfinite(cpu):
                    out["cpu"] = float(cpu)  # ten a second: newer than the lists' figure
        return out

    def _header(self, f: dict[str, float | None], cursor: int | None) -> str:
        parts = [
            "GPU memory " + (fmt_bytes(int(f["gpu"])) if f["gpu"] is not None else "n/a"),
            "SM " + ("n/a" if f["sm"] is None else f"{f['sm']:.0f}%"),
            "CPU " + ("n/a" if f["cpu"] is None else f"{f['cpu']:.0f}%"),
            "host RSS " + (fmt_bytes(int(f["rss"])) if f["rss"] is not None else "n/a"),
        ]
        proc = self.session.processes.get(self.pid)
        if proc is not None:
            at = cursor if cursor is not None else self.session.now()
            phase = self.session.phase_at(proc, at)
            parts.append(f"phase {phase}" if phase else "no phase")
        if self.row.elapsed is not None:
            parts.append(f"running {fmt_duration(int(self.row.elapsed * 1e9))}")
        return " · ".join(parts)

    def _legend(self) -> str:
        def swatch(role: str, what: str) -> str:
            return f"[$gw-{role}]━━[/] {what}"

        return "   ".join(
            [
                swatch(MEMORY_ROLES["gpu"], "GPU memory (NVML)"),
                swatch(MEMORY_ROLES["rss"], "host RSS"),
                swatch(PERCENT_ROLES["sm"], "SM %"),
                swatch(PERCENT_ROLES["cpu"], "CPU % (100%: one core)"),
            ]
        )

    def _gpu_tables(self) -> list:
        return [t for _, t in sorted(self.session.gpu_procs.items())]

    def _fetch_memory(self, t0: int, t1: int, n: int) -> ChartFrame:
        return self.session.read(lambda: self._memory(t0, t1, n))

    def _fetch_percent(self, t0: int, t1: int, n: int) -> ChartFrame:
        return self.session.read(lambda: self._percent(t0, t1, n))

    def _memory(self, t0: int, t1: int, n: int) -> ChartFrame:
        series = [Series(MEMORY_ROLES["gpu"], *lohi) for lohi in self._gpu_lines("used", t0, t1, n)]
        series.append(Series(MEMORY_ROLES["rss"], *self._rss_line("rss", t0, t1, n)))
        return ChartFrame(series, _ceiling(series))

    def _percent(self, t0: int, t1: int, n: int) -> ChartFrame:
        series = [Series(PERCENT_ROLES["sm"], *lohi) for lohi in self._gpu_lines("sm", t0, t1, n)]
        series.append(Series(PERCENT_ROLES["cpu"], *self._rss_line("cpu", t0, t1, n)))
        top = max(100.0, _ceiling(series))
        return ChartFrame(series, top)

    def _gpu_lines(
        self, column: str, t0: int, t1: int, n: int
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """One line per GPU the process was listed on, from the GPU's process lists."""
        out = []
        for table in self._gpu_tables():
            if column not in table.names:
                continue
            lo, hi = listed_line(table, column, self.pid, t0, t1, n, self.session.now())
            if np.isfinite(hi).any():
                out.append((lo, hi))
        return out

    def _rss_line(self, column: str, t0: int, t1: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Host RSS or CPU %: an instrumented process's own samples (ten a second), else
        those of the GPU process lists."""
        proc = self.session.processes.get(self.pid)
        if proc is not None and len(proc.rss):
            lo, hi = proc.rss.minmax(column, t0, t1, n)
            if np.isfinite(hi).any():
                return lo, hi
        lines = self._gpu_lines(column, t0, t1, n)
        if lines:
            return lines[0]
        empty = np.full(n, np.nan)
        return empty, empty

    def _fetch_band(self, t0: int, t1: int, cells: int) -> list[BandRow]:
        return self.session.read(lambda: self._band_rows(t0, t1, cells))

    def _band_rows(self, t0: int, t1: int, cells: int) -> list[BandRow]:
        proc = self.session.processes.get(self.pid)
        if proc is None:
            return []
        spans = process_spans(proc, self.session.names, t0, t1, cells, self.session.now())
        marks, ooms = self.session.events_between(t0, t1)
        markers = [BandMarker(m.t, m.level) for m in marks if m.pid == self.pid]
        markers += [BandMarker(o.t, "oom") for o in ooms if o.pid == self.pid]
        return [BandRow(proc.short_label, spans, markers)]

    # ------------------------------------------------------------------ keys

    async def action_escape(self) -> None:
        """Clear the cursor; without one, go back to the Processes tab."""
        if self.dashboard.view.cursor is not None:
            self.action_clear_cursor()
            return
        self.dismiss()

    def action_close(self) -> None:
        """Back to the Processes tab."""
        self.dismiss()


def _ceiling(series: list[Series]) -> float:
    peak = 0.0
    for s in series:
        if np.isfinite(s.hi).any():
            peak = max(peak, float(np.nanmax(s.hi)))
    return peak * 1.1 if peak > 0 else 1.0
