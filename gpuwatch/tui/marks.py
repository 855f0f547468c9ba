"""Marks and OOMs made readable: their text at the cursor, and listed in the Peaks tab.

A mark's text and an OOM's figures are the script's (or a shared recording's) word: every
string shown here goes through :func:`~gpuwatch.fmt.printable`, never through markup.
Each OOM also gets its answer, what would have fitted (``analysis/oom_answer.py``, as
``gpuwatch estimate --from`` and ``info`` give it): planned once per OOM in a thread
worker (a plan tries tens of changes), then shown in its row, at the cursor and by ``o``.
"""

from __future__ import annotations

import bisect
from itertools import islice

from rich.text import Text
from textual import work
from textual.widgets import DataTable

from ..analysis.oom_answer import answer_line, oom_answer
from ..fmt import fmt_clock, fmt_oom_sizes, printable
from ..session import Session
from ..session.model import Mark, Oom

LISTED = 1000
"""Marks and OOMs the table lists at most: the newest (a run that marks every step)."""


def describe(event: Mark | Oom, pid: bool = False) -> str:
    """One line saying what a mark or an OOM says: ``step 3: loss 2.10``,
    ``OOM in forward (step 5): requested 192.00 GiB, free 73.84 GiB`` (with ``pid``:
    ``OOM pid 507 in ...``, ``mark of pid 507: ...``)."""
    if isinstance(event, Oom):
        body = event.body
        phase = printable(body.get("phase") or "?")
        step = body.get("step")
        where = f"{phase} (step {step})" if isinstance(step, int) else phase
        sizes = ", ".join(fmt_oom_sizes(body)) or "no sizes reported"
        return f"OOM {f'pid {event.pid} ' if pid else ''}in {where}: {sizes}"
    step = f"step {event.step}: " if event.step is not None else ""
    if step and event.text.startswith(step[:-2]):
        step = ""  # the text says its step already ("step 3: loss 2.1")
    who = f"mark of pid {event.pid}: " if pid else ""
    return f"{who}{step}{printable(event.text)}"


def symbol(event: Mark | Oom) -> str:
    """The band's symbol of the event: ◆ a mark, ✖ an OOM."""
    return "✖" if isinstance(event, Oom) else "◆"


def nearest(session: Session, t: int, t0: int, t1: int) -> Mark | Oom | None:
    """The mark or OOM in ``[t0, t1]`` nearest to ``t`` (an OOM on a tie), or None."""
    marks, ooms = session.read(lambda: session.events_between(t0, t1))
    events: list[Mark | Oom] = [*ooms, *marks]
    if not events:
        return None
    return min(events, key=lambda e: abs(e.t - t))


def at(session: Session, t: int) -> list[Mark | Oom]:
    """The marks and OOMs at exactly ``t`` (where a jump landed), OOMs first."""
    marks, ooms = session.read(lambda: session.events_between(t, t))
    return [*ooms, *marks]


class MarksTable(DataTable):
    """Every mark and OOM of the session with its text (the newest :data:`LISTED`), the
    one nearest the cursor highlighted."""

    DEFAULT_CSS = """
    MarksTable {
        height: auto;
        max-height: 35%;
        border-top: solid $panel-lighten-2;
    }
    """

    COLUMNS = (("time", "time"), ("kind", ""), ("process", "process"), ("text", "mark / OOM"))

    def __init__(self, session: Session, *, id: str | None = None) -> None:
        super().__init__(id=id, zebra_stripes=True, cursor_type="row")
        self.session = session
        self.times: list[int] = []
        self._signature: tuple[int, int] | None = None
        # (pid, t) -> what would have fitted: the line, and its few words for the status
        self.answers: dict[tuple[int, int], tuple[str, str]] = {}
        self._asked: set[tuple[int, int]] = set()

    def answer(self, oom: Oom) -> tuple[str, str] | None:
        """What would have made ``oom``'s run fit, once planned, in a line and in a few
        words (None until then: the first call starts the plan)."""
        key = (oom.pid, oom.t)
        got = self.answers.get(key)
        if got is None and key not in self._asked:
            self._asked.add(key)
            self._plan(oom, key)
        return got

    def describe(self, event: Mark | Oom, pid: bool = False, short: bool = False) -> str:
        """:func:`describe`, with an OOM's answer where it is planned (``short``: in
        place of its sizes, for the status line's few cells)."""
        said = describe(event, pid)
        got = self.answer(event) if isinstance(event, Oom) else None
        if not got:
            return said
        return f"{said.partition(': ')[0]}: {got[1]}" if short else f"{said}; {got[0]}"

    @work(thread=True, group="oom-answer")
    def _plan(self, oom: Oom, key: tuple[int, int]) -> None:
        try:
            ans = oom_answer(self.session, oom)
        except Exception:  # a live session changing under the plan: no answer, no crash
            ans = None
        if ans is None:
            said = ("what would have fitted: not planned", "not planned")
        else:
            said = (answer_line(ans), answer_line(ans, short=True))
        self.app.call_from_thread(self._planned, key, said)

    def _planned(self, key: tuple[int, int], said: tuple[str, str]) -> None:
        self.answers[key] = said
        self._signature = None  # the OOM's row says it now
        self.refresh_rows()
        redraw = getattr(self.screen, "redraw", None)  # the status line at the cursor, too
        if callable(redraw):
            redraw()

    def on_mount(self) -> None:
        for key, label in self.COLUMNS:
            self.add_column(label, key=key)

    def refresh_rows(self) -> None:
        """Rebuild when a mark or an OOM came since the last call (the events read in one
        :meth:`~gpuwatch.session.Session.read`)."""
        listed = self.session.read(self._listed)
        if listed is None:
            return
        self.times = [e.t for e, _ in listed]
        origin = self.session.t_origin
        rows = [
            (fmt_clock(e.t - origin), symbol(e), Text(printable(label)), Text(self.describe(e)))
            for e, label in listed
        ]
        self.clear()
        self.add_rows(rows)
        self.display = bool(rows)

    def _listed(self) -> list[tuple[Mark | Oom, str]] | None:
        """The events to list with their process's label, or None when none came since
        the last call."""
        s = self.session
        signature = (s.mark_count(), len(s.ooms))
        if signature == self._signature:
            return None
        self._signature = signature
        kept = list(s.marks)
        if len(kept) >= LISTED or not s.marks_gone:
            listed: list[Mark] = kept[-LISTED:]  # the newest are in memory
        else:  # a session that let them go (a windowed replay): from its recording, once
            listed = list(islice(s.every_mark(), max(0, s.mark_count() - LISTED), None))
        events: list[Mark | Oom] = [*listed, *list(s.ooms)]
        events.sort(key=lambda e: e.t)
        out = []
        for e in events[-LISTED:]:
            proc = s.processes.get(e.pid)
            out.append((e, proc.label if proc is not None else str(e.pid)))
        return out

    def follow(self, t: int | None) -> None:
        """Highlight the row nearest to ``t`` (the cursor); None leaves it be."""
        if t is None or not self.times:
            return
        i = bisect.bisect_left(self.times, t)
        near = [j for j in (i - 1, i) if 0 <= j < len(self.times)]
        best = min(near, key=lambda j: abs(self.times[j] - t))
        if best != self.cursor_row:
            self.move_cursor(row=best, scroll=True)
