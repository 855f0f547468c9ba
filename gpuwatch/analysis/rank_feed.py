"""A session's ranks read into rows (:class:`~gpuwatch.analysis.rank_table.RankRow`), one
per rank of a live or replayed session (merged multi-host replays included), and the marks
its new flags leave.

A rank is an instrumented process whose hello names its ``rank`` in a ``world_size`` of two
or more. Its row holds the newest exact peak of each phase (``phase_peaks``), the predicted
peak and the explanation of that phase (``explain_process``; costly, so computed at most
every :data:`EXPLAIN_EVERY` seconds per process while it changes), NVML's newest used
memory of its GPU, and the GPUs where NVML lists its pid although they are not its own
(a stray CUDA context). See docs/ranks.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..session import MISSING_INT, Mark, Process, Session
from ..session.peaks import phase_peaks
from .explain import ProcessExplained, explain_process
from .predicted import first_optimizer_step
from .rank_table import UNEXPLAINED, Flag, RankPhase, RankRow, Ranks, compare

EXPLAIN_EVERY = 5.0
"""Seconds between two explanations of a live process that keeps changing."""

LAST_STEPS = 20
"""Steps back that a phase's newest peak is looked for (an eval every few steps)."""

NEWEST_ROWS = 4096
"""Rows read back from the newest of a table: a GPU's newest process list, a process's
newest phases and figures (its devices, its step)."""

STALE_NS = 10**9
"""A rank whose newest phase ended this long before the newest rank's has stopped
reporting (stuck, or gone): its own step counts, not one at a common moment. A sender
delivers within a quarter second (its longest wait), and a synchronous job's ranks end
a phase together."""

MAX_RANK = 1 << 20
"""A hello's rank or world size beyond this is not believed (hellos are a script's word)."""

Explainer = Callable[[Session, Process], "ProcessExplained | None"]


def rank_of(proc: Process) -> tuple[int, int] | None:
    """``(rank, world_size)`` from a process's hello; None unless it is a rank of a job of
    two or more (the values are a script's word: only plain, plausible integers count)."""
    rank, world = proc.hello.get("rank"), proc.hello.get("world_size")
    if type(rank) is not int or type(world) is not int:
        return None
    if not (2 <= world <= MAX_RANK and 0 <= rank < world):
        return None
    return rank, world


def _end(session: Session, proc: Process) -> int:
    if proc.ended is not None:
        return proc.ended
    if proc.gone is not None:
        return proc.gone
    return session.now() if session.live else proc.last_t


def jobs(session: Session) -> list[list[Process]]:
    """The ranks of the session grouped into jobs, the newest job first.

    A job is the processes of one world size whose lives overlap, each rank at most once:
    two torchrun launches one after the other are two jobs, the hosts of one merged
    multi-host replay one job.
    """
    procs = sorted(
        (p for p in session.ranked() if rank_of(p) is not None),
        key=lambda p: (p.first_t, p.pid),
    )
    groups: list[tuple[int, dict[int, Process], list[int]]] = []  # world, by rank, [t0, t1]
    for p in procs:
        rank, world = rank_of(p)  # type: ignore[misc]
        t0, t1 = p.first_t, _end(session, p)
        for g_world, members, span in groups:
            if g_world == world and rank not in members and t0 <= span[1] and t1 >= span[0]:
                members[rank] = p
                span[0], span[1] = min(span[0], t0), max(span[1], t1)
                break
        else:
            groups.append((world, {rank: p}, [t0, t1]))
    out = [list(members.values()) for _, members, _ in groups]
    out.sort(key=lambda ps: -max(p.first_t for p in ps))
    return out


