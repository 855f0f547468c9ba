"""Filling a replay session from its recording: on demand, or chunk by chunk in time order.

The :class:`Loader` reads the file's facts and chunk index and hands them to the session's
restore API (:mod:`gpuwatch.session.restore`: ``device``, ``process``,
``series_table``/``extend_series``, ...), which keeps the session's invariants; the loader
keeps only its own state: the chunk index, which chunk comes next, and the file it follows
while another gpuwatch still writes it.

*Windowed* (replay, ``info``, ``export``): each table gets a
:class:`~gpuwatch.store.archive.SeriesArchive` and no rows; views read the windows they
show, so memory does not grow with the file. Otherwise every chunk is decoded into the
tables (``load``: tests, conversions, small files).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import protocol
from ..session import Mark, Oom, OpenSpan, Session, Table, restore
from ..session import summary as sm
from ..session.process import PROCESS_TABLES
from ..session.table import unknown_column
from . import _bodies, _codec, _index
from ._schema import SERIES, SUMMARIES, layout_dtypes
from .archive import ChunkSource, SeriesArchive
from .marks import BATCH as MARK_BATCH
from .marks import FileMarks
from .recording import Recording, RecordingError, open_recording

FOLLOW_INTERVAL = 0.5
"""Seconds between looks at a file that is still being written."""


_NO_CHUNKS = np.zeros(0, np.int64)  # read-only: shared by every feed that keeps no index
_NO_CHUNKS.flags.writeable = False


@dataclass(slots=True)  # one per series: thousands in a recording of a sweep
class _Feed:
    """One series being appended to its session table.

    A windowed feed of a series its archive keeps asleep holds no index of its own: only
    its first and last time and its highest value (the loader's :class:`_Packed` index
    gives the archive the rest when a view needs it).
    """

    id: int
    kind: str
    key: str
    table: Table
    stored: list[tuple[str, np.dtype]]  # the layout the file has
    archive: SeriesArchive | None = None  # windowed: where the table reads its rows
    limit: int = 0  # rows the file held at the last refresh
    loaded: int = 0
    # The chunk index as of the last refresh (ordered by row0).
    row0: np.ndarray = field(default_factory=lambda: _NO_CHUNKS)
    t_first: np.ndarray = field(default_factory=lambda: _NO_CHUNKS)
    t_last: np.ndarray = field(default_factory=lambda: _NO_CHUNKS)
    first: int | None = None  # the series' first and last time
    last: int | None = None
    top: tuple[int, int] | None = None  # (highest main value, its first time), if any

    def next_time(self) -> int:
        """The index's first time of the chunk holding the next row to load."""
        i = int(np.searchsorted(self.row0, self.loaded, "right")) - 1
        return int(self.t_first[max(i, 0)])

    def set_index(self, part: np.ndarray, keep: bool) -> None:
        """Note a refresh's index of the series (rows as :data:`_index.Index` has them);
        ``keep``: hold its rows too (loading chunk by chunk, or summarising them)."""
        self.row0, self.t_first, self.t_last = (
            (part[:, 1], part[:, 3], part[:, 4]) if keep else (_NO_CHUNKS,) * 3
        )
        self.first, self.last = int(part[0, 3]), int(part[-1, 4])
        self.top = None
        known = np.flatnonzero(part[:, 5] != _index.NONE)
        if len(known):
            i = known[int(np.argmax(part[known, 5]))]  # the first chunk reaching it
            self.top = (int(part[i, 5]), int(part[i, 6]))
        self.limit = int(part[-1, 1] + part[-1, 2])


