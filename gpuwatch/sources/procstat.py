"""Host CPU and memory of processes, read cheaply enough to follow hundreds each second.

On Linux one read of ``/proc/PID/stat`` gives the CPU time, the RSS and the parent of a
process (psutil reads two files for the CPU time and the RSS); elsewhere psutil answers.
A :class:`Reader` keeps each followed process's file open and reads it again in place,
a fraction of an open, read and close (the path lookup is most of what a read of /proc
costs), and tells an ended process from a reused pid for free: the open file stays the
old process's. :class:`CpuMeter` turns CPU times into a percentage of one core over the
time between two reads, as ``top`` and nvitop show it.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from typing import NamedTuple

import psutil

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_PROC = os.path.isfile("/proc/self/stat")


class Stat(NamedTuple):
    """One reading of a process.

    Attributes:
        cpu: User plus system CPU seconds so far.
        rss: Resident set size in bytes.
        ppid: The parent's pid.
    """

    cpu: float
    rss: int
    ppid: int


def read(pid: int) -> Stat | None:
    """CPU time, RSS and parent of ``pid``; None when it is gone or cannot be read."""
    if _PROC:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                data = f.read()
        except OSError:
            return None
        return _parse(data)
    try:
        return _from_psutil(pid)
    except PermissionError:
        return None


def _from_psutil(pid: int) -> Stat | None:
    """:func:`read` where there is no /proc; raises PermissionError for another user's."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            times = proc.cpu_times()
            return Stat(times.user + times.system, proc.memory_info().rss, proc.ppid())
    except psutil.AccessDenied:
        raise PermissionError(f"pid {pid} may not be read") from None
    except (psutil.Error, OSError):
        return None


def _parse(data: bytes) -> Stat | None:
    """A ``/proc/PID/stat`` line as a :class:`Stat`; None for a zombie (it has ended: only
    its parent's wait is missing) or a line that does not parse."""
    # The command name (field 2) may hold spaces and parentheses: split after its end.
    fields = data[data.rfind(b")") + 2 :].split(maxsplit=22)
    try:
        if fields[0] in (b"Z", b"X"):
            return None
        cpu = (int(fields[11]) + int(fields[12])) / _TICKS
        return Stat(cpu, int(fields[21]) * _PAGE, int(fields[1]))
    except (IndexError, ValueError):
        return None


MAX_OPEN = 512
"""Files a :class:`Reader` keeps open at most (more processes are read with an open each);
below a quarter of the soft limit on open files where that is lower."""


class Reader:
    """:func:`read` for processes followed over time, their ``/proc/PID/stat`` kept open.

    Safe to call from several threads (a sampling thread the watchdog replaced may still
    be returning). Call :meth:`keep` with the pids still followed, so that the files of
    those that ended are closed, and :meth:`close` at the end.
    """

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()
        self.limit = MAX_OPEN
        try:
            import resource  # not on Windows

            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            if soft != resource.RLIM_INFINITY:
                self.limit = min(MAX_OPEN, soft // 4)
        except (ImportError, OSError, ValueError):
            pass

    def read(self, pid: int) -> Stat | None:
        """CPU time, RSS and parent of ``pid``; None when it has ended (or is a zombie).

        Raises:
            PermissionError: its file may not be read here (another user's, where /proc
                hides them).
        """
        if not _PROC:
            return _from_psutil(pid)
        with self._lock:
            fd = self._fds.get(pid)
            if fd is None:
                try:
                    fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
                except (FileNotFoundError, ProcessLookupError):
                    return None
                except OSError as exc:
                    if exc.errno in (errno.EACCES, errno.EPERM):
                        raise PermissionError(exc.errno, exc.strerror) from None
                    return None
                if len(self._fds) >= self.limit:  # read once, not kept
                    try:
                        return _parse(os.pread(fd, 1024, 0))
                    except OSError:
                        return None
                    finally:
                        os.close(fd)
                self._fds[pid] = fd
            try:
                data = os.pread(fd, 1024, 0)
            except OSError:  # ESRCH: the process this file was opened for has ended
                data = b""
            st = _parse(data) if data else None
            if st is None:  # ended: a later process with its pid gets a file of its own
                del self._fds[pid]
                os.close(fd)
            return st

    def keep(self, pids: set[int] | frozenset[int]) -> None:
        """Close the files of every pid not in ``pids``."""
        with self._lock:
            for pid in [p for p in self._fds if p not in pids]:
                os.close(self._fds.pop(pid))

    def close(self) -> None:
        """Close every file (the reader can be used again: files are opened anew)."""
        self.keep(frozenset())

    def __len__(self) -> int:
        return len(self._fds)


def container_pid(pid: int) -> int | None:
    """The pid of ``pid`` inside its own (innermost) PID namespace, where that differs
    from the host's (a container's process); None otherwise or where it cannot be read
    (Linux only: the ``NSpid`` line of ``/proc/PID/status``)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    ids = line.split()[1:]
                    inner = int(ids[-1]) if ids else pid
                    return inner if inner != pid else None
    except (OSError, ValueError):
        return None
    return None


class CpuMeter:
    """CPU % of processes between successive readings (100 = one core busy).

    Args:
        every: Seconds a reading must be apart from the one a percentage is taken from:
            a process's CPU time moves in clock ticks (10 ms), so a percentage over 0.1 s
            would jump by 10 points; it is taken over at least this long and held between.
    """

    def __init__(self, every: float = 0.0) -> None:
        self.every = every
        self._last: dict[int, tuple[float, float, float | None]] = {}  # pid -> (t, cpu, %)

    def update(self, pid: int, cpu: float, t: float | None = None) -> float | None:
        """The CPU % of ``pid`` given its CPU seconds now (None at its first reading)."""
        t = time.monotonic() if t is None else t
        last = self._last.get(pid)
        if last is None:
            self._last[pid] = (t, cpu, None)
            return None
        t0, cpu0, shown = last
        if t - t0 < self.every or t <= t0:
            return shown
        percent = max(0.0, (cpu - cpu0) / (t - t0) * 100.0)
        self._last[pid] = (t, cpu, percent)
        return percent

    def keep(self, pids: set[int] | frozenset[int]) -> None:
        """Forget every pid not in ``pids`` (those that ended: a pid may be reused)."""
        for pid in [p for p in self._last if p not in pids]:
            del self._last[pid]
