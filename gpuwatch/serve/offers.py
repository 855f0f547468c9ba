"""What ``gpuwatch serve`` offers: named recordings, the sessions directory, the live session.

Every file a visitor can replay is decided here, never by joining a URL to a path: the
files named on the command line, the regular files directly in the sessions directory
(found by listing it; a symbolic link there is skipped), and the recording the live
gpuwatch names in its lock file. A URL names one of these by a key looked up in that list.

Browsing costs nothing: a ``gpuwatch record`` is started only when a visitor opens the
live session while no gpuwatch runs, never to show the index.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from ..fmt import printable

LIVE = "live"
"""The key of the live session."""
SUFFIX = ".gpuwatch"
NAME_MAX = 255


def listable(name: str) -> bool:
    """Whether a file name of the sessions directory is offered: any ``NAME.gpuwatch`` a
    recording may be called (spaces, accents, ``+`` and all), not hidden, in UTF-8."""
    if not name.endswith(SUFFIX) or name.startswith(".") or "/" in name or "\0" in name:
        return False
    try:
        return len(name.encode("utf-8")) <= NAME_MAX
    except UnicodeEncodeError:  # a name that is not UTF-8 (surrogate escapes): no URL names it
        return False


def link(name: str) -> str:
    """The path (below the server's prefix) that opens the listed recording ``name``."""
    return "/r/" + quote(name, safe="")


LISTED_MAX = 500
"""Most recordings the index lists (the newest): each costs a summary."""
START_WAIT = 15.0
"""Seconds a started ``gpuwatch record`` has to name its recording in its lock file."""


class OfferError(Exception):
    """The live session cannot be served (one line for the user)."""


@dataclass(frozen=True)
class Offer:
    """One thing a visitor can open.

    Attributes:
        key: How URLs name it: ``""`` (the files on the command line), ``live``, or a
            file name in the sessions directory.
        title: The page's title (printable).
        files: What each visitor's ``gpuwatch replay`` opens.
    """

    key: str
    title: str
    files: tuple[str, ...]


def _valid_recording_path(text: str | None) -> Path | None:
    """The live gpuwatch's recording from its lock file: a plain absolute regular file."""
    if not text or not text.startswith("/") or len(text) > 4096 or not text.isprintable():
        return None
    path = Path(text)
    try:
        if path.is_symlink() or not path.is_file():
            return None
    except OSError:
        return None
    return path


class Live:
    """The live session of this machine, served as the replay of its growing recording.

    Only one process owns the annotation socket, so a visitor never gets a dashboard of its
    own: it replays the file the owning gpuwatch (``gpuwatch`` or ``gpuwatch record``)
    names in its lock file, following the tail. Where no gpuwatch owns the socket when a
    visitor opens it, :meth:`open` starts ``gpuwatch record`` into the sessions directory.

    Args:
        socket_path: The annotation socket whose owner is watched.
    """

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.started: subprocess.Popen[bytes] | None = None
        self._last: Path | None = None
        self._log: tempfile._TemporaryFileWrapper[bytes] | None = None
        self._lock = threading.Lock()  # two visitors at once start one recorder

    def owner(self) -> tuple[int, Path | None] | None:
        """``(pid, recording)`` of the live gpuwatch owning the socket, or None."""
        from ..sources.annotations import lock_owner
        from ..store.recording import pid_alive

        pid, recording = lock_owner(self.socket_path)
        if pid is None or not pid_alive(pid):
            return None
        return pid, _valid_recording_path(recording)

    def _views_served(self) -> bool:
        """The owner serves views: a ``gpuwatch record`` started beside it records its
        session through it (``sources/views.py``)."""
        from ..sources.views import view_path

        with contextlib.suppress(OSError):
            return stat.S_ISSOCK(os.lstat(view_path(self.socket_path)).st_mode)
        return False

    def check(self) -> None:
        """At start: a running gpuwatch that records to no file and serves no views (an
        older one) cannot be followed.

        Raises:
            OfferError: It records to no file.
        """
        found = self.owner()
        if found is not None and found[1] is None and not self._views_served():
            raise OfferError(
                f"the gpuwatch on {self.socket_path} (pid {found[0]}) records to no file, so "
                "there is nothing to follow: restart it without --no-record, or serve "
                "a recording: gpuwatch serve FILE"
            )

    def open(self) -> Offer:
        """The live offer for a visitor: the running gpuwatch's recording, or (none runs)
        that of a ``gpuwatch record`` started now.

        Raises:
            OfferError: The owner records to no file, or ``gpuwatch record`` failed.
        """
        with self._lock:
            found = self.owner()
            if found is None or found[1] is None:
                started = self.started
                ours = started is not None and started.poll() is None
                if ours and found is not None and started is not None and found[0] != started.pid:
                    return self.offer()  # ours records through the owner's views
                if ours:
                    self.stop()  # ours, but no longer naming a file: start afresh
                self.start()
        return self.offer()

    def start(self) -> None:
        """Make sure a recording follows the live session: find the owner, or start one.

        Raises:
            OfferError: The owner records to no file, or ``gpuwatch record`` failed.
        """
        found = self.owner()
        if found is not None:
            pid, path = found
            if path is None and self._views_served():
                self._record(found[0])
                return
            if path is None:
                raise OfferError(
                    f"the gpuwatch on {self.socket_path} (pid {pid}) records to no file, so "
                    "there is nothing to follow: restart it without --no-record, or serve "
                    "a recording: gpuwatch serve FILE"
                )
            self._last = path
            return
        self._record(None)

    def _record(self, owner: int | None) -> None:
        """Start ``gpuwatch record`` into the sessions directory: the owner (``owner``
        None), or a view recording the session of the gpuwatch ``owner``.

        Raises:
            OfferError: It failed, or did not start recording in time.
        """
        from ..store.sessions import default_recording_path

        out = default_recording_path()
        out.parent.mkdir(parents=True, exist_ok=True)
        # Its lines go to a file: a pipe nobody reads would stop it once full.
        # Open for as long as the child runs (closed in stop()).
        self._log = tempfile.NamedTemporaryFile(prefix="gpuwatch-serve-record-", suffix=".log")  # noqa: SIM115
        argv = [sys.executable, "-m", "gpuwatch", "record", "--out", str(out)]
        argv += ["--socket", self.socket_path]
        self.started = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log
        )
        deadline = time.monotonic() + START_WAIT
        while time.monotonic() < deadline:
            if self.started.poll() is not None:
                self._log.seek(0)
                said = self._log.read().decode("utf-8", "replace").strip().splitlines()
                raise OfferError(
                    "gpuwatch record could not start: "
                    + (printable(said[-1]) if said else f"exit {self.started.returncode}")
                )
            found = self.owner()
            if owner is None and found is not None and found[0] == self.started.pid:
                if found[1] is not None:
                    self._last = found[1]
                    return
            elif owner is not None and _valid_recording_path(str(out)) is not None:
                self._last = out  # a view: its file, not named in the owner's lock file
                return
            time.sleep(0.05)
        self.stop()
        raise OfferError(f"gpuwatch record did not name its recording in {START_WAIT:.0f} s")

    def offer(self) -> Offer:
        """The live offer now: the owner's recording (it may have moved), its title."""
        found = self.owner()
        host = socket.gethostname()
        started = self.started.pid if self.started is not None else None
        if found is not None and found[1] is None and self._last is not None and started:
            how = f"gpuwatch record (pid {started}) views the running gpuwatch (pid {found[0]})"
        elif found is not None and found[1] is not None:
            pid, self._last = found[0], found[1]
            if pid == started:
                how = f"gpuwatch serve started gpuwatch record (pid {pid})"
            else:
                how = f"following the running gpuwatch (pid {pid})"
        elif self._last is not None:
            how = "no gpuwatch runs now: its last recording (opening it starts gpuwatch record)"
        else:
            title = (
                f"live session of {host}: no gpuwatch runs now (opening it starts gpuwatch record)"
            )
            return Offer(LIVE, printable(title), ())
        title = printable(f"live session of {host}: {how} · {self._last.name}")
        return Offer(LIVE, title, (str(self._last),))

    def stop(self) -> None:
        """Stop the ``gpuwatch record`` started here (it finishes its file), if any."""
        child, self.started = self.started, None
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGINT)
            try:
                child.wait(15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


class Catalog:
    """Everything one server offers.

    Args:
        files: Recordings named on the command line (one offer, merged when several), or
            empty: the live session and the sessions directory, with an index page.
        sessions: The sessions directory (listed when no files are named).
        live: The live session (when no files are named).
    """

    def __init__(
        self, files: list[str], sessions: Path | None = None, live: Live | None = None
    ) -> None:
        self.files = [str(Path(f).resolve()) for f in files]
        self.sessions = sessions
        self.live = live

    @property
    def has_index(self) -> bool:
        """Several things are offered: ``/`` lists them."""
        return not self.files

    def single(self) -> Offer:
        """The files on the command line as one offer."""
        names = [Path(f).name for f in self.files]
        if len(names) == 1:
            title = f"replay {names[0]}"
        else:
            title = f"replay of {len(names)} recordings merged: {', '.join(names)}"
        return Offer("", printable(title), tuple(self.files))

    def listed(self) -> list[Path]:
        """The recordings in the sessions directory, newest first (by modification)."""
        if self.sessions is None:
            return []
        found: list[tuple[float, Path]] = []
        with contextlib.suppress(OSError), os.scandir(self.sessions) as entries:
            for entry in entries:
                if not listable(entry.name):
                    continue
                try:
                    if entry.is_symlink() or not entry.is_file(follow_symlinks=False):
                        continue
                    found.append((entry.stat(follow_symlinks=False).st_mtime, Path(entry.path)))
                except OSError:
                    continue
        found.sort(key=lambda item: (item[0], item[1].name), reverse=True)
        return [path for _, path in found[:LISTED_MAX]]

    def find(self, key: str) -> Offer | None:
        """The offer a URL names, or None (nothing else is ever opened)."""
        if not self.has_index:
            return self.single() if key == "" else None
        if key == LIVE and self.live is not None:
            return self.live.open()
        if not listable(key):
            return None
        for path in self.listed():
            if path.name == key:
                return Offer(key, printable(f"replay {key}"), (str(path),))
        return None
