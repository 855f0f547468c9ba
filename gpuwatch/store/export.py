"""``gpuwatch export``: a recording as flat tables (CSV or JSON lines) for pandas / polars.

Every table has raw monotonic times in ns (``t``, ``t0``, ``t1``: the session's one clock)
and the same times in seconds from the session's start (``time_s``, ``start_s``, ``end_s``).
Unknown values are empty in CSV and ``null`` in JSON lines. ``docs/recording.md`` lists
the columns.

The tables of samples are streamed (:class:`Stream`): one chunk of the recording at a
time, so a recording of days is exported in bounded memory.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from ..session import MISSING_INT, Process, Session, Table
from ..session.model import GPU_COLUMNS, HOST_COLUMNS, PHASE_COLUMNS
from ._schema import SERIES
from .multi import Opened

Columns = dict[str, list[Any]]


@dataclass
class Stream:
    """A table given in pieces: its column names, then its rows, a piece at a time."""

    names: list[str]
    pieces: Iterable[Columns]


def _list(col: np.ndarray) -> list[Any]:
    """A column as Python values, unknowns (missing ints, NaN) as None."""
    if col.dtype.kind == "i":
        values: list[Any] = col.tolist()
        if (col == MISSING_INT).any():
            return [None if v == MISSING_INT else v for v in values]
        return values
    if col.dtype.kind == "f":
        return [None if math.isnan(v) else v for v in col.tolist()]
    out: list[Any] = col.tolist()
    return out


def _seconds(t: np.ndarray, origin: int) -> list[float | None]:
    s = np.round((t - origin) / 1e9, 9)
    if t.dtype.kind == "i" and (t == MISSING_INT).any():
        missing = (t == MISSING_INT).tolist()
        return [None if m else v for v, m in zip(s.tolist(), missing, strict=True)]
    seconds: list[float | None] = s.tolist()
    return seconds


def _meta(src: Opened, s: Session) -> Columns:
    if not src.merged:
        rec = src.recordings[0]
        keys = sorted(rec.meta)
        return {"key": keys, "value": [rec.meta[k] for k in keys]}
    # Several files: one row per file and key, with the file's origin and its time shift.
    out: Columns = {"origin": [], "key": [], "value": []}
    for rec, part in zip(src.recordings, src.parts, strict=True):
        meta = {**rec.meta, "file": str(rec.path), "shift_ns": str(part.shift)}
        for key in sorted(meta):
            out["origin"].append(part.origin)
            out["key"].append(key)
            out["value"].append(meta[key])
    return out


def _devices(src: Opened, s: Session) -> Columns:
    names = ("key", "kind", "index", "name", "uuid", "bus_id", "total", "state", "note", "source")
    devices = list(s.devices.values())
    out: Columns = {n: [getattr(d, n) for d in devices] for n in names}
    migs = [d.mig for d in devices]  # a MIG instance: its GPU's key and its slot
    out["mig_parent"] = [m[0] if m else None for m in migs]
    out["mig_slot"] = [m[1] if m else None for m in migs]
    return out


def _per_device(
    kind: str, build: Callable[[Session, dict[str, np.ndarray]], Columns]
) -> Callable[[Opened, Session], Stream]:
    """A table of every GPU's rows of one kind, with a ``device`` column first."""

    def table(src: Opened, s: Session) -> Stream:
        tables = list(getattr(s, kind).items()) or [("", Table(SERIES[kind][0]))]

        def pieces() -> Iterator[Columns]:
            for key, tab in tables:
                for c in tab.batches():
                    part: Columns = {"device": [key] * len(c["t"])}
                    part.update(build(s, c))
                    yield part

        empty = Table(SERIES[kind][0]).snapshot()
        return Stream(["device", *build(s, empty)], pieces())

    return table


def _gpu(s: Session, c: dict[str, np.ndarray]) -> Columns:
    out = {"t": _list(c["t"]), "time_s": _seconds(c["t"], s.t_origin)}
    out.update({name: _list(c[name]) for name, _ in GPU_COLUMNS[1:]})
    return out


def _gpu_processes(s: Session, c: dict[str, np.ndarray]) -> Columns:
    out = {"t": _list(c["t"]), "time_s": _seconds(c["t"], s.t_origin)}
    out.update({n: _list(c[n]) for n in ("pid", "used", "type", "sm", "mem_util", "cpu", "rss")})
    return out


def _host(src: Opened, s: Session) -> Stream:
    tables = list(s.hosts.items()) or [("", Table(SERIES["host"][0]))]

    def build(key: str, c: dict[str, np.ndarray]) -> Columns:
        # Merged files have a host each: say which, as the GPU tables do.
        out: Columns = {"device": [key] * len(c["t"])} if src.merged else {}
        out.update({"t": _list(c["t"]), "time_s": _seconds(c["t"], s.t_origin)})
        out.update({n: _list(c[n]) for n, _ in HOST_COLUMNS[1:]})
        return out

    def pieces() -> Iterator[Columns]:
        for key, tab in tables:
            for c in tab.batches():
                yield build(key, c)

    return Stream(list(build("", Table(SERIES["host"][0]).snapshot())), pieces())


