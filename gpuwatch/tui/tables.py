"""The per-phase peaks table and its detail line (the process table is tui/processes.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.text import Text
from textual.widgets import DataTable, Static

from ..analysis.explain import explain_span
from ..fmt import fmt_bytes, fmt_duration
from ..predict import total
from ..session import Session, is_host
from ..session.peaks import PhasePeak, phase_peaks
from ._text import plain, plain_lines


class PeakDetail(Static):
    """The selected Peaks row explained: its exact peak split by category, with sources."""

    DEFAULT_CSS = """
    PeakDetail {
        dock: bottom;
        height: auto;
        max-height: 6;
        padding: 0 1;
        border-top: solid $panel-lighten-2;
    }
    """

    def show(self, lines: Sequence[str]) -> None:
        """Show ``lines`` (a few); none shows a hint."""
        # Names in them are the script's word: shown as typed, never as markup, and a
        # newline inside one is escaped; the breaks between our lines stay breaks.
        self.update(plain_lines(lines or ["Select a row to see where its peak went."]))


DROP_ORDER = ("device", "process", "reserved", "devmax", "duration")
"""The Peaks columns left out, in this order, while the table is wider than its tab (80
columns: the first three go). What a one-process, one-GPU run repeats on every row goes
first; step, phase, the exact peak, the prediction and what it leaves unexplained stay."""


class PeaksTable(DataTable):
    """Phases x steps with the exact peaks the script reported and what NVML saw.

    Newest step first. Rows cover every instrumented process on every device it uses.
    The highlighted row is the phase under the dashboard's cursor (:meth:`follow`), else
    the one the user picked; it is explained in :attr:`detail` (compose it under the
    table). Columns that do not fit go in :data:`DROP_ORDER`.
    """

    DEFAULT_CSS = """
    PeaksTable {
        height: 1fr;
    }
    """

    COLUMNS = (
        ("step", "step"),
        ("phase", "phase"),
        ("process", "process"),
        ("device", "device"),
        ("duration", "duration"),
        ("alloc", "peak allocated"),
        ("reserved", "peak reserved"),
        ("devmax", "nvidia-smi max / RSS max"),
        ("predicted", "predicted"),
        ("unexplained", "unexplained"),
    )

    def __init__(self, session: Session, last_steps: int = 20, *, id: str | None = None) -> None:
        super().__init__(id=id, zebra_stripes=True, cursor_type="row")
        self.session = session
        self.last_steps = last_steps
        self.predicted: Mapping = {}  # pid -> PredictedLine: the session's, set by the app
        self._signature: tuple[object, ...] | None = None
        self.explanations: list[list[str]] = []  # per row, the detail's lines
        self.detail = PeakDetail(id=f"{id}-detail" if id else None)
        self.cells: list[tuple[object, ...]] = []  # per row, a cell per column of COLUMNS
        self.spans: list[tuple[int, int, int, int]] = []  # per row: (t0, t1, depth, pid)
        self.shown: tuple[str, ...] = tuple(k for k, _ in self.COLUMNS)  # column keys shown
        self._followed: int | None = None  # the time followed, for a rebuild

    def on_mount(self) -> None:
        self._fill()

    def on_resize(self) -> None:
        if self._fitting() != self.shown:
            self._fill()

    def _fitting(self) -> tuple[str, ...]:
        """The columns that fit the width, left out in :data:`DROP_ORDER`."""
        width = self.size.width
        keys = [k for k, _ in self.COLUMNS]
        if width <= 0:
            return tuple(keys)
        # Each column: its widest cell or label, and a cell of padding either side.
        widths = {
            key: max([len(label)] + [len(str(row[i])) for row in self.cells])
            + 2 * self.cell_padding
            for i, (key, label) in enumerate(self.COLUMNS)
        }
        drop = list(DROP_ORDER)
        while sum(widths[k] for k in keys) > width - 1 and drop:  # 1: the scrollbar's room
            keys.remove(drop.pop(0))
        return tuple(keys)

    def _fill(self) -> None:
        """(Re)build the columns that fit and the rows, keeping the highlighted one."""
        row = self.cursor_row
        self.shown = self._fitting()
        index = [i for i, (k, _) in enumerate(self.COLUMNS) if k in self.shown]
        self.clear(columns=True)
        for i in index:
            key, label = self.COLUMNS[i]
            self.add_column(label, key=key)
        self.add_rows([tuple(cells[i] for i in index) for cells in self.cells])
        if self._followed is not None and self.follow(self._followed, force=True):
            return
        if 0 < row < len(self.cells):
            self.move_cursor(row=row)
        self._show(self.cursor_row)

    def follow(self, t: int | None, force: bool = False) -> bool:
        """Highlight the phase running at ``t`` (the innermost, the newest on a tie);
        None (no cursor) leaves the highlight where it is. True when a row was found."""
        if t is None:
            self._followed = None
            return False
        if t == self._followed and not force:
            return True
        self._followed = t
        best: tuple[int, int] | None = None  # (depth, -row)
        for i, (t0, t1, depth, _) in enumerate(self.spans):
            if t0 <= t <= t1 and (best is None or (depth, -i) > best):
                best = (depth, -i)
        if best is None:
            return False
        row = -best[1]
        if row != self.cursor_row:
            self.move_cursor(row=row, scroll=True)
        self._show(row)
        return True

    def refresh_rows(self) -> None:
        """Rebuild the rows if any process ended a phase since the last call (read in one
        :meth:`~gpuwatch.session.Session.read`)."""
        made = self.session.read(self._rows)
        if made is None:
            return
        self.cells, self.spans, self.explanations = made
        self._fill()

    def _rows(
        self,
    ) -> tuple[list[tuple[object, ...]], list[tuple[int, int, int, int]], list[list[str]]] | None:
        """Each phase's cells, span and explanation, or None when no process ended a phase
        since the last call."""
        s = self.session
        signature = tuple((p.pid, len(p.phases)) for p in s.processes.values())
        if signature == self._signature:
            return None
        self._signature = signature
        rows: list[tuple[object, ...]] = []
        spans: list[tuple[int, int, int, int]] = []
        texts: list[list[str]] = []
        for proc in s.processes.values():
            keys = sorted(set(proc.devices.values())) or [proc.host]
            line = self.predicted.get(proc.pid)
            for key in keys:
                dev = s.devices.get(key)
                dev_label = (
                    "host"
                    if is_host(key)
                    else f"GPU {dev.index}"
                    if dev and dev.index is not None
                    else "GPU"
                )
                peaks = phase_peaks(s, proc, key, self.last_steps)
                predicted = {}
                if line is not None and peaks:
                    predicted = line.span_peaks(min(p.t0 for p in peaks), max(p.t1 for p in peaks))
                for p in peaks:
                    sp = predicted.get((p.name, p.t0, p.t1))
                    pred = total(sp.peak) if sp is not None else None
                    rest = p.peak_alloc - pred if pred is not None and p.peak_alloc else None
                    rows.append(
                        (
                            "" if p.step is None else str(p.step),
                            plain(p.name),
                            plain(proc.label),
                            dev_label,
                            fmt_duration(p.t1 - p.t0),
                            Text(fmt_bytes(p.peak_alloc), justify="right"),
                            Text(fmt_bytes(p.peak_reserved), justify="right"),
                            Text(fmt_bytes(p.device_max), justify="right"),
                            Text(fmt_bytes(pred), justify="right"),
                            Text(fmt_bytes(rest), justify="right"),
                        )
                    )
                    spans.append((p.t0, p.t1, p.depth, proc.pid))
                    try:
                        texts.append(_explain_row(line, p, sp, proc.label, is_host(key)))
                    except Exception as exc:  # facts are the script's word: never a crash
                        texts.append([f"{p.name}: cannot be explained ({type(exc).__name__})"])
        return rows, spans, texts

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show(event.cursor_row)

    def _show(self, row: int) -> None:
        texts = self.explanations
        self.detail.show(texts[row] if 0 <= row < len(texts) else [])


def _explain_row(line: Any, p: PhasePeak, sp: Any, label: str, host: bool) -> list[str]:
    """The detail lines of one Peaks row: what its exact peak is made of, and from where."""
    where = f"{p.name}, step {p.step}" if p.step is not None else p.name
    # The model the span ran, whichever came after it.
    prediction = line.prediction_at(p.t0) if line is not None else None
    if sp is None or line is None or prediction is None:
        why = "no model facts from this process" if line is None else "a phase it does not model"
        return [f"{where} ({label}): nothing predicted ({why})"]
    # The object `info` and the bar at a cursor in this span read (one story).
    parts = explain_span(
        prediction,
        sp,
        None if host else p.peak_alloc,
        None if host else p.peak_reserved,
        None if host else p.device_max,
    ).parts
    # A label that names its source already ("activations (formula)") is not told twice.
    terms = [
        f"{x.label} {fmt_bytes(x.bytes)}"
        + (f" ({x.source})" if x.source and f"({x.source})" not in x.label else "")
        for x in parts
    ]
    inside = [t for t, x in zip(terms, parts, strict=True) if x.key not in ("cache", "context")]
    beyond = [t for t, x in zip(terms, parts, strict=True) if x.key in ("cache", "context")]
    measured = p.peak_alloc if not host else None
    head = f"peak {fmt_bytes(measured)}" if measured is not None else "predicted peak"
    lines = [f"{where} ({label}): {head} = " + " + ".join(inside)]
    if beyond:
        lines.append("beyond allocated: " + " · ".join(beyond))
    if prediction.findings:
        lines.append(prediction.findings[0])
    return lines
