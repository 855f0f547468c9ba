"""What a session keeps in memory, and what it lets go of to its recording.

A bounded session (:meth:`Retention.bound`) keeps about :data:`KEEP_ROWS` rows of each
table and about :data:`KEEP_MARKS` marks. Recorded, memory lets go only of what the file
holds, and reads it back when a view reaches it (through the
:class:`~gpuwatch.session.ports.RecordingPort` the recording attached); unrecorded, what
goes is summarised, so the counts the exporter reports stay exact.
"""

from __future__ import annotations

import threading
from collections.abc import Container, Iterator
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .model import Mark
from .process import PROCESS_TABLES, Process, compact
from .settled_table import SettledTable
from .table import Table

if TYPE_CHECKING:
    from .ports import MarkSource, RecordingPort

KEEP_ROWS = 16_384
"""Rows of each table a live session keeps in memory (see :meth:`Retention.bound`)."""

KEEP_ENDED = 64
"""Ended processes whose rows an unrecorded bounded session keeps (the newest)."""

KEEP_MARKS = 1024
"""Marks a bounded session keeps in memory (twice that between trims): the newest."""


class Retained(Protocol):
    """What retention bounds of a session: its processes' tables and its marks."""

    processes: dict[int, Process]
    marks: list[Mark]

    def tables(self, skip: Container[int] = ...) -> list[tuple[str, str, Table]]:
        """Every table that holds rows, as ``(kind, key, table)``."""

    def note(self, text: str) -> None:
        """A one-line notice."""


