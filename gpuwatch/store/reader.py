"""Reading a recording: validation, the session's small facts, and its samples by chunk.

:func:`open_recording` checks the file before anything trusts it and raises
:class:`RecordingError` with a one-line reason. :meth:`Recording.open_session` builds a
replay :class:`~gpuwatch.session.Session` holding the small facts (devices, processes,
marks, OOMs...) and returns a :class:`Loader` that appends the sample chunks in time order,
so the first frame needs only the first chunks; the loader then follows the file while
another gpuwatch still writes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import json
import os
import socket
import sqlite3
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import protocol
from ..session import Device, Mark, Oom, OpenSpan, Process, Session, Table
from ..session.table import MISSING_INT
from . import _bodies, _codec
from ._schema import (
    EXPECTED_TABLES,
    FORMAT,
    SCHEMA_VERSION,
    SERIES,
    SQLITE_MAGIC,
)

FOLLOW_INTERVAL = 0.5
"""Seconds between looks at a file that is still being written."""


class RecordingError(Exception):
    """A file that cannot be read as a recording; ``str()`` is one line for the user."""


@contextlib.contextmanager
def _as_recording_error(path: Path) -> Iterator[None]:
    """Turn SQLite and chunk errors into :class:`RecordingError` naming the file."""
    try:
        yield
    except RecordingError:
        raise
    except _codec.ChunkError as exc:
        raise RecordingError(f"{path} is damaged ({exc})")
    except sqlite3.DatabaseError as exc:
        raise RecordingError(f"{path} is damaged or not a recording ({_first_line(exc)})")
    except (ValueError, KeyError, TypeError) as exc:
        raise RecordingError(f"{path} is damaged (bad record: {_first_line(exc)})")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _check_header(path: Path) -> bool:
    """Check the SQLite header against the file size; returns True if it is in WAL mode.

    Raises:
        RecordingError: Missing, empty, not SQLite, or shorter than its header says.
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(100)
    except FileNotFoundError:
        raise RecordingError(f"no such file: {path}")
    except IsADirectoryError:
        raise RecordingError(f"{path} is a directory, not a recording")
    except OSError as exc:
        raise RecordingError(f"cannot read {path}: {exc.strerror or exc}")
    if size == 0:
        raise RecordingError(f"{path} is empty")
    if not head.startswith(SQLITE_MAGIC):
        if SQLITE_MAGIC.startswith(head[: len(SQLITE_MAGIC)]) and len(head) < 100:
            raise RecordingError(f"{path} is truncated ({size} bytes)")
        raise RecordingError(f"{path} is not a gpuwatch recording (not an SQLite database)")
    if len(head) < 100:
        raise RecordingError(f"{path} is truncated ({size} bytes)")
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1):
        raise RecordingError(f"{path} is damaged (bad page size {page_size})")
    wal = head[18] == 2
    if wal and _has_wal(path):
        # Pages not yet copied back (a crash, a full disk) live in the -wal file, which
        # SQLite reads first: the main file's size says nothing; SQLite is the judge.
        return wal
    pages = int.from_bytes(head[28:32], "big")
    # The header's page count is only valid when its two change counters agree.
    if head[24:28] == head[92:96] and pages and size < pages * page_size:
        raise RecordingError(f"{path} is truncated ({size} of {pages * page_size} bytes are there)")
    if size % page_size:
        raise RecordingError(f"{path} is truncated ({size} bytes, not whole pages)")
    return wal


def _has_wal(path: Path) -> bool:
    try:
        return os.path.getsize(str(path) + "-wal") > 0
    except OSError:
        return False


def open_recording(path: str | os.PathLike[str]) -> Recording:
    """Open and validate a recording.

    Raises:
        RecordingError: Empty, truncated, corrupt, not SQLite, someone else's database, or
            written by a newer gpuwatch.
    """
    return Recording(path)


def live_writer(path: str | os.PathLike[str]) -> int | None:
    """The pid of the gpuwatch still writing the recording at ``path``, or None.

    None too when ``path`` is not a readable recording (nothing to protect there).
    """
    try:
        rec = open_recording(path)
    except RecordingError:
        return None
    try:
        return int(rec.meta.get("writer_pid", "0")) if rec.writer_alive() else None
    except ValueError:
        return None
    finally:
        rec.close()


