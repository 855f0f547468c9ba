"""Writing a session into a recording: incrementally (the recorder) or all at once.

:class:`SessionWriter` copies what is new in a :class:`~gpuwatch.session.Session` into the
file in one transaction per :meth:`~SessionWriter.sync`. Session tables only grow, so it
keeps a row cursor per table and never looks at a row twice, except to *seal*: rows first
land as a small chunk per sync, and once a series has a full chunk's worth (or its time
span) the small chunks are replaced by one large one, so each row is compressed at most
twice and the finished file holds few, well compressed chunks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import sqlite3
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from ..session import Process, Session, Table
from ..session import summary as sm
from . import _codec, _index
from ._schema import (
    CHUNK_ROWS,
    CHUNK_SPAN,
    DDL,
    FORMAT,
    PROCESS_SERIES,
    SCHEMA_VERSION,
    SERIES,
    SUMMARIES,
    SUMMARIES_DDL,
    layout_dtypes,
)
from .archive import ChunkSource, SeriesArchive, chunk_summary
from .readback import FileReadback

PAGE_SIZE = 8192


class FileRemoved(OSError):
    """The recording's file is no longer at its path (removed, or replaced by another)."""


_PROCESS_STATE = tuple(
    f.name
    for f in dataclasses.fields(Process)
    if f.name not in PROCESS_SERIES and f.name not in ("open", "tally", "book", "rev", "facts_log")
)
"""Process attributes stored as its JSON body as they are (everything but its tables, its
open spans and its facts log, which :func:`process_body` writes)."""


def dumps(obj: Any) -> str:
    """Compact JSON for the file's text columns (non-JSON values become strings)."""
    return json.dumps(obj, separators=(",", ":"), default=str, allow_nan=False)


def process_body(proc: Process) -> dict[str, Any]:
    """A process's scalar state and hello/facts as a JSON-able dict."""
    body = {name: getattr(proc, name) for name in _PROCESS_STATE}
    body["devices"] = {str(k): v for k, v in proc.devices.items()}
    body["torch_devs"] = sorted(proc.torch_devs)
    # [start, epoch, facts] each; the latest model's facts are ``facts``, not stored twice.
    log = proc.facts_epochs()
    if log:
        last = log[-1]
        body["facts_log"] = [[e.start, e.epoch, e.facts] for e in log[:-1]]
        body["facts_log"].append([last.start, last.epoch])
    return body


_Entry = tuple[tuple[int, ...], "sm.Blocks | None"]
"""A sealed chunk's index entry and its own summary, as an archive takes them."""


@dataclass
class _Series:
    id: int
    layout: list[tuple[str, np.dtype]]
    primary: str
    spec: sm.Spec | None
    table: Table
    archive: SeriesArchive | None = None  # the table's, when the session lets rows go
    written: int = 0  # rows in the file
    sealed: int = 0  # rows in large chunks; rows after this are in small ones


