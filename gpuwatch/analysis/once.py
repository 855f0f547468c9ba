"""What ``gpuwatch --once`` prints, as one plain document built from a session.

The owner of a live session builds it from its own session when asked (the same figures
its dashboard shows, torch's included); without an owner, ``--once`` builds it from a
session that NVML alone filled. Every value is a plain JSON type; None is unknown.
"""

from __future__ import annotations

import math
from typing import Any

from ..fmt import printable
from ..session import Session, is_host
from ..session.table import MISSING_INT
from . import processes as pr

PROCESS_FIELDS = (
    "pid",
    "user",
    "device",
    "gpu_mem",
    "sm",
    "cpu",
    "rss",
    "elapsed",
    "command",
    "rank",
    "phase",
)
"""The keys of each process of the document, in the order the table shows them."""


def _plain(v: Any) -> Any:
    """A JSON value: NaN and the tables' missing integer are None."""
    if isinstance(v, float) and math.isnan(v):
        return None
    if v == MISSING_INT and type(v) is int:
        return None
    return v


def _torch(session: Session, key: str) -> tuple[int | None, int | None, list[str]]:
    """Allocated and reserved bytes torch reports on GPU ``key`` (summed over the running
    instrumented processes), and their innermost open phases (``rank N: name``)."""
    allocated = reserved = None
    phases: list[str] = []
    for proc in session.running():
        on = [i for i, k in proc.devices.items() if k == key]
        if not on:
            continue
        for i in on:
            figures = proc.tally.torch.get(i)
            if figures is None:
                continue
            a, r = _plain(int(figures[0])), _plain(int(figures[1]))
            if a is not None:
                allocated = (allocated or 0) + a
            if r is not None:
                reserved = (reserved or 0) + r
        spans = list(proc.open.values())
        if spans:
            name = max(spans, key=lambda o: o.depth).name
            rank = proc.hello.get("rank")
            who = f"rank {rank}" if type(rank) is int else f"pid {proc.pid}"
            phases.append(f"{who}: {name}")
    return allocated, reserved, phases


def gpus(session: Session) -> list[dict[str, Any]]:
    """One entry per GPU, in NVML's order: its newest sample and torch's figures."""
    out = []
    devices = [d for d in session.devices.values() if d.kind == "gpu" and not is_host(d.key)]
    for dev in sorted(devices, key=lambda d: (d.index is None, d.index or 0, d.key)):
        table = session.gpu.get(dev.key)
        sample = (table.last() if table is not None else None) or {}
        allocated, reserved, phases = _torch(session, dev.key)
        out.append(
            {
                "index": dev.index,
                "name": dev.name,
                "uuid": dev.uuid,
                "state": dev.state,
                "used": _plain(sample.get("used")),
                "total": _plain(sample.get("total")) or dev.total,
                "util": _plain(sample.get("util_gpu")),
                "temp": _plain(sample.get("temp")),
                "power": _plain(sample.get("power")),
                "power_limit": _plain(sample.get("power_limit")),
                "torch_allocated": allocated,
                "torch_reserved": reserved,
                "phases": phases,
            }
        )
    return out


def document(session: Session, source: str) -> dict[str, Any]:
    """The whole ``--once`` document: ``source`` says where the figures come from."""
    rows = pr.rows(session)
    procs = []
    for row in rows:
        if not row.listed:
            continue
        entry = {f: _plain(getattr(row, f)) for f in PROCESS_FIELDS}
        entry["pid"] = row.shown_pid
        procs.append(entry)
    unattributed = [{"gpu": label, "bytes": n} for label, n in pr.unattributed(session, None, rows)]
    return {
        "source": source,
        "time_ns": session.now() + session.wall_offset,
        "gpus": gpus(session),
        "processes": procs,
        "unattributed": unattributed,
        "notes": list(session.notes),
    }


_GPU_TEXT = ("name", "uuid", "state")
_GPU_NUMBERS = (
    "index",
    "used",
    "total",
    "util",
    "temp",
    "power",
    "power_limit",
    "torch_allocated",
    "torch_reserved",
)
_PROCESS_TEXT = ("user", "device", "command", "phase")
_TEXT_MAX = 4096


def _number(v: Any) -> int | float | None:
    if type(v) is bool or not isinstance(v, int | float):
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _text(v: Any) -> str | None:
    return printable(v[:_TEXT_MAX]) if isinstance(v, str) else None


def _texts(v: Any, limit: int = 256) -> list[str]:
    return (
        [printable(x[:_TEXT_MAX]) for x in v[:limit] if isinstance(x, str)]
        if isinstance(v, list)
        else []
    )


def _entries(v: Any, limit: int = 65536) -> list[dict[str, Any]]:
    return [e for e in v[:limit] if isinstance(e, dict)] if isinstance(v, list) else []


def clean(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (another process's answer: hostile) with only the document's own fields, of
    their own types; strings made printable, what does not fit None."""
    gpus = [
        {
            **{k: _text(g.get(k)) for k in _GPU_TEXT},
            **{k: _number(g.get(k)) for k in _GPU_NUMBERS},
            "phases": _texts(g.get("phases")),
        }
        for g in _entries(doc.get("gpus"), 1024)
    ]
    procs = [
        {f: _text(p.get(f)) if f in _PROCESS_TEXT else _number(p.get(f)) for f in PROCESS_FIELDS}
        for p in _entries(doc.get("processes"))
    ]
    unattributed = [
        {"gpu": _text(u.get("gpu")), "bytes": _number(u.get("bytes"))}
        for u in _entries(doc.get("unattributed"), 1024)
    ]
    return {
        "source": _text(doc.get("source")) or "",
        "time_ns": _number(doc.get("time_ns")),
        "gpus": gpus,
        "processes": procs,
        "unattributed": unattributed,
        "notes": _texts(doc.get("notes")),
    }
