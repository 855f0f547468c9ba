"""Jump targets on the session's time axis: phase boundaries, marks, OOMs, spikes.

Shared by the live dashboard and replay, so "next phase" means the same thing in both.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .model import is_host
from .session import Process, Session


def _processes(session: Session, key: str | None) -> list[Process]:
    if key is None:
        return list(session.processes.values())
    if is_host(key):
        return session.processes_of_host(key)
    return session.processes_on(key)


def boundaries(session: Session, key: str | None = None) -> np.ndarray:
    """Sorted, unique begin and end times of every phase (of processes on ``key``)."""
    parts: list[np.ndarray] = []
    for proc in _processes(session, key):
        cols = proc.phases.snapshot()
        parts += [cols["t0"], cols["t1"]]
        parts.append(np.array([o.t0 for o in list(proc.open.values())], dtype=np.int64))
    if not parts:
        return np.empty(0, dtype=np.int64)
    return np.unique(np.concatenate(parts))


def events(
    session: Session, key: str | None = None, kinds: Iterable[str] = ("mark", "oom")
) -> np.ndarray:
    """Sorted times of marks and/or OOMs (of processes on ``key``)."""
    pids = {p.pid for p in _processes(session, key)}
    kinds = set(kinds)
    times: list[int] = []
    if "mark" in kinds:
        times += [m.t for m in session.marks if m.pid in pids]
    if "oom" in kinds:
        times += [o.t for o in session.ooms if o.pid in pids]
    return np.unique(np.array(times, dtype=np.int64))


def step_to(times: np.ndarray, t: int, direction: int) -> int | None:
    """The first time strictly after ``t`` (direction > 0) or before it (< 0), or None."""
    if len(times) == 0:
        return None
    if direction > 0:
        i = int(np.searchsorted(times, t, "right"))
        return int(times[i]) if i < len(times) else None
    i = int(np.searchsorted(times, t, "left")) - 1
    return int(times[i]) if i >= 0 else None


def largest_spike(
    session: Session, key: str, t0: int | None = None, t1: int | None = None
) -> tuple[int, float] | None:
    """(time, bytes) of the highest memory reading on device ``key`` in ``[t0, t1]``.

    GPUs: the highest NVML "used" sample (what nvidia-smi shows); for a GPU known only from
    torch, the highest exact allocator peak. The host: the highest process RSS.
    """
    lo = t0 if t0 is not None else np.iinfo(np.int64).min
    hi = t1 if t1 is not None else np.iinfo(np.int64).max
    if is_host(key):
        best: tuple[int, float] | None = None
        for proc in session.processes_of_host(key):
            cols = proc.rss.between(lo, hi)
            if len(cols["t"]):
                i = int(np.argmax(cols["rss"]))
                cand = (int(cols["t"][i]), float(cols["rss"][i]))
                if best is None or cand[1] > best[1]:
                    best = cand
        return best
    table = session.gpu.get(key)
    if table is not None and len(table):
        cols = table.between(lo, hi)
        if len(cols["t"]):
            i = int(np.argmax(cols["used"]))
            return int(cols["t"][i]), float(cols["used"][i])
    best = None
    for proc in session.processes_on(key):
        cols = proc.peaks.between(lo, hi)
        if len(cols["t1"]):
            i = int(np.argmax(cols["peak_allocated"]))
            # The peak happened somewhere in (t0, t1]: point at the middle of that segment.
            t = int((int(cols["t0"][i]) + int(cols["t1"][i])) // 2)
            cand = (t, float(cols["peak_allocated"][i]))
            if best is None or cand[1] > best[1]:
                best = cand
    return best