class SessionWriter:
    """Creates a recording and brings it up to date with a session on each :meth:`sync`.

    Not thread-safe: one thread calls :meth:`sync` and :meth:`close` (the recorder's, or
    the caller's for a one-shot save); :meth:`add_event` may be called from any thread.

    Args:
        path: The file to create (its parent directories too).
        session: What to record.
        label: Free-form description stored in ``meta.label``.
        overwrite: Replace an existing file instead of refusing.
        chunk_rows: Most rows per sealed chunk.
        chunk_span: Most nanoseconds per sealed chunk.

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is false.
        OSError, sqlite3.Error: The file cannot be created.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        session: Session,
        *,
        label: str = "",
        overwrite: bool = False,
        chunk_rows: int = CHUNK_ROWS,
        chunk_span: int = CHUNK_SPAN,
    ) -> None:
        self.path = Path(path)
        self.session = session
        self.chunk_rows = chunk_rows
        self.chunk_span = chunk_span
        self.rows_written = 0
        self._series: dict[tuple[str, str], _Series] = {}
        self._events: deque[tuple[int, str, int | None, dict[str, Any]]] = deque()
        self._cache: dict[tuple[str, Any], Any] = {}
        self._cursors = {"names": 0, "marks": 0, "ooms": 0, "notes": 0}
        self._open_known: set[int] = set()  # pids whose open spans the file has
        # Ended processes written whole (pid -> its rev then): no sync looks at them again
        # until a message changes them, and neither the session nor this writer keeps
        # more of them than a summary (their series are read back from the file).
        self._settled: dict[int, int] = {}
        self._ending: dict[int, int] = {}
        self._woken: set[int] = set()  # settled pids a view read back: settled again
        self._revive: set[int] = set()  # settled pids a message changed: written again
        self._infos: dict[int, dict[str, Any]] = {}  # pid -> the proc_info last written
        self._closed = False
        self._lock = threading.Lock()
        self._archives: dict[tuple[str, str], SeriesArchive] = {}
        # Published to the archives after COMMIT.
        self._sealed: list[tuple[_Series, list[_Entry]]] = []
        self._summaries = False  # the summaries table exists
        self._label: str | None = None  # a new label, written at the next sync
        self.source: ChunkSource | None = None
        _make_room(self.path, overwrite)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: transactions are the explicit BEGIN/COMMIT in sync().
        self._db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        try:
            self._create(session, label)
            st = os.stat(self.path)
            self._identity = (st.st_dev, st.st_ino)
        except BaseException:
            self._db.close()
            raise
        self.moved: Path | None = None  # where the file was renamed to, until said
        self._anchor = _anchor(self.path, self._identity)
        if session.keep_rows is not None:
            # The session lets rows go: the file holds them, and reads them back for views.
            self.source = ChunkSource(self.path, on_error=session.note)
            session.on_table(self._attach)
            # Settled series are read back through it; marks go too, once written.
            session.retention.attach(FileReadback(self.source, self._wake))
            self._cursors["marks"] = session.marks_gone

    def _create(self, session: Session, label: str) -> None:
        """The new file's pragmas, tables and meta, in one transaction."""
        self._db.execute(f"PRAGMA page_size={PAGE_SIZE}")
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a commit survives the process being killed (it is in the
        # OS's page cache); only a power loss may take the last commits back.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("BEGIN")
        for statement in DDL.split(";"):
            if statement.strip():
                self._db.execute(statement)
        self._set_meta(
            {
                "format": FORMAT,
                "schema": SCHEMA_VERSION,
                "gpuwatch_version": __version__,
                "host": socket.gethostname(),
                "created_wall_ns": time.time_ns(),
                "t_origin": session.t_origin,
                "wall_offset": session.wall_offset,
                "label": label,
                "writer_pid": os.getpid(),
                "complete": 0,
                SUMMARIES: sm.VERSION,
                "summary_block_rows": sm.BLOCK_ROWS,
            }
        )
        self._db.execute("COMMIT")

    def _attach(self, kind: str, key: str, table: Table) -> None:
        """Give a session table the archive its sealed rows will be read back from."""
        if kind not in SERIES or (kind, key) in self._archives:
            return
        assert self.source is not None
        layout = layout_dtypes(SERIES[kind][0])
        archive = SeriesArchive(self.source, None, kind, layout, table.dtypes, live=True)
        self._archives[(kind, key)] = archive
        table.set_archive(archive)

    def _wake(self, pid: int) -> None:
        """A view read a settled process's series back (from any thread): settle it
        again after the next commit."""
        self._woken.add(pid)

    def freeze(self) -> None:
        """No more rows will be written (a failure): tables stop waiting for the file."""
        for archive in self._archives.values():
            archive.live = False
        for _, _, table in self.session.tables():
            table.archive_grew()
        self.session.retention.recording_stopped()  # marks stop waiting for the file too

    # ------------------------------------------------------------------ public

    def add_event(self, t: int, kind: str, pid: int | None, body: dict[str, Any]) -> None:
        """Queue a point event (written at the next sync); safe from any thread."""
        self._events.append((t, kind, pid, body))

    def set_label(self, label: str) -> None:
        """Replace ``meta.label`` (written at the next sync)."""
        self._label = label

    def sync(self, final: bool = False) -> None:
        """Write everything new in the session in one transaction.

        Args:
            final: Seal every series completely (the last sync before closing).
        """
        with self._lock:
            self._follow_rename()
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                self._check_file()
                settled = self._still_settled()
                # Rows first, then what they refer to (names, processes, devices): those
                # only grow and are created before any row that uses them, so everything
                # a written row refers to is written in the same transaction.
                self._sync_series(final, settled)
                self._sync_names()
                self._sync_devices()
                self._sync_processes(final, settled)
                self._sync_events()
                self._sync_misc()
                db.execute("COMMIT")
            except BaseException:
                self._sealed.clear()
                self._ending.clear()
                _rollback(db)
                raise
        self._publish()
        ending, self._ending = self._ending, {}
        for pid, rev in ending.items():
            self._settled[pid] = rev
            self._revive.discard(pid)
            if self.source is not None:  # the file reads their rows back: memory lets go
                self._forget(pid)
                self.session.retention.settle(pid)
        # A view that read a settled process's rows made its tables again: they go again.
        woken, self._woken = self._woken, set()
        for pid in woken:
            if pid in self._settled:
                self.session.retention.settle(pid)
        # The file holds these now: memory may let go of them.
        self.session.retention.marks_recorded(self._cursors["marks"])

    def _publish(self) -> None:
        """Hand the chunks sealed by the last commit to the tables' archives: from now on
        memory may let go of their rows."""
        sealed, self._sealed = self._sealed, []
        for st, entries in sealed:
            if st.archive is not None:
                st.archive.sid = st.id
                st.archive.add(entries)
                st.table.archive_grew()

    def close(self, complete: bool = True) -> None:
        """Final sync, mark the file complete and make it one self-contained file.

        Args:
            complete: Write ``meta.complete = 1`` (false leaves it looking interrupted).
        """
        if self._closed:
            return
        self._closed = True
        try:
            self.sync(final=True)
            for archive in self._archives.values():
                archive.live = False
            if self.source is not None:
                self.source.close()  # leaving WAL mode needs no other connection
            if complete:
                with self._lock:
                    self._finish()
            # Fold the WAL back in and leave WAL mode, so the finished file opens read-only
            # anywhere (a WAL file needs its -shm beside it). If a reader is following the
            # file this fails and the file simply stays in WAL mode.
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                self._db.execute("PRAGMA journal_mode=DELETE")
            except sqlite3.Error:
                pass
        finally:
            self._db.close()
            if self._anchor is not None:
                os.close(self._anchor)
                self._anchor = None

    # ------------------------------------------------------------------ a rename

    def _follow_rename(self) -> None:
        """If the file was renamed (``mv rec.gpuwatch run1.gpuwatch``), go on writing it
        at its new name.

        SQLite keeps writing the renamed file, but its ``-wal`` stays at the old name: the
        renamed file alone would hold none of the recording. So the WAL is folded into the
        file (a checkpoint through the open descriptor), and the file is opened again by
        its new name, found from a descriptor of its own (``/proc/self/fd``, Linux).
        """
        new = self._renamed_to()
        if new is None:
            return
        old = self.path
        with self.source.paused() if self.source is not None else contextlib.nullcontext():
            busy = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
            if busy:  # a reader holds old commits: write on into the old -wal, and again
                return
            self._db.close()  # the last connection: SQLite removes the old -wal and -shm
            for suffix in ("-wal", "-shm"):
                Path(str(old) + suffix).unlink(missing_ok=True)
            self._db = sqlite3.connect(str(new), isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL mode is the file's own
            self.path = new
            if self.source is not None:
                self.source.path = new
        self.moved = new

    def _renamed_to(self) -> Path | None:
        """The file's new path, if it is no longer at :attr:`path` but exists elsewhere."""
        if self._anchor is None or os.path.lexists(self.path):
            return None  # still there, or replaced by another: _check_file tells
        try:
            where = os.readlink(f"/proc/self/fd/{self._anchor}")
            st = os.stat(where)
        except OSError:
            return None
        return Path(where) if (st.st_dev, st.st_ino) == self._identity else None

    # ------------------------------------------------------------------ pieces

    def _finish(self) -> None:
        """Mark the file complete, with the memo of its index that opens it fast.

        One transaction: a file is complete with its memo or neither. A memo that cannot
        be written (disk full) costs only speed: the file is still marked complete.
        """
        db = self._db
        ended = {"complete": 1, "ended_t": time.monotonic_ns()}
        try:
            db.execute("BEGIN IMMEDIATE")
            _index.write_memo(db)
            self._set_meta(ended)
            db.execute("COMMIT")
            return
        except sqlite3.Error:
            _rollback(db)
        self._set_meta(ended)

    def _check_file(self) -> None:
        """Refuse to go on writing into a file that was removed or replaced under us.

        SQLite would carry on writing into the unlinked inode, and every row would be lost
        without a word.
        """
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self._renamed_to() is not None:
                return  # renamed, and not moved to yet (a reader was busy): still ours
            raise FileRemoved("file removed")
        if (st.st_dev, st.st_ino) != self._identity:
            raise FileRemoved("file replaced by another")

    def _set_meta(self, values: dict[str, Any]) -> None:
        self._db.executemany(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
            [(k, str(v)) for k, v in values.items()],
        )

    def _changed(self, key: tuple[str, Any], value: Any) -> bool:
        if self._cache.get(key, _NOTHING) == value:
            return False
        self._cache[key] = value
        return True

    def _forget(self, pid: int) -> None:
        """Let go of what this writer knew of a settled process's series and body: a
        message that changes it again finds its series in the file (see _revived)."""
        key = str(pid)
        for kind in PROCESS_SERIES:
            self._series.pop((kind, key), None)
            self._archives.pop((kind, key), None)
        self._cache.pop(("process", pid), None)
        self._open_known.discard(pid)

    def _revived(self, kind: str, key: str, table: Table) -> _Series | None:
        """The series of a settled process a message changed again (None: the file has
        none): every row the file holds is sealed, the table's archive reads them."""
        row = self._db.execute(
            "SELECT s.id, ifnull(sum(c.n), 0) FROM series s LEFT JOIN chunks c"
            " ON c.series = s.id WHERE s.kind = ? AND s.key = ? GROUP BY s.id",
            (kind, key),
        ).fetchone()
        if row is None:
            return None
        sid, rows = int(row[0]), int(row[1])
        archive = table.archive if isinstance(table.archive, SeriesArchive) else None
        if archive is None and self.source is not None:  # made before it was settled
            stored = layout_dtypes(SERIES[kind][0])
            archive = SeriesArchive(self.source, sid, kind, stored, table.dtypes, live=True)
            table.set_archive(archive)
        if archive is not None:
            archive.sid = sid
            self._archives[(kind, key)] = archive
        layout, primary = SERIES[kind]
        st = _Series(sid, layout_dtypes(layout), primary, sm.SPECS.get(kind), table, archive)
        st.written = st.sealed = rows
        return st

    def _still_settled(self) -> set[int]:
        """Settled processes no message changed since; the others are written again."""
        processes = self.session.processes
        out = set()
        for pid, rev in list(self._settled.items()):
            proc = processes.get(pid)
            if proc is not None and proc.rev == rev:
                out.add(pid)
            else:
                del self._settled[pid]
                self._revive.add(pid)
        return out

    def _sync_series(self, final: bool, settled: set[int]) -> None:
        # A process that ended has its rows sealed now, whole: then it is settled.
        self._ending = {
            pid: p.rev
            for pid, p in list(self.session.processes.items())
            if (p.ended is not None or p.gone is not None) and pid not in settled
        }
        for kind, key, table in self.session.tables(skip=settled):
            st = self._series.get((kind, key))
            if st is None and kind in PROCESS_SERIES and int(key) in self._revive:
                st = self._revived(kind, key, table)
                if st is not None:
                    self._series[(kind, key)] = st
            if st is None:
                if len(table) == 0:
                    continue
                layout, primary = SERIES[kind]
                cur = self._db.execute(
                    "INSERT INTO series (kind, key, columns) VALUES (?, ?, ?)",
                    (kind, key, dumps([list(c) for c in layout])),
                )
                st = _Series(
                    int(cur.lastrowid or 0),
                    layout_dtypes(layout),
                    primary,
                    sm.SPECS.get(kind),
                    table,
                    self._archives.get((kind, key)),
                )
                self._series[(kind, key)] = st
            st.table = table
            whole = final or (kind in PROCESS_SERIES and int(key) in self._ending)
            if len(table) == st.written and not (whole and st.sealed < st.written):
                continue
            self._write_rows(st, table, whole)

    def _write_rows(self, st: _Series, table: Table, final: bool) -> None:
        n = len(table)
        off = st.sealed
        cols = table.rows(off, n)  # rows not sealed yet: still in memory
        t = cols[table.time]
        ends = [off + e for e in _codec.cut(t, 0, n - off, self.chunk_rows, self.chunk_span)]
        complete = ends if final else ends[:-1]
        if ends and not final:
            last_start = ends[-2] if len(ends) > 1 else st.sealed
            if ends[-1] - last_start >= self.chunk_rows:  # the last one is full too
                complete = ends
        if complete:
            # Replace the small chunks with sealed ones; what is left over after the last
            # complete chunk goes back in as one small chunk.
            self._db.execute(
                "DELETE FROM chunks WHERE series = ? AND row0 >= ?", (st.id, st.sealed)
            )
            start = st.sealed
            entries = []
            for end in complete:
                entries.append(self._insert(st, cols, off, start, end, sealed=True))
                start = end
            st.sealed = start
            self._sealed.append((st, entries))
            if start < n:
                self._insert(st, cols, off, start, n)
        elif n > st.written:
            self._insert(st, cols, off, st.written, n)
        self.rows_written += n - st.written
        st.written = n

    def _insert(
        self,
        st: _Series,
        cols: dict[str, np.ndarray],
        off: int,
        i: int,
        j: int,
        sealed: bool = False,
    ) -> _Entry:
        """Write rows ``[i, j)`` (``cols`` holds rows from ``off`` on) as one chunk (a
        sealed one with its summaries); returns its index entry and its own summary."""
        a, b = i - off, j - off
        t = cols[st.layout[0][0]]
        blob = _codec.encode(cols, st.layout, a, b)
        vmax, t_vmax = _codec.summary(t[a:b], cols[st.primary][a:b])
        self._db.execute(
            "INSERT INTO chunks (series, row0, n, t_first, t_last, vmax, t_vmax, codec, data)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (st.id, i, j - i, int(t[a]), int(t[b - 1]), vmax, t_vmax, _codec.CODEC, blob),
        )
        own = None
        if st.spec is not None and sealed:
            if not self._summaries:
                for statement in SUMMARIES_DDL.split(";"):
                    if statement.strip():
                        self._db.execute(statement)
                self._summaries = True
            part = {c: cols[c][a:b].copy() for c in st.spec.needs()}
            blocks = sm.summarise(st.spec, part)
            own = chunk_summary(st.spec, blocks)
            self._db.execute(
                "INSERT INTO summaries (series, row0, chunk, blocks) VALUES (?, ?, ?, ?)",
                (
                    st.id,
                    i,
                    sm.to_bytes(st.spec, own),
                    zlib.compress(sm.to_bytes(st.spec, blocks), 6),
                ),
            )
        none = np.iinfo(np.int64).min
        entry = (
            i,
            j - i,
            int(t[a]),
            int(t[b - 1]),
            none if vmax is None else vmax,
            none if t_vmax is None else t_vmax,
        )
        return entry, own

    def _sync_names(self) -> None:
        names = self.session.names
        start, stop = self._cursors["names"], len(names)
        if stop > start:
            self._db.executemany(
                "INSERT INTO names (id, name) VALUES (?, ?)",
                [(i, names[i]) for i in range(start, stop)],
            )
            self._cursors["names"] = stop

    def _sync_devices(self) -> None:
        for key, dev in list(self.session.devices.items()):
            body = dumps(dataclasses.asdict(dev))
            if self._changed(("device", key), body):
                self._db.execute(
                    "INSERT OR REPLACE INTO devices (key, body) VALUES (?, ?)", (key, body)
                )

    def _sync_processes(self, final: bool, settled: set[int]) -> None:
        s = self.session
        for pid, proc in list(s.processes.items()):
            if pid in settled:
                continue
            body = dumps(process_body(proc))
            if self._changed(("process", pid), body):
                self._db.execute(
                    "INSERT OR REPLACE INTO processes (pid, body) VALUES (?, ?)", (pid, body)
                )
            self._sync_open(pid, proc, final)
        # A changed description is a new dict (set_proc_info): one compared by identity
        # costs no JSON, however many processes were ever described.
        for pid, info in list(s.proc_info.items()):
            if self._infos.get(pid) is info:
                continue
            self._infos[pid] = info
            self._db.execute(
                "INSERT OR REPLACE INTO proc_info (pid, body) VALUES (?, ?)", (pid, dumps(info))
            )

    def _sync_open(self, pid: int, proc: Process, final: bool) -> None:
        """The open spans that began or ended since the last sync (all of them the first
        time, when too many changed, and at the last sync: their peaks as of now).

        A sync costs what changed, not what is open: a script that leaks spans keeps up
        to :data:`~gpuwatch.session.openspans.MAX_OPEN` of them open at every commit.
        """
        everything = final or pid not in self._open_known
        reset, spans = self.session.open_changes(proc, everything)
        bodies = [(sid, None if o is None else dumps(o)) for sid, o in spans]
        self._open_known.add(pid)
        db = self._db
        if reset:
            db.execute("DELETE FROM open_spans WHERE pid = ?", (pid,))
        else:
            gone = [(pid, sid) for sid, body in bodies if body is None]
            db.executemany("DELETE FROM open_spans WHERE pid = ? AND id = ?", gone)
        db.executemany(
            "INSERT OR REPLACE INTO open_spans (pid, id, body) VALUES (?, ?, ?)",
            [(pid, sid, body) for sid, body in bodies if body is not None],
        )

    def _sync_events(self) -> None:
        s = self.session
        rows: list[tuple[int, str, int | None, str]] = []
        while self._events:
            t, kind, pid, body = self._events.popleft()
            rows.append((t, kind, pid, dumps(body)))
        c = self._cursors
        gone, marks = s.retention.held_marks()  # they change together
        c["marks"] = max(c["marks"], gone)  # let go of before this file held them: lost
        for m in marks[c["marks"] - gone :]:
            rows.append(
                (m.t, "mark", m.pid, dumps({"text": m.text, "level": m.level, "step": m.step}))
            )
            c["marks"] += 1
        for o in s.ooms[c["ooms"] :]:
            rows.append((o.t, "oom", o.pid, dumps(o.body)))
            c["ooms"] += 1
        now = time.monotonic_ns()
        for text in s.notes[c["notes"] :]:
            rows.append((now, "note", None, dumps({"text": text})))
            c["notes"] += 1
        if rows:
            self._db.executemany(
                "INSERT INTO events (t, kind, pid, body) VALUES (?, ?, ?, ?)", rows
            )

    def _sync_misc(self) -> None:
        s = self.session
        rejects = dict(s.rejects)
        for reason, count in rejects.items():
            if self._changed(("reject", reason), count):
                self._db.execute(
                    "INSERT OR REPLACE INTO rejects (reason, count) VALUES (?, ?)",
                    (reason, count),
                )
        meta: dict[str, Any] = {}
        rates = dumps(dict(s.sampler_rate))
        if self._changed(("meta", "sampler_rate"), rates):
            meta["sampler_rate"] = rates
        label = self._label
        if label is not None and self._changed(("meta", "label"), label):
            meta["label"] = label
        if meta:
            self._set_meta(meta)


_NOTHING = object()


def _make_room(path: Path, overwrite: bool) -> None:
    """Remove what stands at ``path`` (and its WAL files) for a new recording.

    Raises:
        FileExistsError: Something is there and ``overwrite`` is false, or another
            gpuwatch is writing it.
    """
    if not (path.exists() or path.is_symlink()):
        return
    if not overwrite:
        raise FileExistsError(f"{path} already exists")
    from .recording import live_writer

    writer = live_writer(path)
    if writer is not None:
        raise FileExistsError(
            f"{path} is being written by another gpuwatch (pid {writer}); "
            "it is not overwritten even with --force"
        )
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(str(path) + suffix).unlink(missing_ok=True)


def _anchor(path: Path, identity: tuple[int, int]) -> int | None:
    """A descriptor of the file, to find it by after a rename (None where there is no
    ``/proc/self/fd`` to ask, or the path already holds another file)."""
    if not os.path.isdir("/proc/self/fd"):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != identity:
        os.close(fd)
        return None
    return fd


def _rollback(db: sqlite3.Connection) -> None:
    """Roll back the open transaction, if any.

    A failed COMMIT (disk full) may have rolled back already; the real error is the one to
    report, never "cannot rollback - no transaction is active".
    """
    if db.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")


def save_session(
    session: Session, path: str | os.PathLike[str], *, label: str = "", overwrite: bool = False
) -> Path:
    """Write a whole session to a new recording in one go (tests, benchmarks, conversions).

    Returns:
        The path written.
    """
    writer = SessionWriter(path, session, label=label, overwrite=overwrite)
    writer.close()
    return writer.path