class _Packed:
    """Every series' chunk index and its chunks' own summaries, packed in a few arrays:
    an archive asleep reads its part from here when a view first needs it (a recording
    of thousands of processes would otherwise keep some twenty small arrays a series).

    Args:
        index: The file's chunk index (see :func:`_index.read`).
        summaries: Its chunks' own summaries, by series.
    """

    def __init__(self, index: _index.Index, summaries: _index.Summaries) -> None:
        sids = sorted(index)
        self.sids = np.array(sids, np.int64)
        self.starts = np.cumsum([0, *(len(index[sid]) for sid in sids)]).astype(np.int64)
        parts = [index[sid][:, 1:] for sid in sids]
        self.rows = np.concatenate(parts) if parts else np.zeros((0, 6), np.int64)
        own = sorted(sid for sid, (row0, _) in summaries.items() if len(row0))
        self.own_sids = np.array(own, np.int64)
        self.own_starts = np.cumsum([0, *(len(summaries[sid][0]) for sid in own)]).astype(np.int64)
        self.own_bytes = np.cumsum([0, *(len(summaries[sid][1]) for sid in own)]).astype(np.int64)
        self.own_row0 = (
            np.concatenate([summaries[sid][0] for sid in own]) if own else np.zeros(0, np.int64)
        )
        self.own_joined = b"".join(summaries[sid][1] for sid in own)

    def chunks(self, sid: int) -> np.ndarray | None:
        """The series' index: rows of ``(row0, n, t_first, t_last, vmax, t_vmax)``; None
        for a series not packed."""
        i = int(np.searchsorted(self.sids, sid))
        if i >= len(self.sids) or self.sids[i] != sid:
            return None
        return self.rows[self.starts[i] : self.starts[i + 1]].copy()

    def summaries(self, sid: int) -> tuple[np.ndarray, bytes] | None:
        """The ``row0`` of the series' summarised chunks and their summaries, joined."""
        i = int(np.searchsorted(self.own_sids, sid))
        if i >= len(self.own_sids) or self.own_sids[i] != sid:
            return None
        row0 = self.own_row0[self.own_starts[i] : self.own_starts[i + 1]].copy()
        return row0, self.own_joined[self.own_bytes[i] : self.own_bytes[i + 1]]


def _own(packed: _Packed, sid: int) -> _index.Summaries:
    """The series' own summaries as :data:`_index.Summaries` (empty without any)."""
    own = packed.summaries(sid)
    return {sid: own} if own is not None else {}


