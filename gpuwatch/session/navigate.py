"""Jump targets on the session's time axis: phase boundaries, marks, OOMs, spikes.

Shared by the live dashboard and replay, so "next phase" means the same thing in both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from .model import is_host
from .process import Process
from .session import Session
from .table import MISSING_INT


def _processes(session: Session, key: str | None) -> list[Process]:
    if key is None:
        return list(session.processes.values())
    if is_host(key):
        return session.processes_of_host(key)
    return session.processes_on(key)


def boundaries(session: Session, key: str | None = None) -> np.ndarray:
    """Sorted, unique begin and end times of every phase (of processes on ``key``).

    Every row of every process: for jumping, :func:`next_boundary` reads only around the
    time it starts from.
    """
    parts: list[np.ndarray] = []
    for proc in _processes(session, key):
        cols = proc.phases.snapshot()
        parts += [cols["t0"], cols["t1"]]
        parts.append(np.array([o.t0 for o in list(proc.open.values())], dtype=np.int64))
    if not parts:
        return np.empty(0, dtype=np.int64)
    return np.unique(np.concatenate(parts))


def has_phases(session: Session, key: str | None = None) -> bool:
    """Did any process (on ``key``) begin a phase."""
    return any(len(p.phases) or p.open for p in _processes(session, key))


def next_boundary(session: Session, t: int, direction: int, key: str | None = None) -> int | None:
    """The first phase begin or end strictly after ``t`` (direction > 0) or before it.

    Exact over the whole session: phases are ordered by their end and no longer than the
    process's longest span, so the rows around ``t`` (and one row past a gap) decide it.

    Args:
        session: The session.
        t: Where to start from.
        direction: > 0 forward, < 0 back.
        key: Only processes on this device (None: all).
    """
    best: int | None = None
    for proc in _processes(session, key):
        found = _proc_boundary(proc, t, direction)
        if found is None:
            continue
        if best is None or (found < best if direction > 0 else found > best):
            best = found
    return best


def _proc_boundary(proc: Process, t: int, direction: int) -> int | None:
    table = proc.phases
    cands: list[int] = [o.t0 for o in list(proc.open.values())]
    if direction > 0:
        cands = [c for c in cands if c > t]
        i = table.search(t, "right")  # the first span ending after t
        if i < len(table):
            first_end = int(table.rows(i, i + 1, ("t1",))["t1"][0])
            # A span beginning in (t, first_end) ends by first_end + the longest span.
            j = table.search(first_end + proc.max_span, "right")
            cols = table.rows(i, j, ("t0", "t1"))
            after = cols["t0"][cols["t0"] > t]
            cands += [first_end] + ([int(after.min())] if len(after) else [])
        return min(cands) if cands else None
    cands = [c for c in cands if c < t]
    i = table.search(t, "left")  # spans before i end before t
    if i > table.first:
        cands.append(int(table.rows(i - 1, i, ("t1",))["t1"][0]))
    # A span ending at or after t may have begun before it (no later than max_span ago).
    j = table.search(t + proc.max_span, "right")
    cols = table.rows(i, j, ("t0",))
    before = cols["t0"][cols["t0"] < t]
    if len(before):
        cands.append(int(before.max()))
    return max(cands) if cands else None


def events(
    session: Session, key: str | None = None, kinds: Iterable[str] = ("mark", "oom")
) -> np.ndarray:
    """Sorted times of marks and/or OOMs (of processes on ``key``)."""
    pids = {p.pid for p in _processes(session, key)}
    kinds = set(kinds)
    times: list[int] = []
    if "mark" in kinds:
        t, pid = session.mark_times()  # the marks let go of too: times only, no text
        times += t[np.isin(pid, list(pids))].tolist()
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


class Spike(NamedTuple):
    """Where ``s`` ("Largest spike") goes: the highest peak of what was measured best.

    Attributes:
        t: Where to put the cursor (inside the phase, for an exact phase peak).
        value: The peak's bytes.
        source: ``"phase"`` (a phase's exact allocator peak), ``"nvml"`` (nvidia-smi's
            used memory), ``"torch"`` (a script's allocator figures, for a GPU NVML
            cannot see) or ``"rss"`` (the host).
        pid: The process of an exact phase peak (else 0).
        phase: That phase's name (printable is the caller's job), else "".
        step: That phase's step, else None.
    """

    t: int
    value: float
    source: str
    pid: int = 0
    phase: str = ""
    step: int | None = None


SPIKE_WORDS = {
    "phase": "the exact allocator peak",
    "nvml": "nvidia-smi used",
    "torch": "torch allocated",
    "rss": "the RSS of an instrumented process",
    "host": "the host's used memory",
}
"""What each :attr:`Spike.source` measured, as the notification says it."""


def phase_peak(session: Session, pid: int, t1: int, value: int) -> Spike:
    """The :class:`Spike` of the phase of ``pid`` that ended at ``t1`` with peak ``value``:
    the cursor in the middle of that phase (where its row can be read, else just inside
    its end)."""
    proc = session.processes.get(pid)
    if proc is not None:
        cols = proc.phases.between(t1, t1, columns=("t0", "t1", "peak_alloc", "name", "step"))
        rows = np.flatnonzero((cols["t1"] == t1) & (cols["peak_alloc"] == value))
        if len(rows):
            i = rows[-1]
            nid, step = int(cols["name"][i]), int(cols["step"][i])
            name = session.names[nid] if 0 <= nid < len(session.names) else "?"
            known = step if step != MISSING_INT else None
            mid = (int(cols["t0"][i]) + t1) // 2
            return Spike(mid, float(value), "phase", pid, name, known)
    return Spike(t1 - 1, float(value), "phase", pid)


def spike(session: Session, key: str | None = None) -> Spike | None:
    """The largest spike on device ``key`` (None: every process): the highest exact
    per-phase allocator peak where a script reported them, else the highest reading
    :func:`largest_spike` finds (nvidia-smi's used memory, a torch-only GPU's allocator
    peaks, the host's RSS).

    Exact peaks first: a phase's peak that stays inside reserved memory never reaches
    NVML, whose highest reading is then a plateau of reserved memory (often at a step
    boundary), not the spike the allocator saw inside the step.
    """
    best: tuple[int, int, int] | None = None  # (value, t1, pid)
    procs = list(session.processes.values()) if key is None else _processes(session, key)
    for proc in procs:
        found = proc.phases.max_between("peak_alloc")
        if found is not None and (best is None or int(found[1]) > best[0]):
            best = (int(found[1]), found[0], proc.pid)
    if best is not None:
        return phase_peak(session, best[2], best[1], best[0])
    if key is None:
        return None
    found = largest_spike(session, key)
    if found is None:
        return None
    if is_host(key):
        source = "rss"
    else:
        table = session.gpu.get(key)
        source = "nvml" if table is not None and len(table) else "torch"
    return Spike(found[0], found[1], source)


def largest_spike(
    session: Session, key: str, t0: int | None = None, t1: int | None = None
) -> tuple[int, float] | None:
    """(time, bytes) of the highest memory reading on device ``key`` in ``[t0, t1]``.

    GPUs: the highest NVML "used" sample (what nvidia-smi shows); for a GPU known only from
    torch, the highest exact allocator peak. The host: the highest process RSS. Recorded
    rows answer from the recording's index (each chunk's maximum), not by reading them.
    """
    if is_host(key):
        best: tuple[int, float] | None = None
        for proc in session.processes_of_host(key):
            cand = proc.rss.max_between("rss", t0, t1)
            if cand is not None and (best is None or cand[1] > best[1]):
                best = cand
        return best
    table = session.gpu.get(key)
    if table is not None and len(table):
        found = table.max_between("used", t0, t1)
        if found is not None:
            return found
    best = None
    for proc in session.processes_on(key):
        cand = proc.peaks.max_between("peak_allocated", t0, t1)
        if cand is None:
            continue
        t_end, value = cand
        # The peak happened somewhere in (t0, t1]: point at the middle of that segment.
        row = proc.peaks.between(t_end, t_end, columns=("t0", "peak_allocated"))
        starts = row["t0"][row["peak_allocated"] == value]
        t = (int(starts[0]) + t_end) // 2 if len(starts) else t_end
        cand = (t, value)
        if best is None or cand[1] > best[1]:
            best = cand
    return best
