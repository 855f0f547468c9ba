"""The Ranks tab: a job's ranks side by side (docs/ranks.md), formatted from the ranks model.

One row per rank with its newest exact peak in each phase, its prediction and its GPU's
used memory; per phase the highest and the lowest rank; the faults, each on a line of its
own starting with ``!`` (a flagged rank and a flagged peak carry one too), so they stand
out without colour. Columns that do not fit are left out, least telling first.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from ..analysis.rank_feed import RankFeed
from ..analysis.rank_table import Flag, Ranks, format_ranks
from ..fmt import ellipsis, fmt_short, printable
from ..session import Session

SHORT_PHASES = {
    "forward": "fwd",
    "backward": "bwd",
    "optimizer.step": "optim",
    "zero_grad": "zero",
}
"""Phase names as a narrow table heads them."""

GAP = 2
"""Spaces between two columns."""

HIDDEN_EVERY = 5.0
"""Seconds between two looks at the ranks while their tab is not shown."""


@dataclass
class Column:
    """One column of the ranks table: its heading, its cells, whether each is flagged."""

    head: str
    cells: list[str]
    flagged: list[bool]
    priority: int  # lower stays longer
    left: bool = False

    @property
    def width(self) -> int:
        return max([len(self.head), *(len(c) for c in self.cells)])


def columns(ranks: Ranks, narrow: bool) -> list[Column]:
    """The table's columns in the order shown (not yet fitted to a width)."""
    rows = ranks.rows
    flagged = {f.rank for f in ranks.flags}
    above = {(f.rank, f.phase) for f in ranks.flags if f.kind == "above_median"}
    none = [False] * len(rows)
    out = [
        Column(
            "rank",
            [("!" if r.rank in flagged else " ") + str(r.rank) for r in rows],
            [r.rank in flagged for r in rows],
            0,
            left=True,
        ),
        Column("host", [printable(ellipsis(r.host, 12)) for r in rows], none, 6, True),
        Column("gpu", [printable(r.gpu or "cpu") for r in rows], none, 4, True),
        Column("pid", [str(r.pid) for r in rows], none, 7),
        Column(
            "step",
            ["-" if r.step is None else str(r.step) for r in rows],
            [any(f.kind == "step_behind" and f.rank == r.rank for f in ranks.flags) for r in rows],
            5,
        ),
    ]
    for i, name in enumerate(ranks.phases):
        head = SHORT_PHASES.get(name, name) if narrow else name
        marks = [(r.rank, name) in above for r in rows]
        # A flagged peak ends in "!"; the others keep their digits in line with it.
        tail = {True: "!", False: " " if any(marks) else ""}
        cells = [
            ("-" if r.phases.get(name) is None else fmt_short(r.phases[name].peak)) + tail[hit]
            for r, hit in zip(rows, marks, strict=True)
        ]
        out.append(Column(printable(ellipsis(head, 14)), cells, marks, 1 if i < 6 else 8))
    out.append(Column("predicted", [fmt_short(r.predicted) for r in rows], none, 3))
    out.append(Column("used", [fmt_short(r.used) for r in rows], none, 2))
    return out


def short_flag(flag: Flag) -> str:
    """A fault in the few words a short terminal has room for."""
    if flag.kind == "above_median":
        why = f" ({flag.category})" if flag.category else ""
        return f"rank {flag.rank} {flag.phase} {fmt_short(flag.bytes)} over the median{why}"
    if flag.kind == "stray_context":
        held = f" ({fmt_short(flag.bytes)})" if flag.bytes else ""
        return f"rank {flag.rank}: a context on GPU {flag.category}{held}, not its own GPU"
    return flag.text


def fit(cols: list[Column], width: int) -> list[Column]:
    """The columns that fit in ``width``, keeping the most telling (lowest priority) first."""
    keep: set[int] = set()
    used = 0
    for i in sorted(range(len(cols)), key=lambda i: (cols[i].priority, i)):
        need = cols[i].width + (GAP if keep else 0)
        if used + need <= width:
            keep.add(i)
            used += need
    return [c for i, c in enumerate(cols) if i in keep]