class Loader:
    """Fills a replay session from its recording, chunk by chunk in time order.

    Tables only grow in time order, so chunks of all series are appended by their first
    time: at any moment everything up to :attr:`loaded_until` is in the session. A file
    whose writer still runs is followed: new rows, processes and events appear as written.

    Args:
        recording: The open file.
        session: The session to fill.
        windowed: Give tables archives instead of rows (see the module's docstring).

    Attributes:
        error: Why loading stopped early (a damaged chunk), or None.
    """

    def __init__(self, recording: Recording, session: Session, windowed: bool = False) -> None:
        self.recording = recording
        self.session = session
        self.windowed = windowed
        self.error: str | None = None
        self.following = False
        self.source = ChunkSource(recording.path, on_error=self._read_failed) if windowed else None
        self._summaries = recording.meta.get(SUMMARIES) == str(sm.VERSION)
        self._feeds: dict[int, _Feed] = {}
        self._layouts: dict[str, list[tuple[str, np.dtype]]] = {}  # series columns, parsed
        self._packed: _Packed | None = None  # windowed: the index of series read asleep
        self._dtypes: dict[str, dict[str, np.dtype]] = {}  # a table's columns, by kind
        self._heap: list[tuple[int, int]] = []
        # Windowed, a file without summaries: chunks to summarise, latest first.
        self._pending: list[tuple[int, int, int]] = []
        self._touched = 0.0
        self._cache: dict[tuple[str, Any], bytes] = {}
        self._event_seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The loader's own state (feeds, heap); the file is read through the recording's.
        self._lock = threading.RLock()
        self.loaded_until = session.t_origin
        self._bounds = (session.t_origin, session.t_origin)

    # ------------------------------------------------------------------ facts

    def refresh(self) -> None:
        """Read what changed in the file: facts, new series and the chunk index."""
        with self._lock:
            with self.recording.reading(transaction=True) as db:
                self._read_facts(db)
                self._read_index(db)
            self._drop_stray_events()
            self._bounds = self._compute_bounds()
            self._rebuild_heap()

    def _changed(self, key: tuple[str, Any], body: str) -> bool:
        # A digest, not the body: a recording of thousands of processes would keep each
        # one's hello twice (its text here, and what it says in the session).
        text = f"{type(body).__name__}:{body}"  # a hostile file's BLOB is not its TEXT
        seen = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        if self._cache.get(key) == seen:
            return False
        self._cache[key] = seen
        return True

    def _read_facts(self, db: sqlite3.Connection) -> None:
        s = self.session
        for nid, name in db.execute(
            "SELECT id, name FROM names WHERE id >= ? ORDER BY id", (len(s.names),)
        ):
            if s.name_id(name) != nid:
                raise RecordingError(f"{self.recording.path} is damaged (phase names)")
        for key, body in db.execute("SELECT key, body FROM devices"):
            if self._changed(("device", key), body):
                restore.device(s, _bodies.device(str(key), json.loads(body)))
        for pid, body in db.execute("SELECT pid, body FROM processes"):
            if self._changed(("process", pid), body):
                restore.process(s, pid, _bodies.process_state(json.loads(body)))
        spans: dict[int, dict[int, OpenSpan]] = {}
        for pid, _, body in db.execute("SELECT pid, id, body FROM open_spans"):
            span = _bodies.open_span(json.loads(body))
            if span is not None:
                spans.setdefault(pid, {})[span.id] = span
        restore.open_spans(s, spans)
        for pid, body in db.execute("SELECT pid, body FROM proc_info"):
            s.set_proc_info(pid, _bodies.proc_info(json.loads(body)))
        self._read_events(db)
        self._read_counts(db)

    def _read_events(self, db: sqlite3.Connection) -> None:
        """The events past the last one read: marks, OOMs and notes into the session."""
        s = self.session
        marks: list[Mark] = []
        ooms, notes = [], []
        filed = self.source is not None
        if self.source is not None:
            # Windowed: the session keeps the newest marks, the file gives back the rest.
            s.retention.read_marks_from(FileMarks(self.source))
        for seq, t, kind, pid, body in db.execute(
            "SELECT seq, t, kind, pid, body FROM events WHERE seq > ? ORDER BY seq",
            (self._event_seq,),
        ):
            self._event_seq = seq
            clean = _bodies.event(kind, json.loads(body))
            if clean is None or type(t) is not int:
                continue
            pid = pid if type(pid) is int else 0
            if kind == "mark":
                level = clean.get("level") or "info"
                marks.append(Mark(t, pid, clean["text"], level, clean.get("step")))
                if filed and len(marks) >= MARK_BATCH:  # memory holds a batch at a time
                    restore.events(s, marks, filed=True)
                    marks = []
            elif kind == "oom":
                ooms.append(Oom(t, pid, clean))
            elif kind == "note":
                notes.append(clean["text"])
        restore.events(s, marks, ooms, notes, filed=filed)

    def _read_counts(self, db: sqlite3.Connection) -> None:
        """The rejected messages' counts and the sampler's rates (what is malformed: left
        out)."""
        rejects = {
            reason: count
            for reason, count in db.execute("SELECT reason, count FROM rejects")
            if isinstance(reason, str) and type(count) is int
        }
        row = db.execute("SELECT value FROM meta WHERE key = 'sampler_rate'").fetchone()
        stored = json.loads(row[0]) if row else None
        rates = (
            {k: v for k, v in (stored or {}).items() if isinstance(v, (int, float))}
            if isinstance(stored, dict)
            else {}
        )
        restore.counts(self.session, rejects, rates)

    def _read_index(self, db: sqlite3.Connection) -> None:
        series = db.execute("SELECT id, kind, key, columns FROM series").fetchall()
        index, summaries = _index.read(db)
        sleepers = self._sleepers(series, index, summaries) if self.windowed else set()
        if self.windowed:  # only theirs: the others' archives hold their own
            own = {sid: summaries[sid] for sid in sleepers if sid in summaries}
            self._packed = _Packed({sid: index[sid] for sid in sleepers}, own)
        for sid, kind, key, columns in series:
            part = index.pop(sid, None)  # let go of each as it is taken
            if part is None or kind not in SERIES:  # no rows yet, or a newer kind
                continue
            feed = self._feeds.get(sid)
            if feed is None:
                total = int(part[-1, 1] + part[-1, 2])
                span = (int(part[0, 3]), int(part[-1, 4])) if sid in sleepers else None
                feed = self._feeds[sid] = self._new_feed(sid, kind, key, columns, total, span)
            if sid in sleepers:
                feed.set_index(part, keep=False)  # its index stays packed until read
                feed.loaded = feed.limit
                continue
            feed.set_index(part, keep=True)
            archive = feed.archive
            if archive is not None:
                grew = archive.rows != feed.limit
                stats, stats_row0 = self._stats(sid, kind, summaries)
                archive.set_index(
                    part[:, 1:], stats, stats_row0, stored_summaries=stats is not None
                )
                feed.loaded = feed.limit  # nothing to load: rows are read when shown
                if grew:
                    feed.table.archive_grew()

    def _sleepers(
        self, series: list[tuple[Any, ...]], index: _index.Index, summaries: _index.Summaries
    ) -> set[int]:
        """The series read asleep (their index packed until a view needs it): a process's
        series whose rows are all written (the file is finished, or the process ended) and
        whose chunks each have their own summary; one asleep stays so while unchanged."""
        out: set[int] = set()
        for sid, kind, key, _ in series:
            part = index.get(sid)
            if part is None or kind not in SERIES:
                continue
            feed = self._feeds.get(sid)
            if feed is not None:
                archive = feed.archive
                rows = int(part[-1, 1] + part[-1, 2])
                if archive is not None and archive.asleep and archive.rows == rows:
                    out.add(sid)
                continue
            if kind not in PROCESS_TABLES or not self._summaries or not str(key).isdigit():
                continue
            proc = self.session.processes.get(int(key))
            if proc is None:
                continue
            if not (self.recording.complete or proc.ended is not None or proc.gone is not None):
                continue
            own = summaries.get(sid)
            if own is not None and np.array_equal(own[0], part[:, 1]):
                out.add(sid)
        return out

    def _recall(
        self, sid: int, kind: str
    ) -> tuple[np.ndarray, sm.Blocks | None, np.ndarray | None] | None:
        """A sleeping archive's index and own summaries, from the packed index; None
        where it is not packed (the archive reads the file)."""
        packed = self._packed
        chunks = packed.chunks(sid) if packed is not None else None
        if packed is None or chunks is None:
            return None
        blocks, row0 = self._stats(sid, kind, _own(packed, sid))
        return chunks, blocks, row0

    def _stats(
        self, sid: int, kind: str, summaries: _index.Summaries
    ) -> tuple[sm.Blocks | None, np.ndarray | None]:
        """The series' chunks' own summaries and their row0 from the file, if any."""
        if not self.windowed or not self._summaries or sid not in summaries:
            return None, None
        spec = sm.SPECS.get(kind)
        if spec is None:
            return None, None
        row0, joined = summaries[sid]
        try:
            blocks = sm.from_bytes(spec, joined)
        except ValueError:
            return None, None
        if len(blocks["rows"]) != len(row0):
            return None, None
        return blocks, row0

    def _new_feed(
        self,
        sid: int,
        kind: str,
        key: str,
        columns: str,
        rows: int,
        asleep: tuple[int, int] | None = None,
    ) -> _Feed:
        stored = self._layouts.get(columns)
        if stored is None:  # parsed once for every series of this layout
            stored = [(name, np.dtype(code)) for name, code in json.loads(columns)]
            if len(self._layouts) < 256:
                self._layouts[columns] = stored
        archive = None
        try:
            if self.windowed:
                assert self.source is not None
                dtypes = self._dtypes.get(kind)
                if dtypes is None:  # one for every series of the kind: read-only
                    dtypes = self._dtypes[kind] = dict(layout_dtypes(SERIES[kind][0]))
                if asleep is not None:  # its index is read the first time a view needs it
                    archive = SeriesArchive.dormant(
                        self.source,
                        sid,
                        kind,
                        stored,
                        dtypes,
                        rows,
                        (int(asleep[0]), int(asleep[1])),
                        live=False,
                        recall=lambda: self._recall(sid, kind),
                    )
                else:
                    archive = SeriesArchive(self.source, sid, kind, stored, dtypes)
                table = restore.series_table(self.session, kind, key, archive=archive)
            else:
                # Sized once: appends never copy.
                table = restore.series_table(self.session, kind, key, capacity=rows)
        except ValueError as exc:
            raise RecordingError(f"{self.recording.path} is damaged ({exc})")
        return _Feed(sid, kind, key, table, stored, archive)

    def _read_failed(self, message: str) -> None:
        """A window could not be read (a damaged chunk): say so once; show the rest."""
        if self.error is None:
            self.error = message
            self.session.note(f"{message}; showing what can be read")

    def _rebuild_heap(self) -> None:
        self._heap = [
            (feed.next_time(), sid) for sid, feed in self._feeds.items() if feed.loaded < feed.limit
        ]
        heapq.heapify(self._heap)
        pending = [
            (int(feed.t_first[k]), sid, k)
            for sid, feed in self._feeds.items()
            if feed.archive is not None
            for k in feed.archive.unsummarised()
        ]
        self._pending = sorted(pending, reverse=True)
        self._update_frontier()

    def _update_frontier(self) -> None:
        if self._heap:
            self.loaded_until = self._heap[0][0] - 1
        elif self._pending:
            self.loaded_until = self._pending[-1][0] - 1
        else:
            self.loaded_until = max(self.loaded_until, self.bounds()[1])

    # ------------------------------------------------------------------ bounds and peaks

    def bounds(self) -> tuple[int, int]:
        """First and last time in the whole file, loaded or not (as of the last refresh)."""
        return self._bounds

    def _drop_stray_events(self) -> None:
        """Leave out marks and OOMs far outside every series (files older than the ranges).

        A receiver now refuses a timestamp more than :data:`~gpuwatch.protocol.PAST_NS`
        off its clock; an older one stored marks at t=0 or 2^63-1, which would stretch the
        time axis over days or centuries.
        """
        firsts = [f.first for f in self._feeds.values() if f.first is not None]
        lasts = [f.last for f in self._feeds.values() if f.last is not None]
        if not firsts:
            return
        lo, hi = min(firsts) - protocol.PAST_NS, max(lasts) + protocol.PAST_NS
        dropped = restore.retain_events(self.session, lo, hi)
        if dropped:
            self.session.note(f"left out {dropped} marks or OOMs timed far outside the recording")

    def _compute_bounds(self) -> tuple[int, int]:
        s = self.session
        firsts = [f.first for f in self._feeds.values() if f.first is not None]
        lasts = [f.last for f in self._feeds.values() if f.last is not None]
        times = [m.t for m in s.marks] + [o.t for o in s.ooms]
        firsts += times
        lasts += times
        for p in s.processes.values():
            # A span still open (or cut off by a crash) began before the end.
            lasts += [o.t0 for o in p.open.values()]
        if not firsts:
            return s.t_origin, max([s.t_origin, *lasts])
        return min(firsts), max(lasts)

    def peak(self, kind: str) -> tuple[int, int, str] | None:
        """``(value, time, series key)`` of the largest main-column value of a series kind.

        Read from the chunk index, so it is known before the chunks are loaded.
        """
        best: tuple[int, int, str] | None = None
        for feed in self._feeds.values():
            if feed.kind != kind or feed.top is None:
                continue
            v, t = feed.top
            if best is None or v > best[0]:
                best = (v, t, feed.key)
        return best

    def begins(self, kind: str = "phases") -> dict[str, int]:
        """Series key -> the earliest start (``t0``) of its rows, for the series of
        ``kind`` read asleep: from their chunks' own summaries, without waking them."""
        packed = self._packed
        spec = sm.SPECS.get(kind)
        out: dict[str, int] = {}
        if packed is None or spec is None or spec.start is None:
            return out
        for feed in list(self._feeds.values()):
            if feed.kind != kind or feed.archive is None or not feed.archive.asleep:
                continue
            blocks, _ = self._stats(feed.id, kind, _own(packed, feed.id))
            if blocks is not None and len(blocks["start"]):
                out[feed.key] = int(blocks["start"].min())
        return out

    # ------------------------------------------------------------------ loading

    @property
    def done(self) -> bool:
        """Everything the file held at the last refresh is in the session."""
        return not self._heap and not self._pending

    def step(self) -> bool:
        """Append the next chunk in time order (windowed: summarise the next chunk of a
        file without summaries); False when nothing is left to load."""
        with self._lock:
            if not self._heap:
                if not self._pending:
                    return False
                _, sid, k = self._pending.pop()
                archive = self._feeds[sid].archive
                assert archive is not None
                archive.summarise_chunk(k)
                self._update_frontier()
                now = time.monotonic()
                if now - self._touched > 0.2 or not self._pending:
                    self._touched = now
                    self.session.touch()  # views redraw with what is summarised now
                return True
            _, sid = heapq.heappop(self._heap)
            feed = self._feeds[sid]
            self._load_next(feed)
            if feed.loaded < feed.limit:
                heapq.heappush(self._heap, (feed.next_time(), sid))
            self._update_frontier()
            return True

    def _load_next(self, feed: _Feed) -> None:
        with self.recording.reading() as db:
            row = db.execute(
                "SELECT row0, n, codec, data FROM chunks WHERE series = ? AND row0 <= ?"
                " ORDER BY row0 DESC LIMIT 1",
                (feed.id, feed.loaded),
            ).fetchone()
            if row is None or row[0] + row[1] <= feed.loaded:
                # The writer has not committed it (or the file lost it): stop at what is there.
                feed.limit = feed.loaded
                return
            row0, n, codec, blob = row
            cols = _codec.decode(blob, n, feed.stored, codec)
        a = feed.loaded - row0
        b = min(n, feed.limit - row0)
        self._append(feed, {name: col[a:b] for name, col in cols.items()})
        feed.loaded = row0 + b

    def _append(self, feed: _Feed, cols: dict[str, np.ndarray]) -> None:
        table = feed.table
        count = len(next(iter(cols.values()))) if cols else 0
        if count == 0:
            return
        out = {}
        for name in table.names:
            col = cols.get(name)
            if col is None:  # a column this file predates: unknown
                col = unknown_column(count, table.dtypes[name])
            out[name] = col
        try:
            restore.extend_series(self.session, feed.kind, feed.key, out)
        except ValueError as exc:
            raise RecordingError(f"{self.recording.path} is damaged ({exc})")

    def load_until(self, t: int) -> None:
        """Load every chunk that starts at or before ``t`` (what a frame ending at t needs)."""
        while self._heap and self._heap[0][0] <= t:
            self.step()

    def load_all(self, strict: bool = False) -> None:
        """Load everything the file holds now.

        Args:
            strict: Raise on a damaged chunk instead of keeping what loaded before it.

        Raises:
            RecordingError: Only with ``strict``.
        """
        try:
            while self.step():
                pass
        except RecordingError as exc:
            if strict:
                raise
            self._fail(str(exc))

    def _fail(self, message: str) -> None:
        self.error = message
        with self._lock:
            self._heap = []
            self._pending = []
        self.session.note(f"{message}; showing what loaded before it")

    # ------------------------------------------------------------------ background

    def start(self, follow: bool | None = None, delay: float = 0.0) -> None:
        """Load the rest on a background thread, then follow the file while it grows.

        Args:
            follow: Keep reading new data; None: while the file's writer is alive.
            delay: Seconds to wait first (the dashboard's first frame has the CPU to itself).
        """
        if follow is None:
            follow = self.recording.writer_alive()
        self.following = follow
        self._thread = threading.Thread(
            target=self._run, args=(follow, delay), name="gpuwatch-loader", daemon=True
        )
        self._thread.start()

    def _run(self, follow: bool, delay: float) -> None:
        if self._stop.wait(delay):
            return
        while not self._stop.is_set():
            try:
                if not self.step():
                    break
            except RecordingError as exc:
                self._fail(str(exc))
                return
        while follow and not self._stop.wait(FOLLOW_INTERVAL):
            try:
                self.poll()
            except RecordingError as exc:
                self._fail(str(exc))
                return
            if self.recording.complete or not self.recording.writer_alive():
                self.poll()  # its last commit
                break
        self.following = False

    def poll(self) -> int:
        """Read what the writer added since the last look and load it; returns rows added.

        Raises:
            RecordingError: The file became unreadable.
        """
        before = sum(f.loaded for f in self._feeds.values())
        self.recording.refresh_meta()
        self.refresh()
        self.load_all(strict=True)
        return sum(f.loaded for f in self._feeds.values()) - before

    def stop(self) -> None:
        """Stop loading and following."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def open_session(recording: Recording, windowed: bool = False) -> tuple[Session, Loader]:
    """A replay session holding the small facts, and the loader of its samples.

    Args:
        recording: The open file.
        windowed: The tables read their rows from the file when a view asks (replay,
            ``info``, ``export``: memory does not grow with the file); otherwise
            nothing is loaded yet: call :meth:`Loader.load_until` for what the first
            frame needs, then :meth:`Loader.start` (or :meth:`Loader.load_all`).

    Raises:
        RecordingError: The facts cannot be read.
    """
    session = Session(int(recording.meta["t_origin"]), int(recording.meta["wall_offset"]))
    session.live = False
    loader = Loader(recording, session, windowed=windowed)
    loader.refresh()
    return session, loader


def load(path: str | os.PathLike[str]) -> Session:
    """Open a recording and load all of it (``info``, ``export``, tests).

    Raises:
        RecordingError: Any problem with the file, including a damaged chunk.
    """
    rec = open_recording(path)
    try:
        session, loader = open_session(rec)
        loader.load_all(strict=True)
        return session
    finally:
        rec.close()
