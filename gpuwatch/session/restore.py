"""The restore API: a replayed session filled from what a recording stored.

The loader (:mod:`gpuwatch.store.loader`) is its one caller. Each function keeps the
invariants the live path keeps (devices have tables, spans know their longest span, a
process exists before its series), and emits like the live path does, so subscribers and
caches see every change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, TypeVar

import numpy as np

from .model import GPU_COLUMNS, GPU_PROC_COLUMNS, HOST_COLUMNS, Device, Mark, Oom, OpenSpan
from .ports import DeviceChanged
from .process import PROCESS_TABLES, Process
from .session import Session
from .table import Table

_RESTORABLE = frozenset(
    f.name
    for f in dataclasses.fields(Process)
    if f.name not in PROCESS_TABLES and f.name not in ("pid", "open", "tally", "book", "rev")
)
"""What :func:`process` sets: a process's scalar state, hello and facts."""

_E = TypeVar("_E", Mark, Oom)


def device(session: Session, stored: Device) -> Device:
    """A device as stored: added, or the known one's fields replaced by the stored ones."""
    old = session.devices.get(stored.key)
    if old is None:
        return session.add_device(stored)
    with session._lock:
        for f in dataclasses.fields(Device):
            setattr(old, f.name, getattr(stored, f.name))
    session._emit(DeviceChanged(old))
    return old


def process(session: Session, pid: int, state: dict[str, Any]) -> Process:
    """A process's stored scalar state, hello and facts (attributes of :class:`Process`).

    Its tables are restored by :func:`extend_series`, its open spans by
    :func:`open_spans`; ``pid`` is the key and never changes.

    Raises:
        ValueError: ``state`` names something that is not a scalar attribute.
    """
    bad = set(state) - _RESTORABLE
    if bad:
        raise ValueError(f"not a stored process attribute: {', '.join(sorted(bad))}")
    with session._lock:
        proc = _process(session, pid)
        for name, value in state.items():
            setattr(proc, name, value)
    session.touch()
    return proc


def _process(session: Session, pid: int) -> Process:
    proc = session.processes.get(pid)
    if proc is None:
        proc = session._new_process(pid)
    return proc


def open_spans(session: Session, spans: dict[int, dict[int, OpenSpan]]) -> None:
    """The spans each process had open when the file was last written (all at once)."""
    with session._lock:
        for pid, proc in session.processes.items():
            proc.open = spans.get(pid, {})
    session.touch()


def events(
    session: Session,
    marks: Iterable[Mark] = (),
    ooms: Iterable[Oom] = (),
    notes: Iterable[str] = (),
    filed: bool = False,
) -> None:
    """Point events as stored, appended in order (a note already shown is not repeated).

    Args:
        filed: The marks are read back from the recording (see
            :meth:`~gpuwatch.session.retention.Retention.read_marks_from`): memory may let
            go of them.
    """
    with session._lock:
        session.marks.extend(marks)
        session.ooms.extend(ooms)
        for text in notes:
            if text not in session.notes:
                session.notes.append(text)
        session.retention.marks_restored(filed)
    session.touch()


def retain_events(session: Session, t0: int, t1: int) -> int:
    """Keep only the marks and OOMs timed within ``[t0, t1]``; returns how many went."""
    with session._lock:
        gone = _keep_within(session.marks, t0, t1) + _keep_within(session.ooms, t0, t1)
    if gone:
        session.touch()
    return gone


def _keep_within(events: list[_E], t0: int, t1: int) -> int:
    """Keep only the events of ``events`` timed within ``[t0, t1]``; how many went."""
    keep = [e for e in events if t0 <= e.t <= t1]
    gone = len(events) - len(keep)
    events[:] = keep
    return gone


def counts(
    session: Session, rejects: dict[str, int] | None = None, rates: dict[str, float] | None = None
) -> None:
    """Stored reject counts (they replace the known ones) and achieved sampling rates."""
    with session._lock:
        for reason, count in (rejects or {}).items():
            session.rejects[reason] = count
        session.sampler_rate.update(rates or {})
    session.touch()


def series_table(
    session: Session, kind: str, key: str, capacity: int = 1024, archive: Any = None
) -> Table:
    """The table a stored series of ``kind`` fills, made (sized for ``capacity`` rows).

    Args:
        kind: ``gpu``, ``gpu_procs`` (by device key), ``host`` (by host key), ``torch``,
            ``peaks``, ``rss`` or ``phases`` (by pid, as text).
        key: Which device or process.
        capacity: Rows it will hold (a table sized once never copies on append).
        archive: Where its rows are read from on demand (``Table.archive``), instead
            of being appended.

    Raises:
        ValueError: An unknown kind, or a process series whose key is not a pid.
    """
    with session._lock:
        if kind in ("gpu", "gpu_procs"):
            if key not in session.devices:
                session.add_device(Device(key, "gpu", source="recording"))
            layout = GPU_COLUMNS if kind == "gpu" else GPU_PROC_COLUMNS
            table = Table(layout, 0 if archive else capacity, kind=kind)
            getattr(session, kind)[key] = table
        elif kind == "host":
            size = 0 if archive else capacity
            table = session.hosts[key] = Table(HOST_COLUMNS, size, kind=kind)
        elif kind in PROCESS_TABLES:
            table = Table(PROCESS_TABLES[kind], 0 if archive else capacity, kind=kind)
            setattr(_process(session, int(key)), kind, table)
        else:
            raise ValueError(f"unknown series kind {kind!r}")
        if archive is not None:
            table.set_archive(archive)
    return table


def extend_series(session: Session, kind: str, key: str, columns: dict[str, np.ndarray]) -> None:
    """Rows of a stored series, in time order, into its table from :func:`series_table`.

    Keeps what the live path keeps as rows arrive: a process's longest span and
    longest peak segment (window queries reach back by them).

    Raises:
        ValueError: A phase row names a phase the session does not know.
    """
    if not columns or not len(next(iter(columns.values()))):
        return
    if kind in ("gpu", "gpu_procs"):
        table = getattr(session, kind)[key]
    elif kind == "host":
        table = session.host_table(key)
    else:
        proc = session.processes[int(key)]
        table = getattr(proc, kind)
        if kind == "phases":
            if int(columns["name"].max()) >= len(session.names):
                raise ValueError("unknown phase name")
            proc.max_span = max(proc.max_span, int((columns["t1"] - columns["t0"]).max()))
            proc.tally.phases(columns)
        elif kind == "peaks":
            longest = int((columns["t1"] - columns["t0"]).max())
            proc.max_segment = max(proc.max_segment, longest)
        elif kind == "torch":
            proc.tally.figures(columns)
    table.extend(columns)
    session.touch()