class Recording:
    """An open, validated recording (read-only).

    Attributes:
        path: The file.
        meta: ``meta`` table as strings (format, schema, host, label, t_origin, ...).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        wal = _check_header(self.path)
        # The path's bytes, quoted: a file name that is not UTF-8 must open too.
        uri = "file:" + urllib.parse.quote(os.fsencode(self.path.resolve())) + "?mode=ro"
        with _as_recording_error(self.path):
            # check_same_thread=False: the loader thread reads too, always under _lock.
            self.db = sqlite3.connect(uri, uri=True, check_same_thread=False)
        self._lock = threading.RLock()
        try:
            with _as_recording_error(self.path):
                self.meta = self._read_meta(wal)
        except BaseException:
            self.db.close()
            raise

    def _read_meta(self, wal: bool) -> dict[str, str]:
        tables = {
            row[0] for row in self.db.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        if "meta" not in tables:
            if not tables and wal:
                raise RecordingError(f"{self.path} holds no tables (copied without its -wal file?)")
            raise RecordingError(f"{self.path} is an SQLite database but not a gpuwatch recording")
        meta = dict(self.db.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("format") != FORMAT:
            raise RecordingError(f"{self.path} is an SQLite database but not a gpuwatch recording")
        try:
            schema = int(meta.get("schema", ""))
        except ValueError:
            raise RecordingError(f"{self.path} is damaged (schema {meta.get('schema')!r})")
        if schema > SCHEMA_VERSION:
            raise RecordingError(
                f"{self.path} was written by a newer gpuwatch (recording schema {schema}; "
                f"this gpuwatch reads up to {SCHEMA_VERSION}): upgrade gpuwatch"
            )
        if schema < 1:
            raise RecordingError(f"{self.path} is damaged (schema {schema})")
        missing = EXPECTED_TABLES - tables
        if missing:
            raise RecordingError(f"{self.path} is damaged (no {', '.join(sorted(missing))})")
        for key in ("t_origin", "wall_offset"):
            int(meta[key])
        return meta

    # ------------------------------------------------------------------ facts

    @property
    def label(self) -> str:
        return self.meta.get("label", "")

    @property
    def complete(self) -> bool:
        """True once the writer closed the file cleanly."""
        return self.meta.get("complete") == "1"

    def writer_alive(self) -> bool:
        """True when the file is unfinished and its writer still runs on this host."""
        if self.complete or self.meta.get("host") != socket.gethostname():
            return False
        try:
            pid = int(self.meta.get("writer_pid", "0"))
        except ValueError:
            return False
        if pid <= 0:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def refresh_meta(self) -> None:
        """Re-read ``meta`` (a followed file gains ``complete`` when its writer closes)."""
        with self._lock, _as_recording_error(self.path):
            self.meta = dict(self.db.execute("SELECT key, value FROM meta").fetchall())

    def events(self, kinds: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        """Point events in order: ``{seq, t, kind, pid, body}`` (hello, mark, oom, ...)."""
        with self._lock, _as_recording_error(self.path):
            rows = self.db.execute("SELECT seq, t, kind, pid, body FROM events ORDER BY seq")
            out = [
                {"seq": seq, "t": t, "kind": kind, "pid": pid, "body": json.loads(body)}
                for seq, t, kind, pid, body in rows
                if kinds is None or kind in kinds
            ]
        return out

    def file_size(self) -> int:
        """Bytes on disk, the WAL included."""
        total = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                total += os.path.getsize(str(self.path) + suffix)
        return total

    def open_session(self) -> tuple[Session, Loader]:
        """A replay session holding the small facts, and the loader of its samples.

        Nothing is loaded into the tables yet: call :meth:`Loader.load_until` for what the
        first frame needs, then :meth:`Loader.start` (or :meth:`Loader.load_all`).

        Raises:
            RecordingError: The facts cannot be read.
        """
        session = Session(int(self.meta["t_origin"]), int(self.meta["wall_offset"]))
        session.live = False
        loader = Loader(self, session)
        loader.refresh()
        return session, loader

    def close(self) -> None:
        with self._lock:
            self.db.close()


def load(path: str | os.PathLike[str]) -> Session:
    """Open a recording and load all of it (``info``, ``export``, tests).

    Raises:
        RecordingError: Any problem with the file, including a damaged chunk.
    """
    rec = open_recording(path)
    try:
        session, loader = rec.open_session()
        loader.load_all(strict=True)
        return session
    finally:
        rec.close()


# --------------------------------------------------------------------------- loading


@dataclass
class _Feed:
    """One series being appended to its session table."""

    id: int
    kind: str
    key: str
    table: Table
    stored: list[tuple[str, np.dtype]]  # the layout the file has
    limit: int = 0  # rows the file held at the last refresh
    loaded: int = 0
    # The chunk index as of the last refresh (ordered by row0).
    row0: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    t_first: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    t_last: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    vmax: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    t_vmax: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def next_time(self) -> int:
        """The index's first time of the chunk holding the next row to load."""
        i = int(np.searchsorted(self.row0, self.loaded, "right")) - 1
        return int(self.t_first[max(i, 0)])


