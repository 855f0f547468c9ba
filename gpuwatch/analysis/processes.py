"""The Processes tab's rows: every process on each GPU and every instrumented one, at a time.

A row joins what NVML listed (GPU memory, SM %), what the host said of the process (CPU %,
RSS, user, command, parent, start) and, for an instrumented process, its rank and phase.
Sorting, filtering and the tree (a launcher above its workers, by parent pid) are here
too, so the dashboard only draws them. :func:`unattributed` says how much used memory NVML
attributes to no listed process (other containers, or no permission to list them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..session import Process, Session, is_host
from ..session.decimate import column_edges
from ..session.table import MISSING_INT
from .rank_feed import rank_of

COLUMNS: tuple[tuple[str, str], ...] = (
    ("pid", "pid"),
    ("user", "user"),
    ("device", "GPU"),
    ("gpu_mem", "GPU mem"),
    ("sm", "SM%"),
    ("cpu", "CPU%"),
    ("rss", "host RSS"),
    ("elapsed", "elapsed"),
    ("rank", "rank"),
    ("phase", "phase"),
    ("command", "command"),
)
"""Column key -> heading, in display order; every key is a sort key."""

UNATTRIBUTED_MIN = 1 << 30
"""Used bytes NVML attributes to no listed process before the tab says so (below it: the
driver's and contexts' own memory, rounding)."""


@dataclass(slots=True)
class ProcRow:
    """One process as the tab shows it (None: unknown or not applicable)."""

    pid: int
    shown_pid: int  # the pid on its host (a merged replay renumbers clashing ones)
    user: str | None = None
    uid: int | None = None
    device: str = ""  # "GPU 0", "host"
    device_key: str | None = None
    gpu_mem: int | None = None
    sm: float | None = None
    cpu: float | None = None
    rss: int | None = None
    elapsed: float | None = None  # seconds
    started: float | None = None  # wall seconds
    command: str = ""
    name: str = ""
    rank: int | None = None
    phase: str | None = None
    container_pid: int | None = None
    ppid: int | None = None
    visible: bool = True
    instrumented: bool = False
    listed: bool = True  # False: a launcher shown only in the tree
    depth: int = 0  # in the tree
    branch: str = ""  # the tree's drawing before the command ("├─ ")
    extra: dict[str, Any] = field(default_factory=dict)

    def text(self) -> str:
        """Everything the filter matches, lower case."""
        parts = [
            str(self.shown_pid),
            self.user or "",
            self.device,
            self.command,
            self.name,
            self.phase or "",
            "" if self.rank is None else f"rank {self.rank}",
        ]
        return " ".join(parts).lower()


class RowCache:
    """What :func:`rows` built at its last call, for the next one (a dashboard refreshes
    hundreds of rows a second, nearly all as they were).

    A GPU's process list is taken from its table again only when the table grew or the
    time asked changed; a row is built again only when what it shows of its process
    changed (its description, hello, or NVML's and the host's figures). A row reused is
    the same object, its elapsed time, phase and rank brought up to date: the rows of one
    call are the caller's until its next call with the same cache.
    """

    def __init__(self) -> None:
        self.lists: dict[str, tuple[tuple[int, int, int], list[tuple[Any, ...]]]] = {}
        self.rows: dict[tuple[str, int], tuple[tuple[Any, ...], ProcRow]] = {}


def rows(session: Session, at: int | None = None, cache: RowCache | None = None) -> list[ProcRow]:
    """Every process on each GPU at ``at`` (the newest lists when None), then every
    instrumented process not on a GPU that runs then.

    ``cache``: the one given to the previous call, to reuse what did not change."""
    s = session
    now = s.now() if at is None else at
    ctx = _Build(
        wall=(now + s.wall_offset) / 1e9,
        known=cache.lists if cache is not None else {},
        old=cache.rows if cache is not None else {},
    )
    out: list[ProcRow] = []
    seen: set[int] = set()
    for key, table in sorted(s.gpu_procs.items()):
        dev = s.devices.get(key)
        listed = _listed(table, key, at, ctx) if dev is not None else None
        where = _where(dev) if dev is not None else ""
        for figures in listed or ():
            if figures[0] == 0:  # an empty snapshot
                continue
            seen.add(figures[0])
            out.append(_gpu_row(s, key, where, figures, at, ctx))
    for pid, proc in list(s.processes.items()):
        row = _host_row(s, pid, proc, at, ctx) if pid not in seen else None
        if row is not None:
            out.append(row)
    if cache is not None:  # only what this call used: the cache holds no process that left
        cache.lists, cache.rows = ctx.lists, ctx.built
    return out


@dataclass(slots=True)
class _Build:
    """One :func:`rows` call's state: the wall time, the cache's lists and rows before it,
    and those it uses (the cache's next)."""

    wall: float
    known: dict[str, tuple[tuple[int, int, int], list[tuple[Any, ...]]]]
    old: dict[tuple[str, int], tuple[tuple[Any, ...], ProcRow]]
    lists: dict[str, tuple[tuple[int, int, int], list[tuple[Any, ...]]]] = field(
        default_factory=dict
    )
    built: dict[tuple[str, int], tuple[tuple[Any, ...], ProcRow]] = field(default_factory=dict)


def _listed(table: Any, key: str, at: int | None, ctx: _Build) -> list[tuple[Any, ...]] | None:
    """GPU ``key``'s process list at ``at`` as (pid, used, sm, cpu, rss) tuples: taken from
    its table again only when the table grew or the time asked changed."""
    newest = table.span()
    t = newest[1] if newest is not None and at is None else at
    if t is None:
        return None
    stamp = (id(table), len(table), t)
    known = ctx.known.get(key)
    if known is not None and known[0] == stamp:
        listed = known[1]
    else:
        snap = table.group_at(t)
        if snap is None:
            return None
        listed = list(
            zip(*(snap[c].tolist() for c in ("pid", "used", "sm", "cpu", "rss")), strict=True)
        )
    ctx.lists[key] = (stamp, listed)
    return listed


def _gpu_row(
    s: Session, key: str, where: str, figures: tuple[Any, ...], at: int | None, ctx: _Build
) -> ProcRow:
    """The row of a process NVML lists on GPU ``key`` (reused while nothing changed)."""
    pid = figures[0]
    info = s.proc_info.get(pid)
    proc = s.processes.get(pid)
    hello, container = (proc.hello, proc.container_pid) if proc is not None else (None, None)
    inputs: tuple[Any, ...] = (info, proc, hello, (where, container, figures))
    row = _reused(ctx.old.get((key, pid)), inputs, ctx.wall)
    if row is None:
        _, used, sm, cpu, rss = figures
        row = _describe(s, pid, ctx.wall)
        row.device, row.device_key = where, key
        row.gpu_mem = _int(used)
        row.sm = _float(sm)
        row.cpu = _float(cpu)
        row.rss = _int(rss)
    else:
        row.rss = _int(figures[4])
    ctx.built[(key, pid)] = (inputs, row)
    _instrumented(s, row, at, proc)
    return row


def _host_row(s: Session, pid: int, proc: Process, at: int | None, ctx: _Build) -> ProcRow | None:
    """The row of an instrumented process on no GPU's list, None when it does not run."""
    if at is None:
        if proc.ended is not None or proc.gone is not None:
            return None
        last = proc.rss.last()
    elif s.runs_at(proc, at):
        last = proc.rss.at(at)
    else:
        return None
    rss = _int(last.get("rss")) if last else None
    cpu = _float(last.get("cpu", math.nan)) if last else None
    inputs = (s.proc_info.get(pid), proc, proc.hello, (proc.origin, proc.container_pid, rss, cpu))
    row = _reused(ctx.old.get(("host", pid)), inputs, ctx.wall)
    if row is None:
        row = _describe(s, pid, ctx.wall)
        row.device = f"{proc.origin} host" if proc.origin else "host"
        row.device_key = "host"
        row.cpu = cpu
    row.rss = rss
    ctx.built[("host", pid)] = (inputs, row)
    _instrumented(s, row, at, proc)
    return row


def _reused(
    known: tuple[tuple[Any, ...], ProcRow] | None, inputs: tuple[Any, ...], wall: float
) -> ProcRow | None:
    """The row built before from the same ``inputs`` (a description, a process and a hello,
    compared by identity: each changes by being replaced; then the figures, by value), its
    elapsed time brought to ``wall``; None when there is none."""
    if known is None:
        return None
    before, row = known
    if (
        before[0] is not inputs[0]
        or before[1] is not inputs[1]
        or before[2] is not inputs[2]
        or before[3] != inputs[3]
    ):
        return None
    if isinstance(row.started, float):
        row.elapsed = max(0.0, wall - row.started)
    return row


_COMMANDS: dict[int, tuple[object, object, str, str]] = {}
"""pid -> (its description, its hello, command, name): a refresh of hundreds of rows joins
no command line again while neither changed (a changed description is a new dict)."""


def _describe(s: Session, pid: int, wall: float) -> ProcRow:
    info = s.proc_info.get(pid, {})
    proc = s.processes.get(pid)
    hello = proc.hello if proc is not None else None
    cached = _COMMANDS.get(pid)
    if cached is not None and cached[0] is info and cached[1] is hello:
        command, name = cached[2], cached[3]
    else:
        command, name = _command(info, hello)
        if len(_COMMANDS) >= 65536:  # a bound, not a history
            _COMMANDS.clear()
        _COMMANDS[pid] = (info, hello, command, name)
    started = info.get("started")
    container = info.get("container_pid")
    if proc is not None and proc.container_pid is not None:
        container = proc.container_pid
    return ProcRow(
        pid=pid,
        shown_pid=int(info.get("os_pid", pid)),
        user=info.get("user"),
        uid=info.get("uid"),
        started=started,
        elapsed=max(0.0, wall - started) if isinstance(started, float) else None,
        command=command,
        name=name,
        container_pid=container,
        ppid=info.get("ppid"),
        visible=bool(info.get("visible", proc is not None)),
    )


def _command(info: dict[str, Any], hello: dict[str, Any] | None) -> tuple[str, str]:
    """The command line and name of a process, from psutil's description or its hello."""
    argv = (hello.get("argv") if hello else None) or []
    command = info.get("cmdline") or argv
    if isinstance(command, list):
        command = " ".join(str(c) for c in command)
    name = info.get("name") or (str(argv[0]).rsplit("/", 1)[-1] if argv else "")
    return str(command), str(name)


def _instrumented(s: Session, row: ProcRow, at: int | None, proc: Process | None) -> None:
    if proc is None:
        return
    row.instrumented = True
    ranked = rank_of(proc)
    if ranked is None and type(proc.hello.get("rank")) is int:
        ranked = (proc.hello["rank"], 1)
    row.rank = None if ranked is None else ranked[0]
    if at is None:  # live: the innermost open phase (reading no table)
        spans = list(proc.open.values())
        row.phase = max(spans, key=lambda o: o.depth).name if spans else None
    else:
        row.phase = s.phase_at(proc, at)
    if row.rss is None:
        last = proc.rss.last() if at is None else proc.rss.at(at)
        if last:
            row.rss = _int(last.get("rss"))


def unattributed(
    session: Session, at: int | None = None, listed_rows: Sequence[ProcRow] | None = None
) -> list[tuple[str, int]]:
    """(GPU label, bytes) for each GPU whose used memory exceeds what NVML attributes to
    its listed processes by :data:`UNATTRIBUTED_MIN` or more, at ``at`` (newest: None).

    ``listed_rows``: :func:`rows` of the same time, when the caller has them (the lists
    are then not read again)."""
    s = session
    out = []
    sums: dict[str, int] | None = None
    if listed_rows is not None:
        sums = {}
        for r in listed_rows:
            if r.device_key is not None and r.gpu_mem is not None:
                sums[r.device_key] = sums.get(r.device_key, 0) + r.gpu_mem
    for key, table in sorted(s.gpu.items()):
        dev = s.devices.get(key)
        if dev is None or is_host(key):
            continue
        sample = table.last() if at is None else table.at(at)
        if not sample:
            continue
        used = _int(sample.get("used"))
        if used is None:
            continue
        if sums is not None:
            rest = used - sums.get(key, 0)
            if rest >= UNATTRIBUTED_MIN:
                out.append((_where(dev), rest))
            continue
        procs = s.gpu_procs.get(key)
        newest = procs.span() if procs is not None else None
        t = newest[1] if newest is not None and at is None else at
        snap = procs.group_at(t) if procs is not None and t is not None else None
        listed = 0
        if snap is not None:
            mine = snap["pid"] != 0
            known = snap["used"][mine]
            listed = int(known[known != MISSING_INT].sum())
        rest = used - listed
        if rest >= UNATTRIBUTED_MIN:
            out.append((_where(dev), rest))
    return out


def gpu_list(labels: Sequence[str]) -> str:
    """``GPU 0–3, 5`` for the labels ``GPU 0`` … ``GPU 5`` (runs of indices joined); labels
    of another form (a merged replay's ``a GPU 0``) as they are."""
    indices = []
    for label in labels:
        word, _, index = label.partition(" ")
        if word != "GPU" or not index.isdigit():
            return ", ".join(labels)
        indices.append(int(index))
    runs: list[list[int]] = []
    for i in sorted(set(indices)):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    parts = [str(a) if a == b else f"{a}–{b}" for a, b in runs]
    return ("GPU " if len(indices) == 1 else "GPUs ") + ", ".join(parts)


def listed_line(
    table: Any, column: str, pid: int, t0: int, t1: int, width: int, now: int
) -> tuple[np.ndarray, np.ndarray]:
    """``pid``'s ``column`` (used bytes, SM %...) over ``[t0, t1]`` in ``width`` columns from
    a GPU's process lists, as (lo, hi).

    A list is stored only when it changes: a process whose figures hold still (a steady
    job) has no newer row than the list it last changed in. While the newest list at
    ``now`` still names it, its figures hold up to ``now`` (a table's own step-hold ends
    at its newest row, and the line would stop there and scroll out of the window).
    """
    lo, hi = table.minmax(column, t0, t1, width, where=("pid", [pid]))
    end = min(t1, now)
    snap = table.group_at(end) if width > 0 and end > t0 else None
    if snap is None:
        return lo, hi
    mine = np.flatnonzero(snap["pid"] == pid)
    if not len(mine) or column not in snap:
        return lo, hi
    value = float(snap[column][mine[0]])
    if value == MISSING_INT or not math.isfinite(value):
        return lo, hi
    edges = column_edges(t0, t1, width)
    since = max(t0, int(snap[table.time][0]))
    cells = (edges[1:] > since) & (edges[:-1] <= end) & ~np.isfinite(hi)
    lo[cells] = hi[cells] = value
    return lo, hi


def sort(items: Sequence[ProcRow], key: str, reverse: bool = False) -> list[ProcRow]:
    """Rows sorted by column ``key``; unknown values last whichever the direction."""
    keyed = [(_key(r, key), r) for r in items]
    known = [(k, r.pid, r) for k, r in keyed if k is not None]
    known.sort(key=lambda e: e[:2], reverse=reverse)
    return [r for _, _, r in known] + [r for k, r in keyed if k is None]


def _key(row: ProcRow, key: str) -> Any:
    if key == "pid":
        return row.shown_pid
    if key == "device":
        return (row.device_key in (None, "host"), row.device)
    value = getattr(row, key)
    if isinstance(value, str):
        return value.lower() if value else None
    return value


def matching(items: Iterable[ProcRow], text: str) -> list[ProcRow]:
    """Rows whose text holds every word of ``text`` (case-insensitive)."""
    words = text.lower().split()
    return [r for r in items if all(w in r.text() for w in words)]


def tree(session: Session, items: Sequence[ProcRow]) -> list[ProcRow]:
    """``items`` (in their order) as a tree by parent pid: each process under its parent,
    with the parents NVML does not list (a launcher: torchrun, accelerate) and the children
    of listed processes that use no GPU and send nothing (a DataLoader's workers) added
    from what the samplers described. A process on two GPUs keeps a row for each, the
    first one carrying its children."""
    by_pid: dict[int, ProcRow] = {}
    for r in items:
        by_pid.setdefault(r.pid, r)
    kids_of = _described_kin(session, by_pid)
    order = _tree_order(items, by_pid, kids_of)
    children: dict[int, list[ProcRow]] = {}
    roots: list[ProcRow] = []
    for r in order:
        if by_pid.get(r.pid) is not r:  # a second GPU's row: beside the first, no children
            roots.append(r)
            continue
        if r.ppid in by_pid and r.ppid != r.pid:
            children.setdefault(r.ppid, []).append(r)
        else:
            roots.append(r)
    out: list[ProcRow] = []
    done: set[int] = set()

    def walk(row: ProcRow, depth: int, lead: str, last: bool) -> None:
        done.add(id(row))
        branch = "" if depth == 0 else lead + ("└─ " if last else "├─ ")
        out.append(replace(row, depth=depth, branch=branch))
        kids = children.get(row.pid, []) if by_pid.get(row.pid) is row else []
        below = "" if depth == 0 else lead + ("   " if last else "│  ")
        kids = [k for k in kids if id(k) not in done]
        for i, kid in enumerate(kids):
            walk(kid, depth + 1, below, i == len(kids) - 1)

    for root in roots:
        walk(root, 0, "", True)
    for r in order:  # parents in a loop (a hostile recording): shown, flat
        if id(r) not in done:
            walk(r, 0, "", True)
    return out


def _described_kin(session: Session, by_pid: dict[int, ProcRow]) -> dict[int, list[ProcRow]]:
    """Add to ``by_pid`` the parents described but not listed (one level up: a launcher's
    own parent is a shell) and the children the samplers found under a listed process (its
    description's "children"); returns the latter by their parent's pid."""
    wall = (session.now() + session.wall_offset) / 1e9
    for r in list(by_pid.values()):
        ppid = r.ppid
        if ppid and ppid not in by_pid and ppid in session.proc_info:
            launcher = _describe(session, ppid, wall)
            launcher.listed = False
            launcher.device = ""
            by_pid[ppid] = launcher
    kids_of: dict[int, list[ProcRow]] = {}
    for r in list(by_pid.values()):
        if not r.listed:
            continue
        for kid in _children(session.proc_info.get(r.pid)):
            if kid not in by_pid and kid in session.proc_info:
                worker = _describe(session, kid, wall)
                worker.listed = False
                worker.device = ""
                worker.ppid = r.pid
                by_pid[kid] = worker
                kids_of.setdefault(r.pid, []).append(worker)
    return kids_of


def _tree_order(
    items: Sequence[ProcRow], by_pid: dict[int, ProcRow], kids_of: dict[int, list[ProcRow]]
) -> list[ProcRow]:
    """The rows in their sorted order, a launcher in the place of its first child and a
    process's described children right after it."""
    order: list[ProcRow] = []
    placed: set[int] = set()
    for r in items:
        parent = by_pid.get(r.ppid) if r.ppid is not None else None
        if parent is not None and not parent.listed and parent.pid not in placed:
            placed.add(parent.pid)
            order.append(parent)
        order.append(r)
        if by_pid.get(r.pid) is r:
            order += kids_of.pop(r.pid, [])
    return order


MAX_CHILDREN = 64
"""Children of one process shown at most (a description is hostile in a recording)."""


def _children(info: dict[str, Any] | None) -> list[int]:
    """The child pids a description names (none where it names none, or not as pids)."""
    kids = info.get("children") if info else None
    if type(kids) is not list:
        return []
    return [k for k in kids[:MAX_CHILDREN] if type(k) is int and k > 0]


def _where(dev: Any) -> str:
    return f"{dev.origin} GPU {dev.index}" if dev.origin else f"GPU {dev.index}"


def _int(v: Any) -> int | None:
    if v is None:
        return None
    v = int(v)
    return None if v == MISSING_INT or v < 0 else v


def _float(v: Any) -> float | None:
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None
