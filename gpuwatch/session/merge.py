"""Several sessions (recordings of several hosts, or several runs) as one.

Each session has its own monotonic clock; its ``wall_offset`` turns that clock into wall
time. The merged session keeps the first session's offset and shifts every time of the
others by the difference, so an event that happened at the same wall-clock instant on two
hosts lines up on the one time axis (within the hosts' NTP error). ``align="start"``
instead puts every session's first sample at the first session's, to compare runs made
at different times.

Devices are renamed ``<origin>/<key>`` (origin: the recording's host, see
:func:`origins`), so the same GPU recorded twice, or two hosts' ``host`` devices, stay
apart; a pid that another session already uses is renumbered, its own pid kept in
``Process.os_pid`` and ``proc_info[pid]["os_pid"]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .model import HOST, Mark, Oom, origin_key
from .process import Process
from .session import Session
from .table import Table

ALIGNS = ("wall", "start")
"""How :func:`merge` lines sessions up: by wall clock, or by their first sample."""

PID_STRIDE = 1 << 32
"""Renumbered pids are ``pid + k * PID_STRIDE``: above any real pid, and still readable."""


@dataclass
class Part:
    """One session going into a merge.

    Attributes:
        session: The fully loaded session.
        origin: Its name in the merged one (unique; usually the recording's host).
        shift: What was added to its times (ns), set by :func:`merge`.
        pids: Its pids -> their pids in the merged session, set by :func:`merge`.
        span: Its first and last time on the merged clock, set by :func:`merge`.
    """

    session: Session
    origin: str
    shift: int = 0
    pids: dict[int, int] = field(default_factory=dict)
    span: tuple[int, int] = (0, 0)


def origins(hosts: Sequence[str], names: Sequence[str]) -> list[str]:
    """Unique origin names: the hosts where those differ, else the file names.

    Args:
        hosts: Each recording's host name.
        names: Each recording's file name without suffix (used when hosts repeat).
    """
    base = list(hosts) if len(set(hosts)) == len(hosts) else list(names)
    out: list[str] = []
    for i, name in enumerate(base):
        name = (name or f"part{i + 1}").replace("/", "_")
        candidate, n = name, 1
        while candidate in out:
            n += 1
            candidate = f"{name}#{n}"
        out.append(candidate)
    return out


def merge(parts: Sequence[Part], align: str = "wall") -> Session:
    """One replay session holding all of ``parts``, on the first part's clock.

    The parts' tables move into the merged session (shifted in place): do not use the
    parts' sessions afterwards.

    Args:
        parts: Loaded sessions with unique origins; each part's ``shift`` is set here.
        align: ``"wall"`` (same wall-clock instant, same time) or ``"start"``.

    Raises:
        ValueError: No parts, an unknown ``align``, or repeated origins.
    """
    if not parts:
        raise ValueError("nothing to merge")
    if align not in ALIGNS:
        raise ValueError(f"align must be one of {', '.join(ALIGNS)}")
    if len({p.origin for p in parts}) != len(parts):
        raise ValueError("each part needs its own origin")
    ref = parts[0].session
    for part in parts:
        s = part.session
        first, last = s.time_range()
        if align == "wall":
            part.shift = s.wall_offset - ref.wall_offset
        else:
            part.shift = ref.time_range()[0] - first
        part.span = (first + part.shift, last + part.shift)
    out = Session(
        t_origin=min(p.session.t_origin + p.shift for p in parts), wall_offset=ref.wall_offset
    )
    out.live = False
    del out.hosts[HOST]  # every host comes from a part, under its origin
    used: set[int] = set()
    for k, part in enumerate(parts):
        _add(out, part, k, used)
    out.touch()
    return out


def _add(out: Session, part: Part, k: int, used: set[int]) -> None:
    s, origin, shift = part.session, part.origin, part.shift
    for key, dev in s.devices.items():
        out.add_device(dataclasses.replace(dev, key=origin_key(origin, key), origin=origin))
    for key, table in s.gpu.items():
        out.gpu[origin_key(origin, key)] = _shifted(table, shift)
    for key, table in s.hosts.items():
        if len(table) or key in s.devices:
            out.hosts[origin_key(origin, key)] = _shifted(table, shift)
    pids = part.pids = {}
    for pid in sorted({*s.processes, *s.proc_info}):
        new = pid
        while new in used:
            new += PID_STRIDE
        used.add(new)
        pids[pid] = new
    for key, table in s.gpu_procs.items():
        out.gpu_procs[origin_key(origin, key)] = _shifted(table, shift, pids)
    for pid, info in s.proc_info.items():
        out.proc_info[pids[pid]] = info if pids[pid] == pid else {**info, "os_pid": pid}
    names = np.array([out.name_id(n) for n in s.names] or [0], dtype=np.int32)
    for pid, proc in s.processes.items():
        out.processes[pids[pid]] = _process(proc, pids[pid], part, names)
    out.marks += [
        Mark(m.t + shift, pids.get(m.pid, m.pid), m.text, m.level, m.step) for m in s.every_mark()
    ]
    out.marks.sort(key=lambda m: m.t)
    out.ooms += [Oom(o.t + shift, pids.get(o.pid, o.pid), o.body) for o in s.ooms]
    out.ooms.sort(key=lambda o: o.t)
    for reason, count in s.rejects.items():
        out.rejects[reason] += count
    out.notes += [f"{origin}: {note}" for note in s.notes]
    out.sampler_rate.update({origin_key(origin, key): rate for key, rate in s.sampler_rate.items()})


def _process(proc: Process, pid: int, part: Part, names: np.ndarray) -> Process:
    shift, origin = part.shift, part.origin
    new = dataclasses.replace(
        proc,
        pid=pid,
        devices={i: origin_key(origin, key) for i, key in proc.devices.items()},
        first_t=proc.first_t + shift,
        facts_log=tuple(e._replace(start=e.start + shift) for e in proc.facts_log),
        last_t=proc.last_t + shift,
        ended=None if proc.ended is None else proc.ended + shift,
        last_boundary=None if proc.last_boundary is None else proc.last_boundary + shift,
        torch=_shifted(proc.torch, shift),
        peaks=_shifted(proc.peaks, shift),
        rss=_shifted(proc.rss, shift),
        phases=_shifted(proc.phases, shift, names=names),
        open={sid: dataclasses.replace(o, t0=o.t0 + shift) for sid, o in proc.open.items()},
        host=origin_key(origin, proc.host),
        origin=origin,
        os_pid=proc.pid if pid != proc.pid else proc.os_pid,
    )
    return new


def _shifted(
    table: Table,
    shift: int,
    pids: dict[int, int] | None = None,
    names: np.ndarray | None = None,
) -> Table:
    """``table`` itself, its times moved by ``shift`` and its pids and names renumbered.

    In place: the parts are used up by the merge, and copying a day of samples would
    double the memory a merged replay needs. Rows still in the recording are moved as
    they are read (their archive applies the same change).

    Args:
        table: The part's table.
        shift: Nanoseconds to add to every known time.
        pids: Renumbered pids, for a ``pid`` column.
        names: The merged name id of each of the part's phase name ids.
    """
    maps: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if pids and "pid" in table.names:
        moved = {old: new for old, new in pids.items() if old != new}
        if moved:
            maps["pid"] = (
                np.array(list(moved), dtype=np.int64),
                np.array(list(moved.values()), dtype=np.int64),
            )
    if names is not None and "name" in table.names:
        maps["name"] = (np.arange(len(names), dtype=np.int64), names.astype(np.int64))
    if table.archive is not None:
        table.archive.transform(shift, maps)
    table.shift(shift, maps)
    return table