def _per_process(
    kind: str, build: Callable[[Session, Process, dict[str, np.ndarray]], Columns]
) -> Callable[[Opened, Session], Stream]:
    """A table of every process's rows of one kind, with a ``pid`` column first."""

    def table(src: Opened, s: Session) -> Stream:
        procs = list(s.processes.values()) or [Process(0)]  # no processes: just the header

        def pieces() -> Iterator[Columns]:
            for p in procs:
                tab = getattr(p, kind)
                for c in tab.batches():
                    part: Columns = {"pid": [p.pid] * len(c[tab.time])}
                    part.update(build(s, p, c))
                    yield part

        empty = getattr(Process(0), kind).snapshot()
        return Stream(["pid", *build(s, Process(0), empty)], pieces())

    return table


def _device_keys(p: Process, dev: np.ndarray) -> list[str | None]:
    return [p.devices.get(d) for d in dev.tolist()]


def _torch(s: Session, p: Process, c: dict[str, np.ndarray]) -> Columns:
    return {
        "device": _device_keys(p, c["dev"]),
        "dev": _list(c["dev"]),
        "t": _list(c["t"]),
        "time_s": _seconds(c["t"], s.t_origin),
        "allocated": _list(c["allocated"]),
        "reserved": _list(c["reserved"]),
        "inactive_split": _list(c["inactive_split"]),
        "alloc_retries": _list(c["alloc_retries"]),
        "alloc_ooms": _list(c["alloc_ooms"]),
    }


def _peaks(s: Session, p: Process, c: dict[str, np.ndarray]) -> Columns:
    return {
        "device": _device_keys(p, c["dev"]),
        "dev": _list(c["dev"]),
        "t0": _list(c["t0"]),
        "t1": _list(c["t1"]),
        "start_s": _seconds(c["t0"], s.t_origin),
        "end_s": _seconds(c["t1"], s.t_origin),
        "peak_allocated": _list(c["peak_allocated"]),
        "peak_reserved": _list(c["peak_reserved"]),
    }


def _rss(s: Session, p: Process, c: dict[str, np.ndarray]) -> Columns:
    out = {"t": _list(c["t"]), "time_s": _seconds(c["t"], s.t_origin)}
    return out | {"rss": _list(c["rss"]), "cpu": _list(c["cpu"])}


def _phases(s: Session, p: Process, c: dict[str, np.ndarray]) -> Columns:
    out: Columns = {
        "name": [s.names[n] for n in c["name"].tolist()],
        "device": _device_keys(p, c["dev"]),
        "start_s": _seconds(c["t0"], s.t_origin),
        "end_s": _seconds(c["t1"], s.t_origin),
        "duration_s": np.round((c["t1"] - c["t0"]) / 1e9, 9).tolist(),
    }
    out.update({n: _list(c[n]) for n, _ in PHASE_COLUMNS if n != "name"})
    return out


def _open_phases(src: Opened, s: Session) -> Columns:
    names = ("id", "name", "t0", "step", "depth", "parent", "dev", "alloc0", "reserved0")
    rows = [(p.pid, o) for p in s.processes.values() for o in p.open.values()]
    out: Columns = {"pid": [pid for pid, _ in rows]}
    out.update({n: [getattr(o, n) for _, o in rows] for n in names})
    out["start_s"] = [round((o.t0 - s.t_origin) / 1e9, 9) for _, o in rows]
    return out


def _marks(src: Opened, s: Session) -> Columns:
    marks = list(s.every_mark())  # the session keeps the newest: the file has them all
    return {
        "pid": [m.pid for m in marks],
        "t": [m.t for m in marks],
        "time_s": [round((m.t - s.t_origin) / 1e9, 9) for m in marks],
        "level": [m.level for m in marks],
        "step": [m.step for m in marks],
        "text": [m.text for m in marks],
    }


_OOM_FIELDS = ("phase", "step", "requested", "free", "total", "dev", "allocated", "reserved")


def _ooms(src: Opened, s: Session) -> Columns:
    out: Columns = {
        "pid": [o.pid for o in s.ooms],
        "t": [o.t for o in s.ooms],
        "time_s": [round((o.t - s.t_origin) / 1e9, 9) for o in s.ooms],
    }
    for name in (*_OOM_FIELDS, "peak_allocated", "peak_reserved", "message", "snapshot"):
        out[name] = [o.body.get(name) for o in s.ooms]
    return out