def own_gpus(proc: Process) -> list[str]:
    """The session devices the process works on, the one its newest phase used first.

    Named by its newest phases and its newest allocator figures, not by every figure it
    ever sent: one read before ``torch.cuda.set_device`` names device 0. Failing those,
    its LOCAL_RANK's device; failing that, its only device.
    """
    devs: list[int] = []
    for table in (proc.phases, proc.torch):
        end = len(table)
        col = table.rows(max(table.first, end - NEWEST_ROWS), end, ("dev",))["dev"]
        known = col[col != MISSING_INT]
        if table is proc.phases:
            devs += [int(d) for d in dict.fromkeys(known[::-1].tolist())]  # newest first
        elif len(known):
            devs.append(int(known[-1]))
    own = [proc.devices[d] for d in dict.fromkeys(devs) if d in proc.devices]
    if own:
        return list(dict.fromkeys(own))
    local = proc.hello.get("local_rank")
    if type(local) is int and local in proc.devices:
        return [proc.devices[local]]
    values = sorted(set(proc.devices.values()))
    return values if len(values) == 1 else []


def step_at(proc: Process, t: int | None = None) -> tuple[int, int] | None:
    """``(end time, step)`` of the newest phase with a step that ended by ``t`` (None: the
    newest of all), or None when there is none."""
    table = proc.phases
    end = len(table) if t is None else table.search(t, "right")
    cols = table.rows(max(table.first, end - NEWEST_ROWS), end, ("t1", "step"))
    known = np.flatnonzero(cols["step"] != MISSING_INT)
    if not len(known):
        return None
    return int(cols["t1"][known[-1]]), int(cols["step"][known[-1]])


def aligned_steps(procs: list[Process], stale: int = STALE_NS) -> dict[int, int]:
    """Each rank's step at one moment, by pid: that of the least recent report among the
    ranks still reporting, so that what one rank's messages took longer to bring is not a
    rank behind. A rank silent ``stale`` ns before the newest report keeps its own step."""
    newest = {p.pid: step_at(p) for p in procs}
    times = [v[0] for v in newest.values() if v is not None]
    if not times:
        return {}
    recent = max(times)
    common = min(t for t in times if recent - t <= stale)
    out = {}
    for p in procs:
        mine = newest[p.pid]
        if mine is None:
            continue
        at = step_at(p, common) if recent - mine[0] <= stale else mine
        out[p.pid] = (at or mine)[1]
    return out


def gpu_label(session: Session, key: str) -> str:
    """A GPU as the table names it: its NVML index, after its host in a merged replay."""
    dev = session.devices.get(key)
    if dev is None:
        return key
    index = str(dev.index) if dev.index is not None else "?"
    return f"{dev.origin}:{index}" if dev.origin else index


def newest_snapshot(session: Session, key: str) -> dict[int, int | None]:
    """The newest process list NVML gave for a GPU: pid -> used bytes (None: not said)."""
    table = session.gpu_procs.get(key)
    if table is None or len(table) == 0:
        return {}
    end = len(table)
    cols = table.rows(max(table.first, end - NEWEST_ROWS), end, ("t", "pid", "used", "type"))
    if not len(cols["t"]):
        return {}
    newest = cols["t"] == cols["t"][-1]
    out: dict[int, int | None] = {}
    for pid, used, kind in zip(
        cols["pid"][newest].tolist(),
        cols["used"][newest].tolist(),
        cols["type"][newest].tolist(),
        strict=True,
    ):
        if kind >= 0:  # type -1: the "no processes" row of an empty snapshot
            out[int(pid)] = None if used == MISSING_INT else int(used)
    return out


@dataclass
class _Cached:
    rev: int
    at: float
    explained: ProcessExplained | None


