"""The recorder: a session subscriber that writes it to a recording from its own thread.

Samplers never wait for the disk: the listener the session calls on their threads only
queues the rare facts the session does not keep (each hello, facts and bye message, device
state changes); everything else is read from the session's append-only tables once a
second, in one transaction, on the recorder's thread.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import sqlite3
import threading
import time
from pathlib import Path

from ..protocol import Message
from ..session import Session
from ..session.ports import DeviceChanged, SessionEvent
from . import _heap
from .writer import FileRemoved, SessionWriter

TRIM_SETTLED = 512
"""Processes settled (their memory let go of) between two returns of the heap's free
pages to the system (see :mod:`._heap`)."""

WAKE_MARKS = 2048
"""Marks that wake the writer before its interval is up: a flood of marks (10k of 1 KiB a
second) otherwise waits a whole interval in memory, twice (the session's list and the
rows of one sync), which sets the recording's peak memory."""

WAKE_BYES = 128
"""Processes ending that wake the writer before its interval is up: a gpuwatch catching
up on a backlog ingests hundreds of short-lived processes a second, and each keeps its
whole tables until written and settled; memory freed in large batches stays fragmented,
so they are freed in small ones."""

_WAKE_AFTER = {"mark": WAKE_MARKS, "bye": WAKE_BYES}
"""Messages of a kind, counted since the writer was last woken for them, that wake it."""

_ERRNO_CAUSES = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EIO: "I/O error",
    errno.EFBIG: "file too large",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOENT: "file removed",
}
_SQLITE_CAUSES = (  # (words in SQLite's message, the cause), for Pythons before 3.11
    ("disk is full", "disk full"),
    ("disk i/o error", "I/O error"),
    ("readonly", "read-only file system"),
    ("read-only", "read-only file system"),
    ("unable to open", "file removed or unreadable"),
)

_LOGGED = frozenset(("hello", "facts", "bye"))


def write_failure(exc: BaseException) -> str:
    """``"disk full: database or disk is full"``: why a write failed, cause first."""
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, FileRemoved):
        return text
    if isinstance(exc, OSError) and exc.errno in _ERRNO_CAUSES:
        return f"{_ERRNO_CAUSES[exc.errno]}: {exc.strerror or text}"
    if isinstance(exc, sqlite3.Error):
        lowered = text.lower()
        for words, cause in _SQLITE_CAUSES:
            if words in lowered:
                return f"{cause}: {text}"
    return text


"""Message kinds kept as events: the session keeps only the latest hello and facts."""


class Recorder:
    """Records a session into a new file, committing about once a second.

    A process killed at any moment leaves a file that opens, holding everything up to the
    last commit (WAL mode: a commit is one append to the ``-wal`` file).

    Args:
        session: What to record (subscribe before the sources start, to miss nothing).
        path: The file to create.
        label: ``meta.label``, e.g. "CPU recording of samples/train_tiny_gpt.py".
        interval: Seconds between commits.
        overwrite: Replace an existing file.

    Raises:
        FileExistsError, OSError, sqlite3.Error: The file cannot be created.
    """

    def __init__(
        self,
        session: Session,
        path: str | os.PathLike[str],
        *,
        label: str = "",
        interval: float = 1.0,
        overwrite: bool = False,
    ) -> None:
        self.session = session
        self.interval = interval
        self.writer = SessionWriter(path, session, label=label, overwrite=overwrite)
        self.error: str | None = None
        self.cause: str | None = None  # the error's cause alone ("disk full")
        self.notice: str | None = None  # a line to tell the user once (see take_notice)
        self.syncs = 0
        self.cpu_seconds = 0.0  # CPU time of the recorder thread (benchmarks report it)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._synced = threading.Condition()
        self._thread: threading.Thread | None = None
        self._active = False
        self._trimmed_at = 0  # processes settled at the last trim
        self._since_wake = dict.fromkeys(_WAKE_AFTER, 0)  # by kind, see _WAKE_AFTER

    @property
    def path(self) -> Path:
        return self.writer.path

    @property
    def rows_written(self) -> int:
        return self.writer.rows_written

    def start(self) -> None:
        """Subscribe to the session and start the writing thread."""
        self._active = True
        self.session.subscribe(self._listen)
        # Hellos that arrived before the recorder did: keep them as events too.
        for pid, proc in list(self.session.processes.items()):
            if proc.hello:
                self.writer.add_event(proc.first_t, "hello", pid, dict(proc.hello))
        self._thread = threading.Thread(target=self._run, name="gpuwatch-recorder", daemon=True)
        self._thread.start()

    def _listen(self, event: SessionEvent) -> None:
        # Called on sampler and receiver threads for every fact: stay cheap.
        if not self._active:
            return
        if type(event) is Message:
            msg = event
            if msg.kind in _LOGGED:
                self.writer.add_event(msg.t, msg.kind, msg.pid, msg.body)
            limit = _WAKE_AFTER.get(msg.kind)
            if limit is not None:
                count = self._since_wake[msg.kind] + 1
                if count >= limit:
                    count = 0
                    self._wake.set()
                self._since_wake[msg.kind] = count
        elif type(event) is DeviceChanged:
            body = dataclasses.asdict(event.device)
            self.writer.add_event(time.monotonic_ns(), "device", None, body)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            if not self._sync(final=False):
                return

    def _sync(self, final: bool) -> bool:
        start = time.thread_time()
        try:
            self.writer.sync(final=final)
        except Exception as exc:  # disk full, file removed...: say so, never crash the app
            error = self._failed(exc)
            self._active = False
            self.session.note(error)
            # Rows wait in memory for the file no more: they go into the session's
            # summaries instead, so memory stays bounded.
            self.writer.freeze()
            return False
        finally:
            self.cpu_seconds += time.thread_time() - start
            with self._synced:
                self.syncs += 1
                self._synced.notify_all()
        settled = len(self.writer._settled)
        if settled - self._trimmed_at >= TRIM_SETTLED:
            self._trimmed_at = settled
            _heap.trim()
        moved, self.writer.moved = self.writer.moved, None
        if moved is not None:
            self.notice = f"the recording was renamed: writing on to {moved}"
            self.session.note(self.notice)
        return True

    def take_notice(self) -> str | None:
        """What the user should be told once (a rename followed), or None."""
        notice, self.notice = self.notice, None
        return notice

    def _failed(self, exc: BaseException) -> str:
        why = write_failure(exc)
        self.cause = why.split(":", 1)[0]
        self.error = f"recording stopped: {why} ({self.path})"
        return self.error

    def flush(self, timeout: float = 5.0) -> bool:
        """Commit now (on the recorder thread) and wait for it; False on timeout."""
        with self._synced:
            target = self.syncs + 1
            self._wake.set()
            return self._synced.wait_for(lambda: self.syncs >= target, timeout)

    def close(self) -> None:
        """Write what is left, mark the file complete and close it."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        failed = self.error is not None
        self._active = False
        if failed:
            try:
                self.writer.close(complete=False)
            except Exception:
                pass
            return
        start = time.thread_time()
        try:
            self.writer.close()
        except Exception as exc:
            self._failed(exc)
        self.cpu_seconds += time.thread_time() - start