def _processes(src: Opened, s: Session) -> Columns:
    procs = list(s.processes.values())
    hello = [p.hello for p in procs]
    return {
        "pid": [p.pid for p in procs],
        "label": [p.label for p in procs],
        "argv": [json.dumps(h.get("argv")) if h.get("argv") is not None else None for h in hello],
        "hostname": [h.get("hostname") for h in hello],
        "rank": [h.get("rank") for h in hello],
        "local_rank": [h.get("local_rank") for h in hello],
        "world_size": [h.get("world_size") for h in hello],
        "python": [h.get("python") for h in hello],
        "torch": [h.get("torch") for h in hello],
        "devices": [json.dumps({str(k): v for k, v in p.devices.items()}) for p in procs],
        "first_t": [p.first_t for p in procs],
        "last_t": [p.last_t for p in procs],
        "ended_t": [p.ended for p in procs],
        "exit_code": [p.exit_code for p in procs],
        "dropped": [p.dropped for p in procs],
        "gaps": [p.gaps for p in procs],
        "rejected": [p.rejected for p in procs],
        "facts": [json.dumps(p.facts) if p.facts is not None else None for p in procs],
    }


def _process_info(src: Opened, s: Session) -> Columns:
    items = list(s.proc_info.items())
    keys = sorted({k for _, info in items for k in info})
    out: Columns = {"pid": [pid for pid, _ in items]}
    out.update({k: [info.get(k) for _, info in items] for k in keys})
    return out


def _events(src: Opened, s: Session) -> Columns:
    events = []
    for rec, part in zip(src.recordings, src.parts, strict=True):
        for e in rec.events():
            e["t"] += part.shift
            e["pid"] = part.pids.get(e["pid"], e["pid"])
            e["origin"] = part.origin
            events.append(e)
    events.sort(key=lambda e: e["t"])
    out: Columns = {"origin": [e["origin"] for e in events]} if src.merged else {}
    return out | {
        "seq": [e["seq"] for e in events],
        "t": [e["t"] for e in events],
        "time_s": [round((e["t"] - s.t_origin) / 1e9, 9) for e in events],
        "kind": [e["kind"] for e in events],
        "pid": [e["pid"] for e in events],
        "body": [json.dumps(e["body"]) for e in events],
    }


def _rejects(src: Opened, s: Session) -> Columns:
    items = sorted(s.rejects.items())
    return {"reason": [k for k, _ in items], "count": [v for _, v in items]}


def _notes(src: Opened, s: Session) -> Columns:
    return {"text": list(s.notes)}


TABLES: dict[str, Callable[[Opened, Session], Columns | Stream]] = {
    "meta": _meta,
    "devices": _devices,
    "gpu": _per_device("gpu", _gpu),
    "gpu_processes": _per_device("gpu_procs", _gpu_processes),
    "host": _host,
    "torch": _per_process("torch", _torch),
    "peaks": _per_process("peaks", _peaks),
    "rss": _per_process("rss", _rss),
    "phases": _per_process("phases", _phases),
    "open_phases": _open_phases,
    "marks": _marks,
    "ooms": _ooms,
    "processes": _processes,
    "process_info": _process_info,
    "events": _events,
    "rejects": _rejects,
    "notes": _notes,
}
"""Export table name -> builder. Keep docs/recording.md in step."""

FORMATS = ("csv", "jsonl")


def table(src: Opened, name: str) -> Columns | Stream:
    """One export table of one recording, or of several merged, as Python values (the
    tables of samples as a :class:`Stream`)."""
    return TABLES[name](src, src.session)


def columns(data: Columns | Stream) -> Columns:
    """A table's columns whole (a stream read to its end: for small tables and tests)."""
    if isinstance(data, dict):
        return data
    out: Columns = {name: [] for name in data.names}
    for piece in data.pieces:
        for name in data.names:
            out[name] += piece[name]
    return out


def _rows(cols: Columns) -> Iterator[tuple[Any, ...]]:
    return zip(*cols.values(), strict=True) if cols else iter(())


def write(data: Columns | Stream, fmt: str, out: IO[str]) -> int:
    """Write one table as CSV (with a header) or JSON lines; returns the number of rows."""
    n = 0
    pieces: Iterable[Columns]
    if isinstance(data, dict):
        names, pieces = list(data), [data]
    else:
        names, pieces = data.names, data.pieces
    writer = csv.writer(out, lineterminator="\n") if fmt == "csv" else None
    if writer is not None:
        writer.writerow(names)
    for cols in pieces:
        for row in _rows(cols):
            if writer is not None:
                writer.writerow(["" if v is None else v for v in row])
            else:
                out.write(json.dumps(dict(zip(names, row, strict=True)), default=str) + "\n")
            n += 1
    return n


__all__ = ["FORMATS", "TABLES", "Stream", "columns", "table", "write"]