@dataclass
class RankFeed:
    """Makes the ranks tables of a session, keeping each process's explanation a while.

    Args:
        explain: Computes a process's explanation (default :func:`explain_process`; its
            errors on a script's facts leave the row without predictions).
        every: Seconds an explanation of a live process is kept while it changes.
        stale: See :func:`aligned_steps`.
        clock: Monotonic seconds (tests move it).
    """

    explain: Explainer | None = None
    every: float = EXPLAIN_EVERY
    stale: int = STALE_NS
    clock: Callable[[], float] = time.monotonic
    _cache: dict[int, _Cached] = field(default_factory=dict)

    def tables(self, session: Session, *, phases: bool = True) -> list[Ranks]:
        """One :class:`Ranks` per job of two or more ranks, the newest job first.

        Args:
            session: The session.
            phases: Read the phases' peaks and predictions (False: steps, GPUs and strays
                only, cheap enough to check every second for the flags that need no peaks).
        """
        snapshots: dict[str, dict[int, int | None]] = {}
        out = []
        for job in jobs(session):
            steps = aligned_steps(job, self.stale)
            rows = [
                self.row(session, p, snapshots, phases=phases, step=steps.get(p.pid)) for p in job
            ]
            if len(rows) >= 2:
                out.append(compare(rows))
        known = session.processes  # the cache's own pids: not every process ever seen
        for pid in [pid for pid in self._cache if pid not in known]:
            del self._cache[pid]
        return out

    def row(
        self,
        session: Session,
        proc: Process,
        snapshots: dict[str, dict[int, int | None]] | None = None,
        *,
        phases: bool = True,
        step: int | None = None,
    ) -> RankRow:
        """The row of one rank (``snapshots`` caches the GPUs' process lists across rows;
        ``step``: its step at the job's common moment, default its newest)."""
        snapshots = {} if snapshots is None else snapshots
        rank, world = rank_of(proc) or (-1, 0)
        own = own_gpus(proc)
        gpu = own[0] if own else None
        used = None
        if gpu is not None and gpu in session.gpu:
            last = session.gpu[gpu].last()
            if last is not None and last["used"] != MISSING_INT:
                used = int(last["used"])
        strays: dict[str, int | None] = {}
        # Which of the GPUs it sees is its own, unknown: none is called another's. (One
        # that sees none and is listed on a GPU holds a context there all the same.)
        known = bool(own) or not proc.devices
        for key in sorted(session.gpu_procs) if known else ():
            if key in own or not _same_host(session, proc, key):
                continue
            if key not in snapshots:
                snapshots[key] = newest_snapshot(session, key)
            if proc.pid in snapshots[key]:
                strays[gpu_label(session, key)] = snapshots[key][proc.pid]
        par = proc.facts.get("parallel") if isinstance(proc.facts, dict) else None
        strategy = par.get("strategy") if isinstance(par, dict) else None
        host = proc.origin or proc.hello.get("hostname")
        return RankRow(
            rank=rank,
            host=host if isinstance(host, str) and host else "?",
            gpu=gpu_label(session, gpu) if gpu is not None else None,
            pid=proc.os_pid if proc.os_pid is not None else proc.pid,
            step=step if step is not None else (step_at(proc) or (0, None))[1],
            used=used,
            phases=self._phases(session, proc) if phases else {},
            strays=strays,
            strategy=strategy[:16] if isinstance(strategy, str) and strategy else None,
            world_size=world,
        )

    def _phases(self, session: Session, proc: Process) -> dict[str, RankPhase]:
        # No device key: device_max (NVML's used in each phase) is not read, only the peaks.
        # The newest step of each phase with an allocator peak; where none has one (a
        # rank on the CPU, which reports no peaks) the newest all the same: its
        # prediction is shown without a measurement.
        newest: dict[str, Any] = {}
        for p in phase_peaks(session, proc, "", last_steps=LAST_STEPS, depth=None):
            had = newest.get(p.name)
            if had is None or (had.peak_alloc is None and p.peak_alloc is not None):
                newest[p.name] = p
        if not newest:
            return {}
        ex = self._explained(session, proc)
        found = first_optimizer_step(session, proc)[0] if ex is not None else None
        first = None if found is None else found[0]
        out = {}
        for name, p in newest.items():
            predicted, parts = None, {}
            if ex is not None:
                is_first = first is None or (p.step is not None and p.step <= first)
                e = ex.phases.get((name, is_first)) or ex.phases.get((name, not is_first))
                if e is not None:
                    predicted = e.predicted
                    if p.peak_alloc is not None:
                        parts = allocated_parts(e.categories, p.peak_alloc)
            out[name] = RankPhase(peak=p.peak_alloc, predicted=predicted, parts=parts)
        return out

    def _explained(self, session: Session, proc: Process) -> ProcessExplained | None:
        if not proc.facts:
            return None
        now = self.clock()
        cached = self._cache.get(proc.pid)
        if cached is not None and (cached.rev == proc.rev or now - cached.at < self.every):
            return cached.explained
        try:
            ex = (self.explain or explain_process)(session, proc)
        except Exception:  # facts are a script's word: a row without predictions, no crash
            ex = None
        self._cache[proc.pid] = _Cached(proc.rev, now, ex)
        return ex


