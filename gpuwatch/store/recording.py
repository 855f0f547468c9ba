"""An open recording: the file checked before anything trusts it, and read under one lock.

:func:`open_recording` checks the file and raises :class:`RecordingError` with a one-line
reason: missing, empty, truncated, corrupt, not SQLite, someone else's database, written by
a newer gpuwatch. :class:`Recording` holds the read-only connection and its metadata;
:meth:`Recording.reading` is the one way to read it (a lock and a transaction, errors as
:class:`RecordingError`), so the loader's thread and the app's can share it.
:func:`~gpuwatch.store.loader.open_session` hands the file to a
:class:`~gpuwatch.store.loader.Loader`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from . import _codec, _index, _untrusted
from ._schema import EXPECTED_TABLES, FORMAT, READ_TABLES, SCHEMA_VERSION, SQLITE_MAGIC

CLOCK_LIMIT = 1 << 62
"""Bound on the size of the clock figures in ``meta`` (ns; 146 years): any two add up
inside int64, so no sum of times overflows."""


def pid_alive(pid: int) -> bool:
    """True while a process of this pid exists on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RecordingError(Exception):
    """A file that cannot be read as a recording; ``str()`` is one line for the user."""


_CHECKERS = 4
"""Most threads :meth:`Recording.validate` checks chunks on (past a few, reading the
file is what takes the time)."""


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
        if _untrusted.timed_out(exc):
            raise RecordingError(
                f"{path} is damaged or hostile (reading it took over "
                f"{_untrusted.QUERY_SECONDS:.0f} s)"
            )
        raise RecordingError(f"{path} is damaged or not a recording ({_first_line(exc)})")
    except (ValueError, KeyError, TypeError) as exc:
        raise RecordingError(f"{path} is damaged (bad record: {_first_line(exc)})")
    except OverflowError as exc:  # a figure far outside int64
        raise RecordingError(f"{path} is damaged (a number out of range: {_first_line(exc)})")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _check_header(path: Path) -> bool:
    """Check the SQLite header against the file size; returns True if it is in WAL mode.

    Raises:
        RecordingError: Missing, empty, not SQLite, or shorter than its header says.
    """
    try:
        size, head = _untrusted.read_head(path, 100)
    except FileNotFoundError:
        raise RecordingError(f"no such file: {path}")
    except IsADirectoryError:
        raise RecordingError(f"{path} is a directory, not a recording")
    except _untrusted.NotRegular:
        raise RecordingError(f"{path} is not a regular file (a FIFO, device or socket)")
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
        with _as_recording_error(self.path):
            self.db = _untrusted.connect(self.path)  # read under _lock by any thread
        self._lock = threading.RLock()
        try:
            with _as_recording_error(self.path):
                self.meta = self._read_meta(wal)
        except BaseException:
            self.db.close()
            raise

    def _read_meta(self, wal: bool) -> dict[str, str]:
        kinds = {
            name: (kind, sql)
            for name, kind, sql in self.db.execute("SELECT name, type, sql FROM sqlite_master")
        }
        for name in sorted(READ_TABLES & kinds.keys()):
            # A VIEW (a recursive one never returns) or a virtual table named like one of
            # ours runs the file's own SQL when read: only plain tables are read.
            kind, sql = kinds[name]
            if kind != "table" or not str(sql).upper().startswith("CREATE TABLE"):
                raise RecordingError(f"{self.path} is damaged or hostile ({name} is not a table)")
        tables = {name for name, (kind, _) in kinds.items() if kind == "table"}
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
        clocks = {
            "t_origin": meta["t_origin"],
            "wall_offset": meta["wall_offset"],
            "created_wall_ns": meta.get("created_wall_ns") or "0",
        }
        for key, value in clocks.items():
            if abs(int(value)) >= CLOCK_LIMIT:
                raise RecordingError(f"{self.path} is damaged ({key} {value[:40]})")
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
        return pid > 0 and pid_alive(pid)

    @contextlib.contextmanager
    def reading(self, transaction: bool = False) -> Iterator[sqlite3.Connection]:
        """The connection, for reads under this recording's lock (any thread).

        Args:
            transaction: Read in one transaction: one consistent view of a file that
                another gpuwatch is still writing.

        Raises:
            RecordingError: SQLite, a chunk or a record could not be read.
        """
        with self._lock, _as_recording_error(self.path):
            if not transaction:
                yield self.db
                return
            self.db.execute("BEGIN")
            try:
                yield self.db
            finally:
                self.db.execute("COMMIT")

    def refresh_meta(self) -> None:
        """Re-read ``meta`` (a followed file gains ``complete`` when its writer closes)."""
        with self.reading() as db:
            self.meta = dict(db.execute("SELECT key, value FROM meta").fetchall())

    def events(self, kinds: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        """Point events in order: ``{seq, t, kind, pid, body}`` (hello, mark, oom, ...)."""
        with self.reading() as db:
            rows = db.execute("SELECT seq, t, kind, pid, body FROM events ORDER BY seq")
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

    def validate(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Inflate every chunk once (none is kept): a damaged one raises here.

        Chunks are checked on a few threads while this one reads the next from the file
        (zlib lets go of the interpreter while it inflates, so the threads overlap); the
        first damaged chunk in the file's order is the one reported, and at most a few
        chunks are held at once.

        Args:
            progress: Called now and then with ``(chunks checked, chunks in the file)``.

        Raises:
            RecordingError: A chunk does not decode to the rows its index promises, or
                the index memo differs from the index.
        """
        from ._schema import layout_dtypes

        with self.reading() as db:
            if not _index.memo_agrees(db):
                raise RecordingError(f"{self.path} is damaged (its index memo)")
            layouts = {
                sid: layout_dtypes(tuple(tuple(c) for c in json.loads(columns)))
                for sid, columns in db.execute("SELECT id, columns FROM series")
            }
            total = self.chunk_count() if progress else 0
            rows = db.execute("SELECT series, n, codec, data FROM chunks")
            workers = min(_CHECKERS, os.cpu_count() or 1)
            with ThreadPoolExecutor(workers, thread_name_prefix="gpuwatch-check") as pool:
                checking: deque[Future[None]] = deque()
                for i, (sid, n, codec, blob) in enumerate(rows):
                    if progress is not None and i % 256 == 0:
                        progress(i, total)
                    layout = layouts.get(sid)
                    if layout is None:
                        raise RecordingError(f"{self.path} is damaged (a chunk of no series)")
                    checking.append(pool.submit(_codec.check, blob, n, layout, codec))
                    if len(checking) > 4 * workers:
                        checking.popleft().result()
                while checking:
                    checking.popleft().result()

    def chunk_count(self) -> int:
        """How many chunks the file holds (0 where it cannot say)."""
        try:
            with self.reading() as db:
                return int(db.execute("SELECT count(*) FROM chunks").fetchone()[0])
        except RecordingError:
            return 0

    def close(self) -> None:
        with self._lock:
            self.db.close()
