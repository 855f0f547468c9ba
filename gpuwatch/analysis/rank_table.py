"""Ranks side by side: each rank's peaks, the spread over ranks, and the faults that stand out.

One model whatever feeds it: a live or replayed session, or Prometheus series (the cluster
view). Everything here is plain data, with no session, no I/O and no clock, so both feeders
give the same table, the same worst rank and the same flags (docs/ranks.md).

The faults are the classic ones of data-parallel and sharded runs:

- a rank well above the others in a phase (rank 0 evaluating, logging or gathering a state
  dict): more than :data:`ABOVE_RATIO` *and* :data:`ABOVE_BYTES` above the median of the
  ranks, named with the category that makes the difference;
- a process holding memory on a GPU that is not its own (a CUDA context made before
  ``torch.cuda.set_device``, seen in NVML's per-GPU process list);
- a rank whose step counter falls :data:`STEP_LAG` or more behind the furthest rank.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..fmt import fmt_bytes, fmt_short

MIB = 1 << 20

ABOVE_RATIO = 0.10
"""A rank this far above the median of the ranks' peaks (and :data:`ABOVE_BYTES`) is flagged."""

ABOVE_BYTES = 256 * MIB
"""The least excess over the median that is flagged: small models differ by noise."""

STEP_LAG = 2
"""Steps behind the furthest rank at which ranks are said to diverge (a synchronous job's
ranks are at most one step apart whenever they are sampled)."""

PHASE_ORDER = ("data", "forward", "backward", "clip", "optimizer.step", "zero_grad", "eval")
"""The training phases in the order a step runs them; other names follow, by name."""

UNEXPLAINED = "unexplained"
"""The category of an excess that the prediction does not account for."""


def phase_key(name: str) -> tuple[int, str]:
    """Sort key that puts the training phases in step order and the rest after, by name."""
    return (PHASE_ORDER.index(name) if name in PHASE_ORDER else len(PHASE_ORDER), name)


@dataclass(frozen=True)
class RankPhase:
    """One phase of one rank, in the newest step that has it.

    Attributes:
        peak: The allocator's exact peak inside the phase (None: not reported).
        predicted: The predicted peak of the phase (None: no prediction).
        parts: The measured peak explained by category (weights, gradients, ...,
            ``unexplained``), as ``gpuwatch info`` explains it; empty when unknown.
    """

    peak: int | None = None
    predicted: int | None = None
    parts: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RankRow:
    """One rank of the job.

    Attributes:
        rank: Its global rank.
        host: The host it runs on.
        gpu: Its GPU (a device label such as ``0`` or ``node3:0``; None: on the CPU).
        pid: Its process id on that host.
        step: The newest step it reported (None: it reports no steps).
        used: NVML's used memory of its GPU (None: not sampled, or on the CPU).
        phases: Its phases by name.
        strays: GPUs other than its own where NVML lists its pid, with the bytes NVML
            reports there (None: listed, the amount not reported, as in containers).
        strategy: Its parallel layout (``ddp``, ``fsdp2``, ...), when known.
        world_size: The job's number of ranks, when known.
    """

    rank: int
    host: str
    gpu: str | None
    pid: int
    step: int | None = None
    used: int | None = None
    phases: Mapping[str, RankPhase] = field(default_factory=dict)
    strays: Mapping[str, int | None] = field(default_factory=dict)
    strategy: str | None = None
    world_size: int | None = None

    @property
    def predicted(self) -> int | None:
        """The highest predicted peak over its phases."""
        values = [p.predicted for p in self.phases.values() if p.predicted is not None]
        return max(values) if values else None


@dataclass(frozen=True)
class Spread:
    """One phase over the ranks that report it: the highest, the lowest and the median."""

    phase: str
    max_rank: int
    max_bytes: int
    min_rank: int
    min_bytes: int
    median: int
    ranks: int

    @property
    def spread_bytes(self) -> int:
        return self.max_bytes - self.min_bytes


@dataclass(frozen=True)
class Flag:
    """A fault of one rank, in one line.

    Attributes:
        kind: ``above_median``, ``stray_context`` or ``step_behind``.
        rank: The rank at fault.
        text: What to show (a sentence without a trailing period).
        phase: The phase (``above_median``).
        bytes: The excess over the median (``above_median``), the bytes held on the other
            GPU (``stray_context``; 0 when NVML does not say) or the steps behind
            (``step_behind``).
        category: The category that makes the difference (``above_median``; None: the
            feed has no breakdown), or the other GPU (``stray_context``).
    """

    kind: str
    rank: int
    text: str
    phase: str | None = None
    bytes: int = 0
    category: str | None = None


