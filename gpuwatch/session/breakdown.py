"""Where every byte of a GPU went at one moment: the breakdown bar's arithmetic.

Measured parts come from NVML (device used, per-process used) and the scripts' allocator
figures; the allocated part is split by the predictor's categories. Nothing is scaled to
fit: known figures keep their size, what the prediction does not explain is shown as
such, a prediction above what is allocated is named as an over-prediction, and used
memory that no process claims is a segment of its own, never drawn as free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from .predicted import PredictedLine
from .session import Session
from .table import MISSING_INT

PART_ORDER = (
    "other",
    "context",
    "unclaimed",
    "fragmented",
    "cache",
    "weights",
    "amp_copies",
    "gradients",
    "optimizer_state",
    "activations",
    "temporaries",
    "ddp_buckets",
    "fsdp_unsharded",
    "fsdp_reduce",
    "unexplained",
)
"""Bar segments from the left; ``free`` fills the rest up to the device total."""


@dataclass
class Breakdown:
    """One GPU at one moment, in bytes (None: not known here).

    Attributes:
        total: Device memory.
        used: NVML "used" (what nvidia-smi shows).
        other: Used by processes gpuwatch does not instrument (from NVML's process list).
        context: NVML's figure for the instrumented processes minus their reserved bytes:
            the CUDA context, NCCL buffers and anything allocated outside torch. Unknown
            without NVML's process list (containers often hide it).
        unclaimed: Used memory no process accounts for: without a process list, all that
            is not torch's reserved (contexts, other processes); with one, what the list
            leaves out (processes of other containers, the driver).
        reserved: torch reserved, summed over instrumented processes.
        allocated: torch allocated, summed.
        cache: reserved - allocated: the caching allocator's free blocks.
        fragmented: The part of the cache in inactive blocks of split segments (the
            allocator's ``inactive_split_bytes``): free but unusable for a larger request.
        predicted: Predicted bytes by category (sums over processes), if any prediction.
        unexplained: allocated - sum(predicted); negative when the prediction is higher.
    """

    total: int | None = None
    used: float | None = None
    other: float | None = None
    context: float | None = None
    unclaimed: float | None = None
    reserved: float | None = None
    allocated: float | None = None
    cache: float | None = None
    fragmented: float | None = None
    predicted: dict[str, float] = field(default_factory=dict)
    unexplained: float | None = None

    @property
    def free(self) -> float | None:
        if self.total is None or self.used is None:
            return None
        return max(0.0, self.total - self.used)

    @property
    def over_predicted(self) -> float:
        """How far the prediction is above what is allocated (0 when it is not)."""
        if self.unexplained is None or self.unexplained >= 0:
            return 0.0
        return -self.unexplained

    def parts(self) -> list[tuple[str, float]]:
        """Non-negative bar segments in :data:`PART_ORDER`, each at its own size.

        Predicted categories are never scaled: when they add up to more than is
        allocated, they overrun it by :attr:`over_predicted`, which the bar draws over
        their tail and names.
        """
        out: list[tuple[str, float]] = []
        for name in ("other", "context", "unclaimed"):
            v = getattr(self, name)
            if v is not None and v > 0:
                out.append((name, v))
        if self.cache is not None and self.cache > 0:
            frag = min(self.fragmented or 0.0, self.cache)
            if frag > 0:
                out.append(("fragmented", frag))
            if self.cache - frag > 0:
                out.append(("cache", self.cache - frag))
        for name in PART_ORDER[5:-1]:
            v = self.predicted.get(name, 0)
            if v > 0:
                out.append((name, v))
        if self.predicted and self.unexplained is not None and self.unexplained > 0:
            out.append(("unexplained", self.unexplained))
        elif not self.predicted and self.allocated:
            out.append(("allocated", self.allocated))
        return out


def breakdown(
    session: Session, key: str, t: int, predicted: Mapping[int, PredictedLine] | None = None
) -> Breakdown:
    """The breakdown of GPU ``key`` at time ``t``.

    Args:
        session: The session.
        key: A GPU's device key.
        t: The moment (the cursor, or the newest time).
        predicted: Predicted lines by pid (from the dashboard's cache), if any.
    """
    dev = session.devices[key]
    out = Breakdown(total=dev.total)
    table = session.gpu.get(key)
    if table is not None and len(table):
        out.used = table.value_at("used", t)
    procs = session.processes_on(key)
    pids = {p.pid for p in procs}
    reserved = allocated = fragmented = None
    held: dict[int, float] = {}  # each process's own allocated figure at t
    for proc in procs:
        row = proc.torch.at(t)
        r, a, f = (_known(row, c) for c in ("reserved", "allocated", "inactive_split"))
        held[proc.pid] = a or 0.0
        if r is not None:
            reserved = (reserved or 0.0) + r
        if a is not None:
            allocated = (allocated or 0.0) + a
        if f is not None:
            fragmented = (fragmented or 0.0) + f
    out.reserved, out.allocated, out.fragmented = reserved, allocated, fragmented
    if reserved is not None and allocated is not None:
        out.cache = reserved - allocated
    # NVML's process list at t: what each process uses on this GPU.
    per_pid = _process_usage(session, key, t)
    claimed = 0.0
    if per_pid is not None:
        out.other = float(sum(u for pid, u in per_pid.items() if pid not in pids))
        mine = [per_pid[pid] for pid in pids if pid in per_pid]
        claimed = out.other + float(sum(mine))
        if mine and reserved is not None:
            out.context = float(sum(mine)) - reserved
        elif reserved is not None:
            claimed += reserved  # ours, though the list does not show them
    elif reserved is not None:
        claimed = reserved
    if out.used is not None:
        out.unclaimed = max(0.0, out.used - claimed)
    for proc in procs:
        line = (predicted or {}).get(proc.pid)
        if line is None:
            continue
        parts = line.breakdown_at(t)
        for name, v in (parts or {}).items():
            out.predicted[name] = out.predicted.get(name, 0.0) + v
    if out.predicted and allocated is not None:
        expected = sum(out.predicted.values())
        # Between two boundaries the allocator's figure is held from the last one: inside a
        # phase whose exact peak is known, what was allocated at t lies between that held
        # figure and the peak. A prediction within those bounds is not called wrong; the
        # figure the bar splits is the one nearest to it (the held one, or the peak).
        ceiling = _ceiling(session, procs, t, allocated, held)
        measured = min(max(allocated, expected), ceiling)
        if measured != allocated:
            out.allocated = measured
            if reserved is not None:
                out.cache = max(0.0, reserved - measured)
        out.unexplained = measured - expected
    return out


def _known(row: dict[str, float | int] | None, column: str) -> float | None:
    """A row's value as a float; None for no row, NaN or the missing marker."""
    if row is None:
        return None
    v = row[column]
    if v == MISSING_INT:
        return None
    v = float(v)
    return None if math.isnan(v) else v


def _ceiling(
    session: Session, procs: list, t: int, allocated: float, held: Mapping[int, float]
) -> float:
    """The most that can have been allocated at ``t``: each process's held figure
    (``held``, by pid; ``allocated`` is their sum), or the exact peak of the innermost
    phase it is in at ``t`` when that is higher."""
    ceiling = allocated
    for proc in procs:
        span = session.span_at(proc, t)
        peak = span.get("peak_alloc") if span is not None else None
        if peak is not None:
            ceiling += max(0.0, float(peak) - held[proc.pid])
    return ceiling


def _process_usage(session: Session, key: str, t: int) -> dict[int, float] | None:
    """pid -> used bytes from the newest NVML process snapshot at or before ``t``."""
    table = session.gpu_procs.get(key)
    if table is None or not len(table):
        return None
    cols = table.group_at(t)
    if cols is None:
        return None
    out: dict[int, float] = {}
    for pid, used in zip(cols["pid"], cols["used"], strict=True):
        if int(pid) > 0 and used >= 0:
            out[int(pid)] = out.get(int(pid), 0.0) + float(used)
    return out