class Loader:
    """Fills a replay session from its recording, chunk by chunk in time order.

    Tables only grow in time order, so chunks of all series are appended by their first
    time: at any moment everything up to :attr:`loaded_until` is in the session. A file
    whose writer still runs is followed: new rows, processes and events appear as written.

    Attributes:
        error: Why loading stopped early (a damaged chunk), or None.
    """

    def __init__(self, recording: Recording, session: Session) -> None:
        self.recording = recording
        self.session = session
        self.error: str | None = None
        self.following = False
        self._feeds: dict[int, _Feed] = {}
        self._heap: list[tuple[int, int]] = []
        self._cache: dict[tuple[str, Any], str] = {}
        self._event_seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = recording._lock
        self.loaded_until = session.t_origin
        self._bounds = (session.t_origin, session.t_origin)

    # ------------------------------------------------------------------ facts

    def refresh(self) -> None:
        """Read what changed in the file: facts, new series and the chunk index."""
        rec = self.recording
        with self._lock, _as_recording_error(rec.path):
            db = rec.db
            db.execute("BEGIN")
            try:
                self._read_facts(db)
                self._read_index(db)
            finally:
                db.execute("COMMIT")
            self._drop_stray_events()
            self._bounds = self._compute_bounds()
            self._rebuild_heap()

    def _changed(self, key: tuple[str, Any], body: str) -> bool:
        if self._cache.get(key) == body:
            return False
        self._cache[key] = body
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
                self._apply_device(_bodies.device(str(key), json.loads(body)))
        for pid, body in db.execute("SELECT pid, body FROM processes"):
            if self._changed(("process", pid), body):
                self._apply_process(pid, _bodies.process_state(json.loads(body)))
        spans: dict[int, dict[int, OpenSpan]] = {}
        for pid, _, body in db.execute("SELECT pid, id, body FROM open_spans"):
            span = _bodies.open_span(json.loads(body))
            if span is not None:
                spans.setdefault(pid, {})[span.id] = span
        for pid, proc in s.processes.items():
            proc.open = spans.get(pid, {})
        for pid, body in db.execute("SELECT pid, body FROM proc_info"):
            s.proc_info[pid] = _bodies.proc_info(json.loads(body))
        for reason, count in db.execute("SELECT reason, count FROM rejects"):
            if isinstance(reason, str) and type(count) is int:
                s.rejects[reason] = count
        for seq, t, kind, pid, body in db.execute(
            "SELECT seq, t, kind, pid, body FROM events WHERE seq > ? ORDER BY seq",
            (self._event_seq,),
        ):
            self._event_seq = seq
            clean = _bodies.event(kind, json.loads(body))
            if clean is not None and type(t) is int:
                self._apply_event(t, kind, pid if type(pid) is int else None, clean)
        rates = db.execute("SELECT value FROM meta WHERE key = 'sampler_rate'").fetchone()
        if rates:
            loaded = json.loads(rates[0])
            if isinstance(loaded, dict):
                s.sampler_rate.update(
                    {k: v for k, v in loaded.items() if isinstance(v, (int, float))}
                )
        s.touch()

    def _apply_device(self, new: Device) -> None:
        s = self.session
        dev = s.devices.get(new.key)
        if dev is None:
            s.add_device(new)
        else:
            for f in dataclasses.fields(Device):
                setattr(dev, f.name, getattr(new, f.name))

    def _apply_process(self, pid: int, state: dict[str, Any]) -> None:
        proc = self._process(pid)
        for name, value in state.items():
            setattr(proc, name, value)

    def _process(self, pid: int) -> Process:
        proc = self.session.processes.get(pid)
        if proc is None:
            proc = self.session.processes[pid] = Process(pid)
        return proc

    def _apply_event(self, t: int, kind: str, pid: int | None, body: dict[str, Any]) -> None:
        s = self.session
        if kind == "mark":
            s.marks.append(
                Mark(t, pid or 0, body["text"], body.get("level") or "info", body.get("step"))
            )
        elif kind == "oom":
            s.ooms.append(Oom(t, pid or 0, body))
        elif kind == "note" and body.get("text") not in s.notes:
            s.notes.append(body["text"])

    def _read_index(self, db: sqlite3.Connection) -> None:
        series = db.execute("SELECT id, kind, key, columns FROM series").fetchall()
        rows = db.execute(
            "SELECT series, row0, n, t_first, t_last, vmax, t_vmax FROM chunks"
            " ORDER BY series, row0"
        ).fetchall()
        index: dict[int, np.ndarray] = {}
        if rows:
            a = np.array([[_NONE if v is None else v for v in r] for r in rows], dtype=np.int64)
            for part in np.split(a, np.flatnonzero(np.diff(a[:, 0])) + 1):
                index[int(part[0, 0])] = part
        for sid, kind, key, columns in series:
            part = index.get(sid)
            if part is None or kind not in SERIES:  # no rows yet, or a newer kind
                continue
            feed = self._feeds.get(sid)
            if feed is None:
                total = int(part[-1, 1] + part[-1, 2])
                feed = self._feeds[sid] = self._new_feed(sid, kind, key, columns, total)
            feed.row0, feed.t_first, feed.t_last = part[:, 1], part[:, 3], part[:, 4]
            vmax = part[:, 5].astype(np.float64)
            vmax[part[:, 5] == _NONE] = np.nan
            feed.vmax, feed.t_vmax = vmax, part[:, 6]
            feed.limit = int(part[-1, 1] + part[-1, 2])

    def _new_feed(self, sid: int, kind: str, key: str, columns: str, rows: int) -> _Feed:
        layout, _ = SERIES[kind]
        table = Table(layout, capacity=rows)  # sized once: appends never copy
        s = self.session
        if kind in ("gpu", "gpu_procs"):
            if key not in s.devices:
                s.add_device(Device(key, "gpu", source="recording"))
            getattr(s, kind)[key] = table
        elif kind == "host":
            s.host = table
        else:
            setattr(self._process(int(key)), kind, table)
        stored = [(name, np.dtype(code)) for name, code in json.loads(columns)]
        return _Feed(sid, kind, key, table, stored)

    def _rebuild_heap(self) -> None:
        self._heap = [
            (feed.next_time(), sid) for sid, feed in self._feeds.items() if feed.loaded < feed.limit
        ]
        heapq.heapify(self._heap)
        self._update_frontier()

    def _update_frontier(self) -> None:
        if self._heap:
            self.loaded_until = self._heap[0][0] - 1
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
        firsts = [int(f.t_first[0]) for f in self._feeds.values() if len(f.t_first)]
        lasts = [int(f.t_last[-1]) for f in self._feeds.values() if len(f.t_last)]
        if not firsts:
            return
        lo, hi = min(firsts) - protocol.PAST_NS, max(lasts) + protocol.PAST_NS
        s = self.session
        dropped = 0
        for events in (s.marks, s.ooms):
            keep = [e for e in events if lo <= e.t <= hi]
            dropped += len(events) - len(keep)
            events[:] = keep
        if dropped:
            s.note(f"left out {dropped} marks or OOMs timed far outside the recording")

    def _compute_bounds(self) -> tuple[int, int]:
        s = self.session
        firsts = [int(f.t_first[0]) for f in self._feeds.values() if len(f.t_first)]
        lasts = [int(f.t_last[-1]) for f in self._feeds.values() if len(f.t_last)]
        for e in (*s.marks, *s.ooms):
            firsts.append(e.t)
            lasts.append(e.t)
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
            if feed.kind != kind or not len(feed.vmax) or np.isnan(feed.vmax).all():
                continue
            i = int(np.nanargmax(feed.vmax))
            v = int(feed.vmax[i])
            if best is None or v > best[0]:
                best = (v, int(feed.t_vmax[i]), feed.key)
        return best

    # ------------------------------------------------------------------ loading

    @property
    def done(self) -> bool:
        """Everything the file held at the last refresh is in the session."""
        return not self._heap

    def step(self) -> bool:
        """Append the next chunk in time order; False when nothing is left to load."""
        with self._lock:
            if not self._heap:
                return False
            _, sid = heapq.heappop(self._heap)
            feed = self._feeds[sid]
            self._load_next(feed)
            if feed.loaded < feed.limit:
                heapq.heappush(self._heap, (feed.next_time(), sid))
            self._update_frontier()
            self.session.touch()
            return True

    def _load_next(self, feed: _Feed) -> None:
        db = self.recording.db
        with _as_recording_error(self.recording.path):
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
                dtype = table.dtypes[name]
                col = np.full(count, np.nan if dtype.kind == "f" else MISSING_INT, dtype=dtype)
            out[name] = col
        if feed.kind == "phases" and int(out["name"].max()) >= len(self.session.names):
            raise RecordingError(f"{self.recording.path} is damaged (unknown phase name)")
        if feed.kind == "phases":
            proc = self._process(int(feed.key))
            proc.max_span = max(proc.max_span, int((out["t1"] - out["t0"]).max()))
        elif feed.kind == "peaks":
            proc = self._process(int(feed.key))
            proc.max_segment = max(proc.max_segment, int((out["t1"] - out["t0"]).max()))
        table.extend(out)

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


_NONE = np.iinfo(np.int64).min