def render(tables: Sequence[Ranks], width: int, *, compact: bool, flag_style: str) -> Text:
    """The Ranks tab's text: each job's table, its spreads and its faults.

    Args:
        tables: The jobs, the newest first (compact shows only the newest).
        width: Columns available.
        compact: A short terminal: one job, one line per fault, cut to the width.
        flag_style: How a fault is styled (its ``!`` marks it without colour too).
    """
    out = Text(no_wrap=compact, overflow="ellipsis" if compact else "fold")
    if not tables:
        out.append(
            "No job of two or more ranks: a rank is a process started by torchrun "
            "(or with RANK and WORLD_SIZE set) that imports gpuwatch."
        )
        return out
    shown = tables[:1] if compact else tables
    for j, ranks in enumerate(shown):
        if j:
            out.append("\n\n")
        _job(out, ranks, width, compact, flag_style)
    if compact and len(tables) > 1:
        out.append(f"\n+{len(tables) - 1} older job(s): a taller terminal shows them", "dim")
    return out


def _job(out: Text, ranks: Ranks, width: int, compact: bool, flag_style: str) -> None:
    faults = len(ranks.flags)
    tail = f"  ! {faults} fault{'s' * (faults != 1)}" if faults else ""
    head = printable(format_ranks(ranks)[0])
    out.append(ellipsis(head, max(1, width - len(tail))), "bold")
    out.append(ellipsis(tail, width - len(out.plain.rsplit("\n", 1)[-1])), flag_style)
    cols = fit(columns(ranks, narrow=compact or width < 100), width)
    out.append("\n")
    line = Text()
    for c in cols:
        _cell(line, c.head, c, "bold")
    out.append_text(_trim(line))
    for i in range(len(ranks.rows)):
        out.append("\n")
        line = Text()
        for c in cols:
            _cell(line, c.cells[i], c, flag_style if c.flagged[i] else "")
        out.append_text(_trim(line))
    for s in ranks.spreads:
        if s.ranks < 2:
            continue
        name = SHORT_PHASES.get(s.phase, s.phase) if compact else s.phase
        text = (
            f"{name}: max {fmt_short(s.max_bytes)} rank {s.max_rank} · "
            f"min {fmt_short(s.min_bytes)} rank {s.min_rank} · spread {fmt_short(s.spread_bytes)}"
        )
        out.append("\n")
        out.append(printable(ellipsis(text, width)), "dim" if not s.spread_bytes else "")
    for f in ranks.flags:
        out.append("\n")
        text = "! " + printable(short_flag(f) if compact else f.text)
        out.append(ellipsis(text, width) if compact else text, flag_style)


def _cell(line: Text, text: str, col: Column, style: str) -> None:
    if len(line):
        line.append(" " * GAP)
    w = col.width
    line.append(text.ljust(w) if col.left else text.rjust(w), style)


def _trim(line: Text) -> Text:
    line.rstrip()
    return line


class RanksView(VerticalScroll):
    """The Ranks tab: every job's ranks side by side, refreshed by the app's table timer."""

    DEFAULT_CSS = """
    RanksView {
        height: 1fr;
        padding: 0 1;
    }
    RanksView > Static {
        width: 100%;
    }
    """

    def __init__(self, session: Session, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.session = session
        self.feed = RankFeed()
        self.tables: list[Ranks] = []
        self._at = -HIDDEN_EVERY  # when the tables were last made (monotonic seconds)
        self.body = Static("", id=f"{id}-body" if id else None)
        self._stale = False  # tables made while hidden, not drawn yet

    def compose(self) -> ComposeResult:
        yield self.body

    def refresh_rows(self, hidden: bool = False) -> None:
        """Set the ranks side by side anew (explanations are reused while fresh).

        Args:
            hidden: The tab is not shown (its faults are counted in the status bar): at
                most every :data:`HIDDEN_EVERY` seconds.
        """
        now = time.monotonic()
        if hidden and now - self._at < HIDDEN_EVERY:
            return
        self._at = now
        self.tables = self.session.read(lambda: self.feed.tables(self.session))
        if hidden:  # only the faults are read: drawn when the tab shows (on_show)
            self._stale = True
            return
        self._draw()

    @property
    def faults(self) -> int:
        """The faults of every job, as last looked at."""
        return sum(len(r.flags) for r in self.tables)

    def on_mount(self) -> None:
        self._draw()

    def on_resize(self) -> None:
        self._draw()

    def on_show(self) -> None:
        if self._stale:
            self._draw()

    def _draw(self) -> None:
        # Its tab being added (drawn once mounted), or the app closing (the table timer
        # can tick once more after the widgets are detached).
        if not self.is_mounted or not self.is_attached:
            return
        self._stale = False
        width = max(20, self.size.width - 2) if self.size.width else 78
        compact = self.screen.has_class("-short")  # the dashboard's 80x24 layout
        theme = self.app.current_theme
        style = f"bold {theme.warning}" if theme is not None and theme.warning else "bold"
        self.body.update(render(self.tables, width, compact=compact, flag_style=style))
