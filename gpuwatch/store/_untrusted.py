"""Opening a file that may be hostile: regular files only, and a time limit on every query.

A recording can come from anywhere. A FIFO named ``x.gpuwatch`` would block ``open()``
forever; a VIEW (a recursive one never returns) or anything else that makes SQLite work
without end would hang ``info`` or ``replay``. The reader checks its tables are tables
(:mod:`gpuwatch.store.recording`); here every statement on a file's connection gets
:data:`QUERY_SECONDS` before SQLite is told to give up (its progress handler), as a
backstop for whatever else a file could make it do.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..session.table import MISSING_INT

QUERY_SECONDS = 10.0
"""Most seconds SQLite may work on one statement before a row, or a batch of rows (an
honest one takes milliseconds)."""

_STEPS = 100_000
"""SQLite virtual-machine steps between looks at the clock (a few ms of work): each look
takes the interpreter lock, which a busy thread may hold for its 5 ms switch interval,
so an honest query (a chunk by its index: far fewer steps) never looks."""

_BATCH = 256
"""Rows fetched under one time limit while a cursor is iterated."""

INTERRUPTED = "interrupted"
"""SQLite's message for a statement its progress handler stopped."""


class NotRegular(OSError):
    """The path is not a regular file (a FIFO, a device, a socket)."""


def read_head(path: Path, size: int) -> tuple[int, bytes]:
    """``(file size, its first size bytes)``, never blocking on a FIFO or a device.

    Raises:
        NotRegular: A directory, FIFO, device or socket.
        OSError: The file cannot be opened or read.
    """
    # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(f"{path} is not a regular file")
        return st.st_size, os.read(fd, size)
    finally:
        os.close(fd)


class _Cursor(sqlite3.Cursor):
    """Rows read by iteration, a batch at a time, each batch with a fresh time limit: the
    caller's own work between rows (an honest file with a million events) never counts.
    Batches, not a limit a row: a Python call per row would double the cost of a walk."""

    # typeshed types a cursor as its own iterator; this one yields from batches instead.
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        connection = self.connection
        while True:
            connection.arm()  # type: ignore[attr-defined]
            rows = self.fetchmany(_BATCH)
            if not rows:
                return
            yield from rows


class Guarded(sqlite3.Connection):
    """A connection whose statements may each run :data:`QUERY_SECONDS` at most.

    The limit runs from :meth:`execute` to its first row, and from the request of each
    further batch of rows (iterating the cursor) to that batch: only SQLite's work counts.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limit = QUERY_SECONDS
        self.deadline = time.monotonic() + self.limit
        self.set_progress_handler(self._past_deadline, _STEPS)

    def _past_deadline(self) -> int:
        return int(time.monotonic() > self.deadline)

    def arm(self) -> None:
        """Give the statement running now a fresh :attr:`limit`."""
        self.deadline = time.monotonic() + self.limit

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        self.arm()
        cursor = self.cursor(_Cursor)
        cursor.execute(sql, parameters)
        return cursor


def connect(path: Path) -> Guarded:
    """A read-only, time-limited connection to the recording at ``path``.

    Raises:
        sqlite3.Error: SQLite cannot open it.
    """
    # The path's bytes, quoted: a file name that is not UTF-8 must open too.
    uri = "file:" + urllib.parse.quote(os.fsencode(path.resolve())) + "?mode=ro"
    # check_same_thread=False: the loader thread reads too, always under its owner's lock.
    db = sqlite3.connect(uri, uri=True, check_same_thread=False, factory=Guarded)
    assert isinstance(db, Guarded)
    return db


def timed_out(exc: BaseException) -> bool:
    """True for the error of a statement stopped by the time limit."""
    return isinstance(exc, sqlite3.OperationalError) and INTERRUPTED in str(exc).lower()


COUNTS = frozenset(
    (
        "used",
        "free",
        "total",
        "reserved",
        "available",
        "allocated",
        "inactive_split",
        "alloc_retries",
        "alloc_ooms",
        "peak_allocated",
        "peak_reserved",
        "rss",
        "alloc0",
        "reserved0",
        "alloc1",
        "reserved1",
        "peak_alloc",
    )
)
"""Columns of byte (or event) counts: never negative in an honest file."""


def counts_checked(name: str, col: np.ndarray) -> np.ndarray:
    """``col`` with a negative count read as unknown (:data:`MISSING_INT`).

    A file's numbers are its author's word: a count below zero (a hostile file, or one
    whose bytes were damaged and still inflate) would be drawn and printed as a figure
    such as ``-8589934592.00 GiB``. Other columns, and honest ones, come back as they are.
    """
    if name not in COUNTS or col.dtype.kind != "i" or not len(col) or col.min() >= 0:
        return col
    bad = (col < 0) & (col != MISSING_INT)
    if not bad.any():
        return col
    return np.where(bad, np.array(MISSING_INT, dtype=col.dtype), col)
