"""Host CPU and memory of processes, read cheaply enough to follow hundreds each second.

On Linux one read of ``/proc/PID/stat`` gives the CPU time, the RSS and the parent of a
process (psutil reads two files for the CPU time and the RSS); elsewhere psutil answers.
:class:`CpuMeter` turns CPU times into a percentage of one core over the time between two
reads, as ``top`` and nvitop show it.
"""

from __future__ import annotations

import os
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
        # The command name (field 2) may hold spaces and parentheses: split after its end.
        fields = data[data.rfind(b")") + 2 :].split()
        try:
            cpu = (int(fields[11]) + int(fields[12])) / _TICKS
            return Stat(cpu, int(fields[21]) * _PAGE, int(fields[1]))
        except (IndexError, ValueError):
            return None
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            times = proc.cpu_times()
            return Stat(times.user + times.system, proc.memory_info().rss, proc.ppid())
    except (psutil.Error, OSError):
        return None


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
