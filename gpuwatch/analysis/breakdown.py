"""Where every byte of a GPU went at one moment: the breakdown bar's arithmetic.

Every figure is the one valid at the moment asked for, and its age is kept: NVML's used
memory (sampled about ten times a second), the allocator figures of the processes running
then (a process that has exited holds nothing), and NVML's per-process list only while it
still matches them (it is read about once a second and stored when it changes, so a stored
list is checked against the used memory and the reserved figures it was taken with). The
allocated part is split by the predictor's categories.

Segments never sum past the device's used memory (its total where that is unknown): when
figures taken at different moments disagree, the most direct ones keep their size
(allocated, then the cache, then contexts and other processes), and what is left of the
used memory is named "not split" rather than guessed. Used memory that a valid process
list does not claim (or, without a list, that torch does not hold) is "unclaimed", never
drawn as free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..session import MISSING_INT, Oom, Process, Session
from .predicted import PredictedLine
from .process_reading import ProcessReading, read_processes

_READ: Any = object()
"""Default of :func:`breakdown`'s ``row``: read NVML's sample itself."""

PART_ORDER = (
    "other",
    "context",
    "unclaimed",
    "unsplit",
    "fragmented",
    "cache",
    "weights",
    "amp_copies",
    "gradients",
    # What stays for the whole run before what a phase makes and frees: below a phase's
    # peak (_below_peak takes the last categories first) it remains. DDP's buckets hold
    # the gradients, ZeRO's master copy the weights.
    "ddp_buckets",
    "optimizer_state",
    "zero_master",
    "activations",
    "blas_workspaces",
    "temporaries",
    "fsdp_unsharded",
    "fsdp_reduce",
    "zero_buckets",
    "zero_gathered",
    "unexplained",
)
"""Bar segments from the left; ``free`` fills the rest up to the device total."""

CATEGORIES = PART_ORDER[6:-1]
"""The predicted categories that split what is allocated, in the order they are filled."""

STATE = ("weights", "amp_copies", "gradients", "ddp_buckets", "optimizer_state", "zero_master")
"""The model's state: inside a phase, always its size at the phase's exact peak (what the
Peaks tab and ``info`` say of the phase), wherever the cursor is."""
MOVING = tuple(c for c in CATEGORIES if c not in STATE)
"""What comes and goes between two boundaries (activations, workspaces, temporaries,
gathered shards): the only categories the held allocator figure takes from."""

SAME = 32 * 1024**2
"""Two figures of the same thing this close are taken as unchanged (NVML's and the
allocator's granularity, a driver's few MiB)."""

USED_MAX_AGE = 2 * 10**9
"""The oldest NVML used sample still taken as the device's memory at a moment (2 s, or
three sampling intervals when the sampler was set slower)."""


@dataclass
class Breakdown:
    """One GPU at one moment, in bytes (None: not known here).

    Attributes:
        total: Device memory.
        used: NVML "used" (what nvidia-smi shows), from a sample at most
            :data:`USED_MAX_AGE` old.
        other: Used by processes gpuwatch does not instrument (from NVML's process list,
            while it is valid at the moment).
        context: NVML's figure for the instrumented processes minus their reserved bytes:
            the CUDA context, NCCL buffers and anything allocated outside torch, with the
            driver's few MiB no process lists (so it is NVML used - reserved on a GPU of one
            process, the figure of ``info`` and the Peaks tab). Unknown without a valid
            process list (containers often hide it).
        unclaimed: Used memory no process accounts for: without a process list, all that
            is not torch's reserved (contexts, other processes); with a valid one, what it
            leaves out beyond the driver's few MiB (:data:`SAME`, counted in ``context``
            as ``info`` counts it): processes of other containers.
        unsplit: Used memory the figures at this moment cannot split (see ``why``): the
            process list is older than a change, or NVML's sample predates the allocator's
            figures (it lags them by up to a sampling interval).
        why: Why ``unsplit`` is not split, in a few words ("" when it is not set).
        reserved: torch reserved, summed over the instrumented processes running.
        allocated: torch allocated, summed: the figure the legend shows.
        cache: reserved - allocated: the caching allocator's free blocks.
        fragmented: The part of the cache in inactive blocks of split segments (the
            allocator's ``inactive_split_bytes``): free but unusable for a larger request.
        predicted: Predicted bytes by category (sums over processes), if any prediction.
        unexplained: allocated - sum(predicted); negative when the prediction is higher.
        headroom: How far above ``allocated`` the allocated memory may have been: between
            two boundaries the allocator's figure is held from the last one, and inside a
            phase whose exact peak is known, what was allocated lies up to that peak.
        ages: Figure -> how old it is at the moment, in ns: ``nvidia-smi`` (the used
            sample), ``torch`` (the oldest allocator figure used), ``processes`` (the
            process list, checked or not).
        oom: The out-of-memory error that broke the phase at the moment (its body:
            ``requested``, ``free``, ``phase``, ``step``), or None. Its ``free`` is the
            driver's figure at the failing call: newer than an NVML sample taken before
            it, it sets the used memory then.
        removed: Inside phases whose explanation is in force (``phase_predicted``): what
            the phase held at its exact peak and no longer at the moment, by category,
            taken from what moves between boundaries (:data:`MOVING`, the last first:
            the step's temporaries), from the model's state only where the phase makes
            it (see ``lifted``); the rest, with the explanation's unexplained, is what
            ``predicted`` splits. None otherwise.
        lifted: Inside such phases, how far the model's state at the phase's peak
            (:data:`STATE`, with what the explanation leaves unexplained there) is above
            the held allocator figure (it grew inside the phase: gradients in a backward,
            AdamW's state in the first step): the bar shows it whole, as Peaks does, and
            that much less cache.
    """

    total: int | None = None
    used: float | None = None
    other: float | None = None
    context: float | None = None
    unclaimed: float | None = None
    unsplit: float | None = None
    why: str = ""
    reserved: float | None = None
    allocated: float | None = None
    cache: float | None = None
    fragmented: float | None = None
    predicted: dict[str, float] = field(default_factory=dict)
    unexplained: float | None = None
    headroom: float = 0.0
    ages: dict[str, int] = field(default_factory=dict)
    oom: dict[str, Any] | None = None
    removed: dict[str, float] | None = None
    lifted: float = 0.0

    @property
    def free(self) -> float | None:
        if self.total is None or self.used is None:
            return None
        return max(0.0, self.total - self.used)

    @property
    def budget(self) -> float:
        """What the segments may add up to: the used memory, else the total."""
        if self.used is not None:
            return max(0.0, self.used)
        return math.inf if self.total is None else float(self.total)

    @property
    def over_predicted(self) -> float:
        """How far the prediction is above what can have been allocated (0 when it is
        not): above the held figure by more than the phase's exact peak allows. Never
        in a phase an OOM broke: the prediction is of the phase the error cut short."""
        if self.unexplained is None or self.unexplained >= 0 or self.oom is not None:
            return 0.0
        if self.removed is not None:  # the phase's explanation: its own residual
            return -self.unexplained
        return max(0.0, -self.unexplained - self.headroom)

    def above(self) -> list[tuple[str, float]]:
        """The predicted categories beyond the allocated figure, within :attr:`headroom`:
        what the prediction says the phase held above the figure at its exact peak (the
        cause of a spike between two boundaries), in :data:`CATEGORIES` order."""
        if self.removed is not None:
            return [(k, v) for k in CATEGORIES if (v := self.removed.get(k, 0.0)) >= 1]
        if self.allocated is None or not self.predicted or self.headroom <= 0:
            return []
        out = []
        left, room = self.allocated, self.headroom
        for name in CATEGORIES:
            v = max(0.0, self.predicted.get(name, 0.0))
            over = min(max(0.0, v - left), room)
            left = max(0.0, left - v)
            room -= over
            if over >= 1:
                out.append((name, over))
        return out

    def parts(self) -> list[tuple[str, float]]:
        """Bar segments in :data:`PART_ORDER`, each >= 0, summing to at most
        :attr:`budget`.

        Predicted categories split what is allocated, filled in order and never scaled:
        a prediction above it is cut at it (and named by :attr:`over_predicted`). Where
        figures of different moments add up to more than the budget, allocated keeps
        its size first, then the cache, other processes and contexts; the rest of the
        used memory is unclaimed or not split.
        """
        room = self.budget

        def take(v: float | None) -> float:
            nonlocal room
            v = max(0.0, min(v or 0.0, room))
            room -= v
            return v

        inner: list[tuple[str, float]] = []
        if self.allocated is not None:
            alloc = left = take(self.allocated + self.lifted)
            if self.predicted:
                for name in CATEGORIES:
                    v = max(0.0, min(self.predicted.get(name, 0.0), left))
                    left -= v
                    if v > 0:
                        inner.append((name, v))
                if left >= 1:
                    inner.append(("unexplained", left))
            elif alloc > 0:
                inner.append(("allocated", alloc))
        cache: list[tuple[str, float]] = []
        kept = take(self.cache)
        frag = min(max(0.0, self.fragmented or 0.0), kept)
        if frag > 0:
            cache.append(("fragmented", frag))
        if kept - frag > 0:
            cache.append(("cache", kept - frag))
        outer: list[tuple[str, float]] = []
        for name in ("other", "context"):
            v = take(getattr(self, name))
            if v > 0:
                outer.append((name, v))
        if self.used is not None and room > 0:
            outer.append(("unsplit" if self.unsplit is not None else "unclaimed", room))
        return outer + cache + inner


def breakdown(
    session: Session,
    key: str,
    t: int,
    predicted: Mapping[int, PredictedLine] | None = None,
    readings: list[ProcessReading] | None = None,
    row: dict[str, float | int] | None = _READ,
    phase_predicted: Mapping[int, Mapping[str, float]] | None = None,
    oom: Oom | None = None,
) -> Breakdown:
    """The breakdown of GPU ``key`` at time ``t``, from the figures valid then.

    Args:
        session: The session.
        key: A GPU's device key.
        t: The moment (the cursor, or the newest time).
        predicted: Predicted lines by pid (from the dashboard's cache), if any.
        readings: The device's processes read at ``t`` (:func:`read_processes`; their
            lines stand for ``predicted``), when the caller has them already.
        row: NVML's sample at ``t`` (None: none), when the caller has it already.
        phase_predicted: Pid -> the predicted categories at the exact peak of the phase
            the process ran at ``t`` (its explanation's, :mod:`.moment`): they split its
            allocated memory instead of the predicted curve at ``t``.
        oom: The OOM that broke the phase at ``t`` (:attr:`Breakdown.oom`), if any.
    """
    dev = session.devices[key]
    out = Breakdown(total=dev.total)
    if row is _READ:
        table = session.gpu.get(key)
        row = table.at(t) if table is not None and len(table) else None
    t_used = _used_at(session, key, t, out, row)
    if oom is not None:
        out.oom = dict(oom.body)
        t_used = _used_at_oom(oom, out, t_used, t) or t_used
    if readings is None:
        readings = read_processes(session, session.processes_on(key), t, predicted)
    everyone = [r.proc for r in readings]
    running = [r for r in readings if r.running]
    held = _torch_figures(running, t, out)
    # NVML's sample is taken every ~100 ms: one from before the allocator's figures
    # changed (growth, an OOM's release, a process's exit) says nothing of how they split.
    if t_used is not None and _moved(session, everyone, t_used, t):
        out.why = "nvidia-smi's sample predates torch's"
    _split_used(session, key, t, out, everyone, [r.proc for r in running])
    _split_allocated(out, running, held, t, phase_predicted or {})
    return out


def _torch_figures(running: list[ProcessReading], t: int, out: Breakdown) -> dict[int, float]:
    """Set ``out``'s reserved, allocated, fragmented and cache from the running processes'
    allocator figures; returns each one's own allocated figure at ``t`` by pid."""
    reserved = allocated = fragmented = None
    held: dict[int, float] = {}
    for reading in running:
        proc, fig = reading.proc, reading.torch
        if fig is None:
            continue
        out.ages["torch"] = max(out.ages.get("torch", 0), t - int(fig["t"]))
        r, a, f = (_known(fig, c) for c in ("reserved", "allocated", "inactive_split"))
        held[proc.pid] = a or 0.0
        if r is not None:
            reserved = (reserved or 0.0) + r
        if a is not None:
            allocated = (allocated or 0.0) + a
        if f is not None:
            fragmented = (fragmented or 0.0) + f
    out.reserved, out.allocated, out.fragmented = reserved, allocated, fragmented
    if reserved is not None and allocated is not None:
        out.cache = max(0.0, reserved - allocated)
    return held


def _split_allocated(
    out: Breakdown,
    running: list[ProcessReading],
    held: Mapping[int, float],
    t: int,
    phases: Mapping[int, Mapping[str, float]],
) -> None:
    """Set ``out``'s predicted categories (and what they leave unexplained, the headroom
    to the phase's peak): a process inside an explained phase by that explanation, its
    model state whole (:attr:`Breakdown.lifted`); else by its predicted line at ``t``."""
    for reading in running:
        line = reading.line
        if line is None:
            continue
        pid = reading.proc.pid
        parts: Mapping[str, float] | None
        if pid in phases and pid in held and reading.span is not None:
            peak = float(reading.span["peak_alloc"])
            # The state, and what the explanation leaves unexplained at the peak, stay whole.
            floor = sum(float(phases[pid].get(k, 0.0)) for k in STATE) + max(
                0.0, peak - sum(float(v) for v in phases[pid].values())
            )
            # Shown whole from the cache it comes back from (zero_grad's freed gradients
            # in a later step's backward); what the cache cannot hold yet (the first
            # backward's gradients) the phase only reaches above the cursor (▲).
            room = min(out.cache or 0.0, out.budget - (out.allocated or 0.0)) - out.lifted
            lift = min(max(0.0, floor - held[pid]), max(0.0, room))
            out.lifted += lift
            gone = peak - held[pid] - lift
            parts, removed = _below_peak(phases[pid], gone)
            out.removed = out.removed or {}
            for name, v in removed.items():
                out.removed[name] = out.removed.get(name, 0.0) + v
        else:
            parts = line.breakdown_at(t)
        for name, v in (parts or {}).items():
            out.predicted[name] = out.predicted.get(name, 0.0) + v
    if out.lifted and out.cache is not None:  # the state shown whole is not cache
        out.cache = max(0.0, out.cache - out.lifted)
    if out.predicted and out.allocated is not None:
        shown = out.allocated + out.lifted
        out.unexplained = shown - sum(out.predicted.values())
        out.headroom = max(0.0, _ceiling(running, out.allocated, held) - shown)


def _used_at(
    session: Session, key: str, t: int, out: Breakdown, row: dict[str, float | int] | None
) -> int | None:
    """Set ``out.used`` from NVML's sample valid at ``t`` (``row``); returns its time."""
    used = _known(row, "used")
    if row is None or used is None:
        return None
    age = t - int(row["t"])
    rate = session.sampler_rate.get(key)
    limit = max(USED_MAX_AGE, int(3e9 / rate)) if rate else USED_MAX_AGE
    if age > limit:  # the sampler stopped (a lost GPU, a gap in the recording)
        return None
    out.used = used
    out.ages["nvidia-smi"] = age
    return int(row["t"])


def _below_peak(
    categories: Mapping[str, float], gone: float
) -> tuple[dict[str, float], dict[str, float]]:
    """A phase's categories at its exact peak less ``gone`` bytes (the peak minus what is
    shown of it), taken from what moves between boundaries (:data:`MOVING`), the last
    categories first, then only from the model's state: (what is left, what went)."""
    left = {k: float(v) for k, v in categories.items()}
    removed: dict[str, float] = {}
    gone = max(0.0, gone)
    # The state last: only what the phase itself makes of it (the first backward's
    # gradients, the first step's AdamW state) is not there yet at the cursor.
    for name in (*reversed(MOVING), *reversed(STATE)):
        v = min(left.get(name, 0.0), gone)
        if v > 0:
            left[name] -= v
            removed[name] = v
            gone -= v
    return left, removed


def _used_at_oom(oom: Oom, out: Breakdown, t_used: int | None, t: int) -> int | None:
    """Set ``out.used`` from the OOM's ``free`` when NVML's sample predates the error (the
    allocator frees its cache before it raises: the sample's used is a moment too old);
    returns the OOM's time then."""
    free = oom.body.get("free")
    if not isinstance(free, int) or isinstance(free, bool) or free < 0 or out.total is None:
        return None
    if t_used is not None and t_used >= oom.t:
        return None
    out.used = float(max(0, out.total - free))
    out.ages["nvidia-smi"] = t - oom.t
    return oom.t


def _reserved(session: Session, proc: Process, t: int) -> float:
    """``proc``'s reserved bytes at ``t`` (0 when it was not running, or had none)."""
    if not session.runs_at(proc, t):
        return 0.0
    return proc.torch.value_at("reserved", t) or 0.0


def _moved(session: Session, procs: list[Process], t0: int, t1: int) -> bool:
    """Did any of ``procs`` reserve or release memory between ``t0`` and ``t1``."""
    return any(abs(_reserved(session, p, t0) - _reserved(session, p, t1)) > SAME for p in procs)


def _split_used(
    session: Session,
    key: str,
    t: int,
    out: Breakdown,
    everyone: list[Process],
    procs: list[Process],
) -> None:
    """Set ``other``, ``context`` and the unclaimed or unsplit rest of the used memory."""
    reserved = out.reserved or 0.0
    found = _process_usage(session, key, t)
    claimed = reserved
    if found is not None:
        per_pid, t_list = found
        out.ages["processes"] = t - t_list
        if not out.why:
            # Stored when it changes: still the list at t if nothing it describes moved.
            now, then = out.used, session.gpu[key].value_at("used", t_list)
            same = now is not None and then is not None and abs(now - then) <= SAME
            if not same or _moved(session, everyone, t_list, t):
                out.why = f"process list {(t - t_list) / 1e9:.1f}s old"
        if not out.why:
            mine = {p.pid for p in procs}
            out.other = float(sum(u for pid, u in per_pid.items() if pid not in mine))
            listed = [p for p in procs if p.pid in per_pid]
            if listed:
                context = sum(per_pid[p.pid] for p in listed) - sum(
                    _reserved(session, p, t) for p in listed
                )
                if context >= -SAME:
                    out.context = max(0.0, float(context))
                else:  # the list says less than torch holds: it cannot be split
                    out.why = "process list below torch's"
                    out.other = None
            claimed += (out.other or 0.0) + (out.context or 0.0)
    if out.used is not None:
        rest = max(0.0, out.used - claimed)
        if not out.why and out.context is not None and rest <= SAME:
            # The driver's few MiB no process lists: part of "CUDA context and non-torch"
            # (NVML used - reserved), as `info` and the Peaks tab count it, so the context
            # is one figure everywhere.
            out.context += rest
            rest = 0.0
        if out.why:
            out.unsplit = rest
        else:
            out.unclaimed = rest


def _known(row: dict[str, float | int] | None, column: str) -> float | None:
    """A row's value as a float; None for no row, NaN or the missing marker."""
    if row is None:
        return None
    v = row[column]
    if v == MISSING_INT:
        return None
    v = float(v)
    return None if math.isnan(v) else v


def _ceiling(running: list[ProcessReading], allocated: float, held: Mapping[int, float]) -> float:
    """The most that can have been allocated at the moment: each process's held figure
    (``held``, by pid; ``allocated`` is their sum), or the exact peak of the innermost
    phase it is in then when that is higher."""
    ceiling = allocated
    for reading in running:
        span = reading.span
        peak = span.get("peak_alloc") if span is not None else None
        if peak is not None and reading.proc.pid in held:
            ceiling += max(0.0, float(peak) - held[reading.proc.pid])
    return ceiling


def _process_usage(session: Session, key: str, t: int) -> tuple[dict[int, float], int] | None:
    """pid -> used bytes from the newest NVML process snapshot at or before ``t``, and
    that snapshot's time."""
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
    return out, int(cols["t"][0])
