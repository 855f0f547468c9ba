"""``gpuwatch info``: what a recording holds, as a dict (``--json``) or a short report.

Read in pieces (a chunk of the recording at a time) and from the chunk index (each
chunk's maximum), so a recording of days is summarised in bounded memory.
"""

from __future__ import annotations

import datetime
from collections import Counter
from typing import Any

import numpy as np

from ..analysis.explain import explain_process, format_predicted, predicted_json
from ..analysis.forecast import outcomes
from ..analysis.rank_feed import RankFeed
from ..analysis.rank_table import format_ranks, ranks_from_json
from ..fmt import ellipsis, first_line, fmt_bytes, fmt_duration, fmt_oom_sizes, printable
from ..session import MISSING_INT, Process, Session, Table
from ..session.openspans import MAX_OPEN
from .multi import Opened
from .recording import Recording


def _max(values: np.ndarray) -> int | None:
    """Largest known value of an int column, or None."""
    known = values[values != MISSING_INT]
    return int(known.max()) if len(known) else None


def _max_during(t: np.ndarray, v: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> int | None:
    """Largest value of a step-hold signal while any of the spans ``[t0, t1]`` ran.

    The sample in effect when a span began counts, as does every sample inside it.
    """
    if len(t) == 0 or len(t0) == 0:
        return None
    i0 = np.clip(np.searchsorted(t, t0, "right") - 1, 0, None)
    i1 = np.searchsorted(t, t1, "right")
    keep = i1 > i0
    cover = np.zeros(len(t) + 1, np.int64)
    np.add.at(cover, i0[keep], 1)
    np.add.at(cover, i1[keep], -1)
    inside = np.cumsum(cover[:-1]) > 0
    return _max(v[inside])


def _merge_max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


def summarize(rec: Recording, session: Session) -> dict[str, Any]:
    """Devices, duration, processes, phases per name with their peaks, OOMs, rejects.

    Args:
        rec: The open recording (for its metadata).
        session: Its fully loaded session.
    """
    first, last = session.time_range()
    out = _file(rec)
    out.update(_extent(session, first, last))
    out["bytes"] = rec.file_size()
    out.update(_content(session))
    return out


def summarize_opened(opened: Opened) -> dict[str, Any]:
    """:func:`summarize` of one file, or of several merged: ``files`` then the content.

    Each entry of ``files`` says where that recording lies on the merged time axis
    (``start_s`` / ``end_s``) and how far it was shifted to get there (``shift_s``).
    """
    if not opened.merged:
        return summarize(opened.recordings[0], opened.session)
    s = opened.session
    files = []
    for rec, part in zip(opened.recordings, opened.parts, strict=True):
        entry = _file(rec)
        entry["origin"] = part.origin
        entry["shift_s"] = round(part.shift / 1e9, 6)
        entry.update(_extent(s, *part.span))
        entry["bytes"] = rec.file_size()
        files.append(entry)
    out: dict[str, Any] = {"files": files}
    out.update(_extent(s, *s.time_range()))
    out["bytes"] = sum(f["bytes"] for f in files)
    out.update(_content(s))
    return out


def _file(rec: Recording) -> dict[str, Any]:
    created = int(rec.meta.get("created_wall_ns", "0") or 0)
    return {
        "file": str(rec.path),
        "format": rec.meta.get("format"),
        "schema": int(rec.meta["schema"]),
        "label": rec.label,
        "host": rec.meta.get("host"),
        "gpuwatch_version": rec.meta.get("gpuwatch_version"),
        "created": datetime.datetime.fromtimestamp(created / 1e9, datetime.timezone.utc)
        .isoformat(timespec="seconds")
        .replace("+00:00", "Z"),
        "complete": rec.complete,
    }


def _extent(s: Session, first: int, last: int) -> dict[str, float]:
    return {
        "start_s": round((first - s.t_origin) / 1e9, 6),
        "end_s": round((last - s.t_origin) / 1e9, 6),
        "duration_s": round((last - first) / 1e9, 6),
    }


def _content(s: Session) -> dict[str, Any]:
    origin = s.t_origin

    def rel(t: int) -> float:
        return round((t - origin) / 1e9, 6)

    out: dict[str, Any] = {}
    devices = []
    for key, dev in s.devices.items():
        table = s.hosts.get(key) if dev.kind == "host" else s.gpu.get(key)
        top = table.max_between("used") if table is not None else None
        entry = {
            "key": key,
            "kind": dev.kind,
            "index": dev.index,
            "name": dev.name,
            "uuid": dev.uuid,
            "total": dev.total,
            "state": dev.state,
            "source": dev.source,
            "samples": len(table) if table is not None else 0,
            "used_max": int(top[1]) if top is not None else None,
        }
        if dev.origin:
            entry["origin"] = dev.origin
        devices.append(entry)
    out["devices"] = devices
    explained: dict[int, Any] = {}
    out["processes"] = []
    phases: dict[str, dict[str, Any]] = {}
    for p in s.processes.values():
        # A process at a time, all its figures at once: what reading its series woke
        # (their chunk indexes) is let go of before the next.
        out["processes"].append(_process(s, p, rel, explained))
        _fold_process(s, p, phases)
        _rest(p)
    out["phases"] = dict(sorted(phases.items(), key=lambda kv: -kv[1]["count"]))
    out["marks"] = s.mark_count()
    out["forecasts"] = [
        {
            "t_s": rel(o.t),
            "pid": o.pid,
            "text": o.text,
            "outcome": o.outcome,
            "came_true": o.came_true,
        }
        for o in outcomes(s)
    ]
    out["ooms"] = [
        {
            "t_s": rel(o.t),
            "pid": o.pid,
            "phase": o.body.get("phase"),
            "step": o.body.get("step"),
            "requested": _size(o.body.get("requested")),
            "free": _size(o.body.get("free")),
            "allocated": _size(o.body.get("allocated")),
            "reserved": _size(o.body.get("reserved")),
            "message": first_line(o.body.get("message"), 200),
        }
        for o in s.ooms
    ]
    out["rejects"] = dict(s.rejects)
    out["rejected"] = sum(s.rejects.values())
    out["dropped"] = sum(p.dropped for p in s.processes.values())
    out["gaps"] = sum(p.gaps for p in s.processes.values())
    out["abandoned_phases"] = sum(p.abandoned for p in s.processes.values())
    # The ranks of each job side by side (docs/ranks.md), from the explanations above.
    feed = RankFeed(explain=lambda _, p: explained.get(p.pid))
    out["ranks"] = [r.to_json() for r in feed.tables(s)]
    out["notes"] = list(s.notes)
    return out


def _process(s: Session, p: Process, rel: Any, explained: dict[int, Any]) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    # A step is an optimizer step: the client advances its step counter when one ends, so
    # phases after it (zero_grad) already carry the next number.
    opt = [i for i, name in enumerate(s.names) if name.lower().startswith("optimizer")]
    opt_steps: list[np.ndarray] = []
    any_steps: list[np.ndarray] = []
    for cols in p.phases.batches(columns=("name", "step")):
        ids, n = np.unique(cols["name"], return_counts=True)
        counts.update({s.names[int(i)]: int(c) for i, c in zip(ids, n, strict=True)})
        known = cols["step"] != MISSING_INT
        mask = known & np.isin(cols["name"], opt)
        opt_steps.append(np.unique(cols["step"][mask]))
        any_steps.append(np.unique(cols["step"][known]))
    steps = np.unique(np.concatenate([np.zeros(0, np.int64), *opt_steps]))
    if not len(steps):
        steps = np.unique(np.concatenate([np.zeros(0, np.int64), *any_steps]))
    out = {
        "pid": p.pid,
        "container_pid": p.container_pid,  # its own pid, when it runs in a container
        "label": p.label,
        "argv": p.hello.get("argv"),
        "rank": p.hello.get("rank"),
        "world_size": p.hello.get("world_size"),
        "torch": p.hello.get("torch"),
        "devices": sorted(set(p.devices.values())),
        "start_s": rel(p.first_t),
        "end_s": rel(p.ended) if p.ended is not None else None,
        "exit_code": p.exit_code,
        "steps": len(np.unique(steps)),
        "last_step": int(steps.max()) if len(steps) else None,
        "phases": dict(sorted(counts.items())),
        "open_phases": sorted(o.name for o in p.open.values()),
        "abandoned_phases": p.abandoned,
        # The exact peaks between boundaries are allocated figures too, and the highest.
        "allocated_max": _merge_max(
            _top(p.torch.max_between("allocated")), _top(p.peaks.max_between("peak_allocated"))
        ),
        "rss_max": _top(p.rss.max_between("rss")),
        "dropped": p.dropped,
        "gaps": p.gaps,
        "rejected": p.rejected,
    }
    if p.origin:  # merged: which recording, and its own pid if renumbered
        out["origin"] = p.origin
        out["os_pid"] = p.os_pid if p.os_pid is not None else p.pid
    ex = explained[p.pid] = _explain(s, p)
    if ex is not None:
        out["predicted"] = predicted_json(ex)
        out["findings"] = ex.findings
        out["prediction_notes"] = ex.notes
    return out


def _rest(p: Process) -> None:
    """Let go of what reading a process's series kept (their chunk indexes, what they
    decoded): read one process at a time, a recording of thousands of processes is
    summarised in the memory of one."""
    for kind in ("torch", "peaks", "rss", "phases"):
        sleep = getattr(getattr(p, kind).archive, "sleep", None)
        if sleep is not None:
            sleep()


def _explain(s: Session, p: Process) -> Any:
    """The process's phases explained; None without facts (or facts it cannot use)."""
    try:
        return explain_process(s, p)
    except Exception as exc:  # facts come from a script: say so, never fail the report
        s.note(f"{p.label}: facts could not be predicted ({type(exc).__name__})")
        return None


NAME_WIDTH = 40
"""Widest phase name column of ``info``'s text (a notebook cell's first line is longer)."""

_REPORTED = (("peak_allocated", "peak_alloc"), ("peak_reserved", "peak_reserved"))


def _size(v: Any) -> int | None:
    """A byte count from an OOM's body (the recording's word): None unless a whole,
    non-negative number."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _top(found: tuple[int, float] | None) -> int | None:
    return None if found is None else int(found[1])


def _around(table: Table, t0: np.ndarray, t1: np.ndarray, column: str) -> dict[str, np.ndarray]:
    """The rows of ``table`` a step-hold maximum over spans ``[t0, t1]`` needs."""
    return table.between(int(t0.min()), int(t1.max()), pad=1, columns=("t", column))


def _fold_process(s: Session, p: Process, out: dict[str, dict[str, Any]]) -> None:
    """Add a process's phases to the figures per phase name, over all processes: count,
    time, reported peaks, NVML and RSS max."""
    for cols in p.phases.batches():
        if len(cols["t0"]):
            _fold_phases(s, p, cols, out)


def _fold_phases(
    s: Session, p: Process, cols: dict[str, np.ndarray], out: dict[str, dict[str, Any]]
) -> None:
    """Add one piece of a process's phases to :func:`_phases`' figures."""
    rss = _around(p.rss, cols["t0"], cols["t1"], "rss")
    gpus = {}
    for key in set(p.devices.values()):
        table = s.gpu.get(key)
        if table is not None:
            gpus[key] = _around(table, cols["t0"], cols["t1"], "used")
    for nid in np.unique(cols["name"]):
        sel = cols["name"] == nid
        name = s.names[int(nid)]
        t0, t1 = cols["t0"][sel], cols["t1"][sel]
        entry = out.setdefault(
            name,
            {
                "count": 0,
                "total_s": 0.0,
                "max_s": 0.0,
                "peak_allocated": None,
                "peak_reserved": None,
                "nvml_used_max": None,
                "rss_max": None,
            },
        )
        dur = (t1 - t0) / 1e9
        entry["count"] += int(sel.sum())
        entry["total_s"] = round(entry["total_s"] + float(dur.sum()), 6)
        entry["max_s"] = round(max(entry["max_s"], float(dur.max())), 6)
        for field, column in (
            ("peak_allocated", "peak_alloc"),
            ("peak_reserved", "peak_reserved"),
        ):
            entry[field] = _merge_max(entry[field], _max(cols[column][sel]))
        for g in gpus.values():
            entry["nvml_used_max"] = _merge_max(
                entry["nvml_used_max"], _max_during(g["t"], g["used"], t0, t1)
            )
        entry["rss_max"] = _merge_max(entry["rss_max"], _max_during(rss["t"], rss["rss"], t0, t1))


def format_summary(info: dict[str, Any]) -> str:
    """The human-readable report of :func:`summarize`'s dict."""
    lines = _header_lines(info)
    lines += _device_lines(info["devices"])
    lines += _process_lines(info["processes"])
    lines += _phase_lines(info["phases"])
    for p in info["processes"]:
        if p.get("predicted"):
            lines += format_predicted(
                p["label"], p["predicted"], p.get("findings", []), p.get("prediction_notes", [])
            )
    for job in info.get("ranks", ()):
        lines += format_ranks(ranks_from_json(job))
    lines += _forecast_lines(info.get("forecasts", []))
    lines += _event_lines(info)
    lines += [f"note: {n}" for n in info["notes"]]
    # Names, labels, argv, notes and paths are the recording's word: no escape, no
    # undecodable byte reaches the terminal (each line is one line on screen).
    return "\n".join(printable(line) for line in lines)


def _header_lines(info: dict[str, Any]) -> list[str]:
    """The file (or the merged files) the report is of."""
    if "files" not in info:
        return _file_lines(info)
    lines = [
        f"{len(info['files'])} recordings merged: {fmt_duration(info['duration_s'] * 1e9)}"
        f" in all, {fmt_bytes(info['bytes'])}"
    ]
    for f in info["files"]:
        lines += _file_lines(f, f"{f['origin']}: ")
        lines.append(
            f"    from {fmt_duration(f['start_s'] * 1e9)} to "
            f"{fmt_duration(f['end_s'] * 1e9)} on the merged clock"
            f" (shifted {f['shift_s']:+.3f} s)"
        )
    return lines


def _device_lines(devices: list[dict[str, Any]]) -> list[str]:
    lines = ["devices"]
    for d in devices:
        where = (
            "host"
            if d["kind"] == "host"
            else f"gpu {d['index'] if d['index'] is not None else '?'}"
        )
        if d.get("origin"):
            where = f"{d['origin']} {where}"
        extra = f" [{d['state']}]" if d["state"] != "ok" else ""
        lines.append(
            f"  {where:6} {d['name'] or d['key']:24} total {fmt_bytes(d['total'])}"
            f"  used max {fmt_bytes(d['used_max'])}  {d['samples']} samples{extra}"
        )
    return lines


def _process_lines(processes: list[dict[str, Any]]) -> list[str]:
    lines = ["processes"]
    for p in processes:
        argv = " ".join(p["argv"] or []) or "?"
        if p["end_s"] is None:
            end = "still running or killed"
        else:
            end = "ended" if p["exit_code"] is None else f"exit {p['exit_code']}"
        label = p["label"]
        if p.get("container_pid") is not None:
            label += f" ({p['container_pid']} in its container)"
        lines.append(
            # A cut command says so, and never runs into the step count.
            f"  {label:10} {ellipsis(argv, 60):60}  {p['steps']} steps, "
            f"{sum(p['phases'].values())} phases, {end}"
        )
    return lines


def _phase_lines(phases: dict[str, dict[str, Any]]) -> list[str]:
    if not phases:
        return []
    # Wide enough for a notebook's cells (``[12] loss.backward()``), cut with a mark.
    wide = max(18, min(NAME_WIDTH, max(len(name) for name in phases)))
    lines = [
        f"{'phases':{wide + 2}} {'count':>7} {'total':>8} {'peak alloc':>11}"
        f" {'peak resv':>11} {'NVML max':>11} {'RSS max':>11}"
    ]
    for name, ph in phases.items():
        lines.append(
            f"  {ellipsis(name, wide):{wide}} {ph['count']:7d}"
            f" {fmt_duration(ph['total_s'] * 1e9):>8}"
            f" {fmt_bytes(ph['peak_allocated']):>11} {fmt_bytes(ph['peak_reserved']):>11}"
            f" {fmt_bytes(ph['nvml_used_max']):>11} {fmt_bytes(ph['rss_max']):>11}"
        )
    return lines


def _forecast_lines(forecasts: list[dict[str, Any]]) -> list[str]:
    """Each shortfall forecast before its phase ran, and whether it came true."""
    if not forecasts:
        return []
    lines = ["forecasts (said before the phase ran)"]
    for f in forecasts:
        lines.append(f"  pid {f['pid']} at {fmt_duration(f['t_s'] * 1e9)}: {f['text']}")
        lines.append(f"    -> {f['outcome']}")
    return lines


def _event_lines(info: dict[str, Any]) -> list[str]:
    """Marks, OOMs and what was refused or lost."""
    rejects = ", ".join(f"{k} {v}" for k, v in info["rejects"].items())
    lines = [
        f"marks {info['marks']} · OOMs {len(info['ooms'])} · rejected {info['rejected']}"
        + (f" ({rejects})" if rejects else "")
        + f" · dropped {info['dropped']} · lost {info['gaps']}"
    ]
    if info.get("abandoned_phases"):
        lines.append(
            f"abandoned {info['abandoned_phases']} phases never ended "
            f"(more than {MAX_OPEN} open in one process)"
        )
    for o in info["ooms"]:
        sizes = fmt_oom_sizes(o)
        lines.append(
            f"  OOM at {fmt_duration(o['t_s'] * 1e9)} pid {o['pid']} in {o['phase'] or '?'}"
            f" (step {o['step']}): " + ", ".join(sizes + ([o["message"]] if o["message"] else []))
        )
    return lines


def _file_lines(f: dict[str, Any], prefix: str = "") -> list[str]:
    state = "complete" if f["complete"] else "incomplete (still written, or interrupted)"
    return [
        f"{prefix}{f['file']}" + (f" — {f['label']}" if f["label"] else ""),
        f"  {fmt_duration(f['duration_s'] * 1e9)} on {f['host']}, started "
        f"{f['created']}, gpuwatch {f['gpuwatch_version']}, {state}, "
        f"{fmt_bytes(f['bytes'])}",
    ]


def one_line(rec: Recording) -> str:
    """``info``'s file line in one line, from the meta table and the chunk index only.

    Milliseconds whatever the recording's length (no chunk is read): what a list of many
    recordings (``gpuwatch serve``'s index) shows for each. Made printable.
    """
    f = _file(rec)
    with rec.reading(transaction=True) as db:
        first, last = db.execute("SELECT min(t_first), max(t_last) FROM chunks").fetchone()
    f["duration_s"] = (last - first) / 1e9 if first is not None and last is not None else 0.0
    f["bytes"] = rec.file_size()
    state = "complete" if f["complete"] else "incomplete"
    line = (
        f"{fmt_duration(f['duration_s'] * 1e9)} on {f['host']}, started {f['created']}, "
        f"{state}, {fmt_bytes(f['bytes'])}" + (f" — {f['label']}" if f["label"] else "")
    )
    return printable(line)