class Retention:
    """The retention policy of one session, and the session's view of its recording.

    Its state changes under the session's lock, taken here and never by a caller: a
    settle and a message change the same process, a trim and a message the same list of
    marks.

    Args:
        session: The session whose memory this bounds.
        lock: The session's lock.
    """

    def __init__(self, session: Retained, lock: threading.RLock) -> None:
        self._session = session
        self._lock = lock
        self.keep_rows: int | None = None  # rows each table keeps in memory (see bound)
        self.marks_gone = 0  # marks let go of, the oldest: the recording holds them
        # Marks before this (absolute) index are in the recording, or were let go before
        # it began; memory lets go only of those while _wait (a recording is written).
        self._written = 0
        self._wait = False
        self._marks: MarkSource | None = None  # reads the marks let go of back
        self._recording: RecordingPort | None = None  # reads settled series back
        self._gone_t_max: int | None = None  # the latest time of a mark let go of
        self._ended_pids: dict[int, None] = {}  # unrecorded: the newest ended, in order
        self._let_ended_go = False
        self._reopen_settled = self._reopen  # one bound method for every SettledTable

    # ------------------------------------------------------------------ the recording

    def attach(self, recording: RecordingPort) -> None:
        """A recording is written that holds what memory lets go of: settled processes'
        series are read back through it, and marks go once it holds them."""
        with self._lock:
            self._recording = recording
            self._marks = recording.marks
            self._written = self.marks_gone
            self._wait = True

    def read_marks_from(self, marks: MarkSource) -> None:
        """A replay's marks are read back from its file (unless a source is set)."""
        with self._lock:
            if self._marks is None:
                self._marks = marks

    def marks_recorded(self, count: int) -> None:
        """The recording holds the first ``count`` marks: memory may let go of them."""
        with self._lock:
            if self._wait:
                self._written = max(self._written, count)

    def recording_stopped(self) -> None:
        """No more will be written (a failure): marks stop waiting for the file."""
        with self._lock:
            self._wait = False

    def marks_restored(self, filed: bool) -> None:
        """Marks were appended from a file: where ``filed``, the file reads them back."""
        with self._lock:
            if filed:
                self._written = self.mark_count()
            self.let_marks_go()

    # ------------------------------------------------------------------ rows

    def bound(self, rows: int | None = KEEP_ROWS) -> None:
        """Keep at most about ``rows`` rows of each table in memory (None: everything).

        A recorded session lets go of what its recording holds (reading it back when a
        view asks); an unrecorded one keeps summaries of what it let go (see
        :meth:`Table.retain`).
        """
        self.keep_rows = rows
        for _, _, table in self._session.tables():
            table.retain(rows)

    def settle(self, pid: int) -> None:
        """A process that ended, all of whose rows its recording holds: it keeps a summary
        only (its :class:`Tally`, state and open spans); its tables let go of their rows,
        read back from the file when a view reaches them. Where the recording can read
        them back, the tables themselves go too (a :class:`SettledTable` each, its size
        and time span)."""
        proc = self._session.processes.get(pid)
        if proc is None:
            return
        with self._lock:
            compact(proc)
            for kind in PROCESS_TABLES:
                table = getattr(proc, kind)
                if isinstance(table, SettledTable):
                    continue
                table.retain(0)
                if self._recording is not None and table.in_memory == 0:
                    stub = SettledTable(proc, kind, len(table), table.span(), self._reopen_settled)
                    setattr(proc, kind, stub)

    def _reopen(self, proc: Process, kind: str) -> Table:
        """The real table of a settled process's :class:`SettledTable` (made once)."""
        with self._lock:
            current = getattr(proc, kind)
            if not isinstance(current, SettledTable):
                table: Table = current
                return table
            table = Table(PROCESS_TABLES[kind], 0, kind=kind)
            recording = self._recording
            archive = (
                recording.reopen(kind, str(proc.pid), len(current), current.span())
                if recording is not None
                else None
            )
            if archive is not None:
                table.resume(archive)
            table.retain(self.keep_rows)
            setattr(proc, kind, table)
            return table

    def ended(self, proc: Process) -> None:
        """A process said bye or is gone (called under the lock). Recorded, it is settled
        once the file holds its rows (:meth:`settle`). Unrecorded and bounded, the newest
        :data:`KEEP_ENDED` that ended keep their rows; older ones keep their summary only
        (state and :class:`Tally`): their rows are nowhere to read back from."""
        if self.keep_rows is None or self._recording is not None or self._marks is not None:
            return
        ended = self._ended_pids
        ended[proc.pid] = None
        while len(ended) > KEEP_ENDED:
            pid = next(iter(ended))
            del ended[pid]
            old = self._session.processes.get(pid)
            if old is None:
                continue
            compact(old)
            for kind in PROCESS_TABLES:
                table = getattr(old, kind)
                if not isinstance(table, SettledTable):
                    setattr(old, kind, SettledTable(old, kind, 0, None, self._reopen_settled))
            if not self._let_ended_go:
                self._let_ended_go = True
                self._session.note(
                    f"not recording: the rows of processes that ended before the newest "
                    f"{KEEP_ENDED} are let go (their counts remain); record to keep them"
                )

    # ------------------------------------------------------------------ marks

    def let_marks_go(self) -> None:
        """Keep about :data:`KEEP_MARKS` marks in memory, once the session is bounded or
        its marks can be read back: only those the recording holds go, unless there is
        none (they are counted in :attr:`marks_gone`, as rows go into summaries)."""
        session = self._session
        marks = session.marks
        if len(marks) <= 2 * KEEP_MARKS or (self.keep_rows is None and self._marks is None):
            return
        with self._lock:
            cut = len(marks) - KEEP_MARKS
            if self._wait:
                cut = min(cut, self._written - self.marks_gone)
            if cut <= 0:
                return
            latest = max(m.t for m in marks[:cut])
            if self._gone_t_max is None or latest > self._gone_t_max:
                self._gone_t_max = latest
            # A new list: a reader may still hold the old one.
            session.marks = marks[cut:]
            self.marks_gone += cut

    def held_marks(self) -> tuple[int, list[Mark]]:
        """How many marks were let go of, and the list memory holds (read together)."""
        with self._lock:
            return self.marks_gone, self._session.marks

    def mark_count(self) -> int:
        """Every mark the session had, let go of or not."""
        return self.marks_gone + len(self._session.marks)

    def every_mark(self) -> Iterator[Mark]:
        """Every mark: from the recording where some were let go of, then from memory."""
        with self._lock:
            gone, marks, source = self.marks_gone, self._session.marks, self._marks
            written = self._written
        if not gone or source is None:
            yield from marks
            return
        yield from source.every()
        yield from marks[max(0, written - gone) :]

    def mark_times(self) -> tuple[np.ndarray, np.ndarray]:
        """Every mark's time and pid, let go of or not (no text read into memory)."""
        with self._lock:
            gone, marks, source = self.marks_gone, self._session.marks, self._marks
            written = self._written
        if gone and source is not None:
            t, pid = source.times()
            marks = marks[max(0, written - gone) :]
        else:
            t, pid = np.zeros(0, np.int64), np.zeros(0, np.int64)
        mt = np.array([m.t for m in marks], np.int64)
        mp = np.array([m.pid for m in marks], np.int64)
        return np.concatenate([t, mt]), np.concatenate([pid, mp])

    def marks_between(self, t0: int, t1: int, in_memory: list[Mark]) -> list[Mark]:
        """Marks within ``[t0, t1]``: ``in_memory`` (those memory holds), and from the
        recording where the window reaches a time of marks let go of (at most
        :data:`KEEP_MARKS` of those)."""
        with self._lock:
            gone, source, written = self.marks_gone, self._marks, self._written
            reach = self._gone_t_max
            marks = self._session.marks
        if not gone or source is None or reach is None or t0 > reach:
            return in_memory
        # The file has every mark written: add only those it has not yet.
        unwritten = [m for m in marks[max(0, written - gone) :] if t0 <= m.t <= t1]
        return source.between(t0, t1, KEEP_MARKS) + unwritten