@dataclass(frozen=True)
class Ranks:
    """The ranks of one job side by side (see :func:`compare`)."""

    rows: tuple[RankRow, ...]
    spreads: tuple[Spread, ...]
    flags: tuple[Flag, ...]

    @property
    def phases(self) -> list[str]:
        """The phases any rank reports, in step order."""
        return [s.phase for s in self.spreads]

    @property
    def newest_step(self) -> int | None:
        steps = [r.step for r in self.rows if r.step is not None]
        return max(steps) if steps else None

    def spread(self, phase: str) -> Spread | None:
        return next((s for s in self.spreads if s.phase == phase), None)

    def flags_of(self, rank: int) -> list[Flag]:
        return [f for f in self.flags if f.rank == rank]

    def to_json(self) -> dict[str, Any]:
        """The ``ranks`` object of ``gpuwatch info --json`` (bytes as integers)."""
        return {
            "count": len(self.rows),
            "newest_step": self.newest_step,
            "rows": [
                {
                    "rank": r.rank,
                    "host": r.host,
                    "gpu": r.gpu,
                    "pid": r.pid,
                    "step": r.step,
                    "used": r.used,
                    "strategy": r.strategy,
                    "world_size": r.world_size,
                    "predicted": r.predicted,
                    "phases": {
                        name: {"peak": p.peak, "predicted": p.predicted, "parts": dict(p.parts)}
                        for name, p in sorted(r.phases.items(), key=lambda kv: phase_key(kv[0]))
                    },
                    "strays": dict(r.strays),
                }
                for r in self.rows
            ],
            "phases": {
                s.phase: {
                    "max_rank": s.max_rank,
                    "max_bytes": s.max_bytes,
                    "min_rank": s.min_rank,
                    "min_bytes": s.min_bytes,
                    "median_bytes": s.median,
                    "spread_bytes": s.spread_bytes,
                    "ranks": s.ranks,
                }
                for s in self.spreads
            },
            "flags": [
                {
                    "kind": f.kind,
                    "rank": f.rank,
                    "phase": f.phase,
                    "bytes": f.bytes,
                    "category": f.category,
                    "text": f.text,
                }
                for f in self.flags
            ],
        }


def ranks_from_json(data: Mapping[str, Any]) -> Ranks:
    """The :class:`Ranks` that :meth:`Ranks.to_json` wrote (``gpuwatch info``'s own dict,
    made in the same process: the report's text is drawn from it)."""
    rows = tuple(
        RankRow(
            rank=r["rank"],
            host=r["host"],
            gpu=r["gpu"],
            pid=r["pid"],
            step=r["step"],
            used=r["used"],
            phases={
                name: RankPhase(p["peak"], p["predicted"], dict(p["parts"]))
                for name, p in r["phases"].items()
            },
            strays=dict(r["strays"]),
            strategy=r["strategy"],
            world_size=r["world_size"],
        )
        for r in data["rows"]
    )
    spreads = tuple(
        Spread(
            name,
            s["max_rank"],
            s["max_bytes"],
            s["min_rank"],
            s["min_bytes"],
            s["median_bytes"],
            s["ranks"],
        )
        for name, s in data["phases"].items()
    )
    flags = tuple(
        Flag(f["kind"], f["rank"], f["text"], f["phase"], f["bytes"], f["category"])
        for f in data["flags"]
    )
    return Ranks(rows, spreads, flags)


def compare(
    rows: Iterable[RankRow],
    *,
    ratio: float = ABOVE_RATIO,
    floor: int = ABOVE_BYTES,
    lag: int = STEP_LAG,
) -> Ranks:
    """Set the ranks side by side: per phase the spread, and every rank's faults.

    Args:
        rows: One row per rank, in any order.
        ratio: Relative excess over the median that flags a rank (with ``floor``).
        floor: Least excess in bytes that flags a rank.
        lag: Steps behind the furthest rank that flag a rank.
    """
    ordered = tuple(sorted(rows, key=lambda r: (r.rank, r.host, r.pid)))
    names = sorted({n for r in ordered for n in r.phases}, key=phase_key)
    spreads: list[Spread] = []
    flags: list[Flag] = []
    for name in names:
        # (row, phase, its peak) where the peak is reported.
        have = [
            (r, p, p.peak)
            for r in ordered
            if (p := r.phases.get(name)) is not None and p.peak is not None
        ]
        if not have:
            continue
        median = int(statistics.median(peak for _, _, peak in have))
        top_row, _, top = max(have, key=lambda h: (h[2], -h[0].rank))
        low_row, _, low = min(have, key=lambda h: (h[2], h[0].rank))
        spreads.append(Spread(name, top_row.rank, top, low_row.rank, low, median, len(have)))
        if len(have) < 2:
            continue
        for row, p, peak in have:
            excess = peak - median
            if excess > floor and peak > median * (1 + ratio):
                category = _difference(p, [q for r, q, _ in have if r is not row])
                flags.append(_above(row, name, peak, median, excess, category))
    flags.extend(_strays(ordered))
    flags.extend(_behind(ordered, lag))
    return Ranks(ordered, tuple(spreads), tuple(flags))