def _same_host(session: Session, proc: Process, key: str) -> bool:
    """Is GPU ``key`` on the host the process runs on (a merged replay has several)."""
    dev = session.devices.get(key)
    return dev is None or dev.origin == proc.origin


def allocated_parts(categories: dict[str, int], peak: int) -> dict[str, int]:
    """A measured allocated peak split into the predicted categories and what is left.

    Only the allocated bytes: a rank's cache and context are not what its peak compares.
    """
    parts = {k: int(v) for k, v in categories.items() if v > 0}
    rest = peak - sum(parts.values())
    if rest > 0:
        parts[UNEXPLAINED] = rest
    return parts


def flag_key(flag: Flag, row: RankRow) -> tuple[Any, ...]:
    """What makes a flag the same one on the next look (its bytes and text may change):
    its kind, the process (host and pid: a rank of the next job is another) and what."""
    where = flag.phase if flag.kind == "above_median" else flag.category
    return (flag.kind, row.host, row.pid, flag.rank, where)


def new_flags(tables: Iterable[Ranks], seen: set[tuple[Any, ...]]) -> list[tuple[Flag, RankRow]]:
    """The flags not seen before, with their rank's row (``seen`` is updated): each fault
    is told once."""
    out = []
    for ranks in tables:
        by_rank = {r.rank: r for r in ranks.rows}
        for flag in ranks.flags:
            row = by_rank[flag.rank]
            key = flag_key(flag, row)
            if key not in seen:
                seen.add(key)
                out.append((flag, row))
    return out


MARKED = ("stray_context", "step_behind")
"""The faults a live session marks when they first appear (they need no peaks)."""

MARK_PREFIX = "gpuwatch: "
"""What starts the text of a mark gpuwatch makes itself (a script's marks are its own)."""


class RankMarks:
    """Marks each stray context and each divergence of the step counters once, when first
    seen in a live session: recorded like a script's mark, so a replay shows it too."""

    def __init__(self, feed: RankFeed | None = None) -> None:
        self.feed = feed or RankFeed()
        self.seen: set[tuple[Any, ...]] = set()

    def check(self, session: Session, t: int | None = None) -> list[Mark]:
        """Look at the ranks now (marks are timed ``t``, default the session's now);
        returns the marks added to the session."""
        t = session.now() if t is None else t
        added = []
        for flag, row in new_flags(self.feed.tables(session, phases=False), self.seen):
            if flag.kind not in MARKED:
                continue
            pid = next((p.pid for p in session.processes.values() if _is_row(p, row)), row.pid)
            mark = Mark(t, pid, MARK_PREFIX + flag.text, "warning", row.step)
            session.add_mark(mark)
            added.append(mark)
        return added


def _is_row(proc: Process, row: RankRow) -> bool:
    pid = proc.os_pid if proc.os_pid is not None else proc.pid
    return pid == row.pid and (rank_of(proc) or (None,))[0] == row.rank
