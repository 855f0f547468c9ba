"""The lock file beside the annotation socket: who owns the path, and what it records.

A gpuwatch holds an ``flock`` on ``<socket>.lock`` for as long as it owns the socket, so a
second one on the same path cannot take it (it is told the first one's pid and recording,
and attaches to it as a view: ``views.py``) while a socket left by a crashed one can be
replaced. The lock decides which view takes over when the owner quits. The lock file is
gpuwatch's own (checked when it is taken); beside the socket only it and the owner's view
socket (``<socket>.views``, made while the lock is held) are ever made or written.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat

from .socket_path import SocketInUse, SocketPathTaken

LOCK_MAX = 8192
"""Most bytes a lock file holds: a pid line and a recording path line."""


class LockFile:
    """The lock on a socket path, held until :meth:`release`.

    Args:
        fd: The open, locked lock file.
    """

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    @classmethod
    def take(cls, path: str) -> LockFile:
        """Open and ``flock`` the lock file beside the socket ``path``.

        Raises:
            SocketInUse: Another gpuwatch holds it.
            SocketPathTaken: The lock file's name is taken by something that is not one.
        """
        lock_path = path + ".lock"
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise SocketPathTaken(
                    f"{lock_path} is a symbolic link; gpuwatch will not follow it"
                )
            raise SocketPathTaken(f"cannot open the lock file {lock_path}: {exc.strerror or exc}")
        try:
            st = os.fstat(fd)
            owner, _ = _content(os.pread(fd, LOCK_MAX, 0))
            ours = st.st_size == 0 or owner is not None  # just made, or our pid in it
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or not ours:
                raise SocketPathTaken(
                    f"{lock_path} exists and is not a gpuwatch lock file; gpuwatch will not "
                    "touch it: choose another --socket path"
                )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise SocketInUse(f"another gpuwatch (pid {owner}) is already listening on {path}")
            _write(fd, os.getpid(), None)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd)

    def announce(self, recording: str | None) -> None:
        """Name the recording this gpuwatch writes, for a second one to say."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                _write(self._fd, os.getpid(), recording)

    def release(self) -> None:
        """Let the path go (closing the file drops the lock)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def lock_owner(path: str) -> tuple[int | None, str | None]:
    """Who holds the socket at ``path``: the gpuwatch's pid and the recording it writes.

    Read from the lock file beside the socket, which only the user's own gpuwatch writes;
    (None, None) when there is none or it is not one.
    """
    try:
        fd = os.open(path + ".lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None, None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            return None, None
        return _content(os.pread(fd, LOCK_MAX, 0))
    finally:
        os.close(fd)


def _content(data: bytes) -> tuple[int | None, str | None]:
    """(pid, recording) in a lock file; pid None when it is not one gpuwatch wrote."""
    lines = data.decode("utf-8", "replace").split("\n")
    first = lines[0].strip()
    if not first.isdigit() or len(data) >= LOCK_MAX:
        return None, None
    recording = lines[1].strip() if len(lines) > 1 else ""
    return int(first), recording or None


def _write(fd: int, pid: int, recording: str | None) -> None:
    text = f"{pid}\n{recording}\n" if recording else f"{pid}\n"
    data = text.encode("utf-8", "surrogateescape")[: LOCK_MAX - 1]
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