def _difference(p: RankPhase, others: list[RankPhase]) -> str | None:
    """The category whose bytes exceed the other ranks' median the most (None: no breakdown)."""
    if not p.parts:
        return None
    keys = set(p.parts).union(*(q.parts for q in others))
    best, best_gap = UNEXPLAINED, 0
    for key in sorted(keys):
        gap = p.parts.get(key, 0) - statistics.median(q.parts.get(key, 0) for q in others)
        if gap > best_gap:
            best, best_gap = key, int(gap)
    return best


def _above(
    row: RankRow, phase: str, peak: int, median: int, excess: int, category: str | None
) -> Flag:
    why = f" ({category})" if category else ""
    text = (
        f"rank {row.rank} {phase} peak {fmt_bytes(peak)} is {fmt_bytes(excess)} above the "
        f"median of the ranks, {fmt_bytes(median)}{why}"
    )
    return Flag("above_median", row.rank, text, phase, excess, category)


def _strays(rows: tuple[RankRow, ...]) -> Iterable[Flag]:
    for row in rows:
        for gpu, used in sorted(row.strays.items()):
            held = "a CUDA context" if not used else fmt_bytes(used)
            own = (
                f"not its own GPU {row.gpu}" if row.gpu is not None else "though it runs on the CPU"
            )
            text = (
                f"rank {row.rank} (pid {row.pid}) holds {held} on GPU {gpu}, {own}: "
                "a context made before torch.cuda.set_device"
            )
            yield Flag("stray_context", row.rank, text, None, used or 0, gpu)


def _behind(rows: tuple[RankRow, ...], lag: int) -> Iterable[Flag]:
    stepped = [(r, r.step) for r in rows if r.step is not None]
    if len(stepped) < 2:
        return
    lead, lead_step = max(stepped, key=lambda rs: (rs[1], -rs[0].rank))
    for row, step in stepped:
        gap = lead_step - step
        if gap >= lag:
            text = (
                f"rank {row.rank} is at step {step}, {gap} behind rank {lead.rank} "
                f"(step {lead_step}): the ranks' step counters diverge"
            )
            yield Flag("step_behind", row.rank, text, None, gap, None)


def format_ranks(ranks: Ranks) -> list[str]:
    """The ranks table of ``gpuwatch info``: a row per rank, the spread per phase, the flags."""
    if not ranks.rows:
        return []
    first = ranks.rows[0]
    layout = ", ".join(
        x
        for x in (
            first.strategy,
            f"world size {first.world_size}" if first.world_size else None,
            f"newest step {ranks.newest_step}" if ranks.newest_step is not None else None,
        )
        if x
    )
    lines = [f"ranks: {len(ranks.rows)}" + (f" ({layout})" if layout else "")]
    phases = ranks.phases
    head = ["rank", "host", "gpu", "pid", "step", *phases, "predicted", "used"]
    table = [head]
    for r in ranks.rows:
        cells = [str(r.rank), r.host, r.gpu or "cpu", str(r.pid), _opt(r.step)]
        cells += [fmt_short(r.phases[n].peak) if n in r.phases else "-" for n in phases]
        cells += [fmt_short(r.predicted), fmt_short(r.used)]
        flagged = "!" if ranks.flags_of(r.rank) else " "
        cells[0] = flagged + cells[0]
        table.append(cells)
    lines += _columns(table, left=2)
    if ranks.spreads:
        table = [["phase", "max", "min", "median", "spread"]]
        for s in ranks.spreads:
            table.append(
                [
                    s.phase,
                    f"{fmt_short(s.max_bytes)} (rank {s.max_rank})",
                    f"{fmt_short(s.min_bytes)} (rank {s.min_rank})",
                    fmt_short(s.median),
                    fmt_short(s.spread_bytes),
                ]
            )
        lines += _columns(table, left=2)
    lines += [f"  ! {f.text}" for f in ranks.flags]
    return lines


def _opt(v: int | None) -> str:
    return "-" if v is None else str(v)


def _columns(table: list[list[str]], left: int) -> list[str]:
    """Rows of cells as aligned text: the first two columns to the left, numbers to the right."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    out = []
    for row in table:
        cells = [
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        out.append("  " + "  ".join(cells).rstrip())
    return out
