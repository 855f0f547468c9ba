"""Per-phase peaks: what the allocator reported inside each phase, and what NVML saw."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import is_host
from .process import Process
from .session import Session
from .table import MISSING_INT, Table

SCAN_ROWS = 65_536
"""Phases :func:`phase_peaks` reads back from the newest, at most: the last steps of a
process, and not the whole of a long run when its phases carry no step."""


@dataclass
class PhasePeak:
    """One ended phase with its peaks (bytes; None when not reported / not sampled).

    Attributes:
        device_max: The highest NVML "used" reading during the phase on its GPU (the
            held reading from just before counts: a short phase may fall between polls),
            or the process's highest RSS for the host.
    """

    pid: int
    step: int | None
    name: str
    t0: int
    t1: int
    depth: int
    peak_alloc: int | None
    peak_reserved: int | None
    device_max: float | None


def range_max(t: np.ndarray, v: np.ndarray, t0: int, t1: int) -> float | None:
    """Highest step-hold value over ``[t0, t1]``: samples inside plus the one in effect at t0."""
    i0 = int(np.searchsorted(t, t0, "right")) - 1  # the sample in effect at t0
    i1 = int(np.searchsorted(t, t1, "right"))
    i0 = max(i0, 0)
    if i1 <= i0 or len(t) == 0:
        return None
    return float(np.max(v[i0:i1]))


def table_range_max(table: Table, column: str, t0: int, t1: int) -> float | None:
    """:func:`range_max` of a table's column, reading only the rows it needs."""
    i0 = max(table.search(t0, "right") - 1, table.first)
    i1 = table.search(t1, "right")
    if i1 <= i0:
        return None
    cols = table.rows(i0, i1, (table.time, column))
    return range_max(cols[table.time], cols[column], t0, t1)


def _newest(table: Table, last_steps: int) -> dict[str, np.ndarray]:
    """The newest rows of a phases table: all of a table of up to :data:`SCAN_ROWS`;
    of a longer one, back until they reach before its last ``last_steps`` steps."""
    end = len(table)
    if end - table.first <= SCAN_ROWS:
        return table.rows(table.first, end)
    want = 4096
    while True:
        cols = table.rows(max(table.first, end - want), end)
        steps = cols["step"][cols["step"] != MISSING_INT]
        if want >= SCAN_ROWS or (len(steps) and steps.min() <= steps.max() - last_steps):
            return cols
        want *= 2


def _opt(v: int) -> int | None:
    return None if v == MISSING_INT else int(v)


def phase_peaks(
    session: Session, proc: Process, key: str, last_steps: int = 20, depth: int | None = 0
) -> list[PhasePeak]:
    """Ended phases of ``proc`` in its last ``last_steps`` steps, newest first (steps and
    the phases within each).

    Read from the newest :data:`SCAN_ROWS` phases (all of them, in all but long runs).

    Args:
        session: The session.
        proc: The process.
        key: The device whose NVML readings (or, for the host, RSS) give ``device_max``.
        last_steps: How many steps back to go.
        depth: Only phases at this nesting depth (None: all).
    """
    cols = _newest(proc.phases, last_steps)
    if len(cols["t0"]) == 0:
        return []
    steps = cols["step"]
    known = steps[steps != MISSING_INT]
    keep = np.ones(len(steps), dtype=bool)
    if len(known):
        newest = int(known.max())
        keep &= (steps == MISSING_INT) | (steps > newest - last_steps)
    if depth is not None:
        keep &= cols["depth"] == depth
    idx = np.flatnonzero(keep)
    ref: Table | None
    if is_host(key):
        ref, column = proc.rss, "rss"
    else:
        ref, column = session.gpu.get(key), "used"

    def device_max(t0: int, t1: int) -> float | None:
        return table_range_max(ref, column, t0, t1) if ref is not None else None

    out = [
        PhasePeak(
            pid=proc.pid,
            step=_opt(int(cols["step"][i])),
            name=session.names[int(cols["name"][i])],
            t0=int(cols["t0"][i]),
            t1=int(cols["t1"][i]),
            depth=int(cols["depth"][i]),
            peak_alloc=_opt(int(cols["peak_alloc"][i])),
            peak_reserved=_opt(int(cols["peak_reserved"][i])),
            device_max=device_max(int(cols["t0"][i]), int(cols["t1"][i])),
        )
        for i in idx
    ]
    # Newest first throughout: steps and the phases within a step alike (live, the phase
    # that just ended is the top row).
    out.sort(key=lambda p: (-(p.step if p.step is not None else -1), -p.t0))
    return out
