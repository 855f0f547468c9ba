"""An instrumented process: its tables, what it did, and the window queries on them.

:class:`Process` holds what one process's messages said; the window queries read its own
tables only. Queries that also need the session (names, its lock) stay on
:class:`~gpuwatch.session.session.Session`.
"""

from __future__ import annotations

import functools
import unicodedata
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np

from . import summary as sm
from .model import (
    HOST,
    PEAK_COLUMNS,
    PHASE_COLUMNS,
    RSS_COLUMNS,
    TORCH_COLUMNS,
    OpenSpan,
)
from .openspans import OpenBook
from .table import MISSING_INT, Table

PROCESS_TABLES = {
    "torch": TORCH_COLUMNS,
    "peaks": PEAK_COLUMNS,
    "rss": RSS_COLUMNS,
    "phases": PHASE_COLUMNS,
}

PROCESS_ROWS = 0
"""Rows a new process's tables have room for (16 at the first row, doubling as they
fill): a sweep of thousands of short scripts reserves nothing for the tables they leave
empty, nor does a replay for tables its file fills."""


MAX_EPOCHS = 32
"""Most models (facts epochs) a process keeps: beyond, the oldest but the first are
forgotten (see :func:`add_facts`)."""

MAX_EPOCH = 1 << 20
"""Largest epoch number a facts message may give (a larger one is not an epoch)."""

LABEL_CHARS = 40
"""Longest notebook name a label shows (the middle gives way, the extension stays)."""


class FactsEpoch(NamedTuple):
    """One model a process described, in force from ``start`` until the next one's start.

    Attributes:
        start: When it was described (the facts message's ``t``); the first is also in
            force before its start (a model's first forward may begin a hair before its
            facts are sent).
        epoch: The client's number for the model (``facts["epoch"]``), or None where its
            facts gave none.
        facts: Its latest facts; None for models forgotten beyond :data:`MAX_EPOCHS` (their
            phases are not predicted: no other model's facts stand in for them).
    """

    start: int
    epoch: int | None
    facts: dict[str, Any] | None


def epoch_number(facts: Mapping[str, Any]) -> int | None:
    """The model number a facts dict gives (``epoch``), or None where it gives no usable one
    (absent, not a plain int, negative, or beyond :data:`MAX_EPOCH`): the script's word."""
    number = facts.get("epoch")
    return number if type(number) is int and 0 <= number <= MAX_EPOCH else None


def add_facts(proc: Process, facts: dict[str, Any], t: int) -> None:
    """Take a facts message (or a hello's facts) sent at ``t``.

    Facts of the latest model's number complete it (they replace its facts, batch or
    activations added); a different number starts a new model at ``t``; facts with no
    usable number replace the latest model's, as before epochs existed. A latest model
    without a number takes the first one given. Past :data:`MAX_EPOCHS` models, those
    after the first are forgotten oldest first, their stretch of time kept as one entry
    without facts.
    """
    number = epoch_number(facts)
    log = proc.facts_epochs()
    if not log:
        log = (FactsEpoch(t, number, facts),)
    else:
        last = log[-1]
        if number is None or last.epoch is None or number == last.epoch:
            kept = last.epoch if number is None else number
            log = (*log[:-1], FactsEpoch(last.start, kept, facts))
        else:  # times only move forward: the entries stay in order of their start
            log = (*log, FactsEpoch(max(t, last.start), number, facts))
    if len(log) > MAX_EPOCHS:  # the second and third become one forgotten stretch
        log = (log[0], FactsEpoch(log[1].start, None, None), *log[3:])
    proc.facts_log = log
    proc.facts = facts


@functools.lru_cache(maxsize=256)  # asked for at every frame, for every band row
def notebook_label(value: str) -> str | None:
    """A notebook's name for a label: the base name of ``value`` (a path, or
    ``kernel-<id>``), without control or format characters (newlines, escapes,
    bidirectional overrides), at most :data:`LABEL_CHARS` characters; None when nothing
    is left. ``value`` is the script's word."""
    name = value.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    name = "".join(c for c in name if unicodedata.category(c)[0] != "C").strip()
    if len(name) > LABEL_CHARS:
        head = LABEL_CHARS * 2 // 3
        name = name[:head] + "…" + name[len(name) - (LABEL_CHARS - head - 1) :]
    return name or None


@dataclass(slots=True)
class Tally:
    """What a process did, counted as its rows arrive: exact however many rows memory
    lets go (the Prometheus exporter reports these).

    Attributes:
        count: Phase name id -> phases of that name that ended.
        ns: Phase name id -> nanoseconds inside them.
        peaks: Phase name id -> ``(t1, peak allocated, peak reserved, dev)`` of the last
            ended span of that name that reported a peak.
        step: The step of the last ended phase that had one.
        dev: The torch device of the last ended phase that named one.
        torch: torch device index -> its newest ``(allocated, reserved, inactive_split,
            alloc_retries, alloc_ooms)``, the newest device last (unknown: MISSING_INT).
    """

    count: Counter[int] = field(default_factory=Counter)
    ns: Counter[int] = field(default_factory=Counter)
    peaks: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)
    step: int | None = None
    dev: int | None = None
    torch: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def phases(self, cols: dict[str, np.ndarray]) -> None:
        """Count ended spans (columns of PHASE_COLUMNS, in end order)."""
        n = len(cols["t1"])
        if n == 0:
            return
        ids, inverse = np.unique(cols["name"], return_inverse=True)
        counts = np.bincount(inverse, minlength=len(ids))
        ns = np.bincount(inverse, weights=(cols["t1"] - cols["t0"]).astype(np.float64))
        for nid, c, d in zip(ids.tolist(), counts.tolist(), ns.tolist(), strict=True):
            self.count[nid] += c
            self.ns[nid] += int(d)
        steps = cols["step"][cols["step"] != MISSING_INT]
        if len(steps):
            self.step = int(steps[-1])
        devs = cols["dev"][cols["dev"] != MISSING_INT]
        if len(devs):
            self.dev = int(devs[-1])
        with_peak = np.flatnonzero(cols["peak_alloc"] != MISSING_INT)
        if len(with_peak):
            names = cols["name"][with_peak]
            last, first_rev = np.unique(names[::-1], return_index=True)
            for nid, j in zip(last.tolist(), first_rev.tolist(), strict=True):
                i = with_peak[len(with_peak) - 1 - j]
                self.peaks[nid] = (
                    int(cols["t1"][i]),
                    int(cols["peak_alloc"][i]),
                    int(cols["peak_reserved"][i]),
                    int(cols["dev"][i]),
                )

    def figures(self, cols: dict[str, np.ndarray]) -> None:
        """Note the newest allocator figures of each device (columns of TORCH_COLUMNS)."""
        devs = cols["dev"]
        if not len(devs):
            return
        _, first_rev = np.unique(devs[::-1], return_index=True)
        for i in sorted(len(devs) - 1 - j for j in first_rev.tolist()):
            dev = int(devs[i])
            self.torch.pop(dev, None)  # re-inserted: the newest device last
            self.torch[dev] = tuple(int(cols[k][i]) for k in TORCH_FIGURES)


TORCH_FIGURES = ("allocated", "reserved", "inactive_split", "alloc_retries", "alloc_ooms")
"""The allocator figures :attr:`Tally.torch` keeps, in order."""


@dataclass(slots=True)  # thousands may end in a sweep: no dict of attributes each
class Process:
    """An instrumented process, known from its messages.

    Attributes:
        pid: Process id, as the kernel reports the sender (never the datagram's claim).
        hello: The latest ``hello`` body (argv, rank, devices, ...).
        facts: The latest model facts, if the script sent any (what wants the model now
            reads these).
        facts_log: Each model it described, oldest first (see :class:`FactsEpoch`);
            read through :meth:`facts_epochs` and :meth:`facts_at`.
        devices: torch device index -> session device key.
        dropped: Events the process says it dropped before sending (cumulative, as
            reported: its queue was full, or no receiver had room).
        gaps: Events it sent that were lost on the way: sequence numbers never received,
            and what reached gpuwatch too late to be recorded (see ``count_lost``).
        rejected: Its datagrams the receiver refused (counted here, not as gaps).
        torch: Allocator figures reported at boundaries and periodically.
        peaks: Exact allocator peaks between consecutive boundaries.
        rss: Resident set size sampled by the gpuwatch process.
        phases: Ended spans (see :data:`~gpuwatch.session.model.PHASE_COLUMNS`).
        open: Spans begun and not yet ended, by id, oldest first.
        abandoned: Open spans closed unended to keep at most
            :data:`~gpuwatch.session.openspans.MAX_OPEN` open.
        ended: The time of its ``bye``, if it said goodbye.
    """

    pid: int
    hello: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Any] | None = None
    facts_log: tuple[FactsEpoch, ...] = ()  # immutable: readers cache by identity
    devices: dict[int, str] = field(default_factory=dict)
    dropped: int = 0
    gaps: int = 0
    rejected: int = 0
    last_seq: int = -1
    first_t: int = 0
    last_t: int = 0
    torch: Table = field(default_factory=lambda: Table(TORCH_COLUMNS, PROCESS_ROWS, kind="torch"))
    peaks: Table = field(default_factory=lambda: Table(PEAK_COLUMNS, PROCESS_ROWS, kind="peaks"))
    last_boundary: int | None = None
    torch_devs: set[int] = field(default_factory=set)  # device indices seen in figures
    max_segment: int = 0
    rss: Table = field(default_factory=lambda: Table(RSS_COLUMNS, PROCESS_ROWS, kind="rss"))
    phases: Table = field(default_factory=lambda: Table(PHASE_COLUMNS, PROCESS_ROWS, kind="phases"))
    open: dict[int, OpenSpan] = field(default_factory=OrderedDict)
    abandoned: int = 0
    ended: int | None = None
    exit_code: int | None = None
    gone: int | None = None  # when the host sampler found it gone (it may not say bye)
    max_span: int = 0
    host: str = HOST  # the key of the host device it runs on
    origin: str = ""  # the recording it came from, in a merged replay (host name)
    os_pid: int | None = None  # its pid there, when ``pid`` had to be renumbered
    # The pid it gave itself, when the kernel's differs: its pid inside its container's
    # PID namespace (``pid`` is always the kernel's, as seen from the gpuwatch process).
    container_pid: int | None = None
    tally: Tally = field(default_factory=lambda: Tally())
    rev: int = 0  # bumped by each message: the recorder rewrites only what changed
    # Open spans' upkeep; None while the process is compacted (see compact).
    book: OpenBook | None = field(default_factory=OpenBook, repr=False)

    def facts_epochs(self) -> tuple[FactsEpoch, ...]:
        """Each model described, oldest first, the last holding :attr:`facts` (empty
        without facts).

        Facts set without :func:`add_facts` (older code, a test) replace the latest
        model's.
        """
        log, facts = self.facts_log, self.facts
        if not facts:
            return ()
        if log and log[-1].facts is facts:
            return log
        if not log:
            return (FactsEpoch(self.first_t, epoch_number(facts), facts),)
        return (*log[:-1], log[-1]._replace(facts=facts))

    def facts_at(self, t: int) -> dict[str, Any] | None:
        """The facts in force at ``t``: the last model described at or before it; before
        the first, the first's. None without facts, or for a forgotten model's time."""
        log = self.facts_epochs()
        found: FactsEpoch | None = log[0] if log else None
        for entry in reversed(log):
            if entry.start <= t:
                found = entry
                break
        return found.facts if found is not None else None

    @property
    def short_label(self) -> str:
        """Name for a phase row under its device: ``rank N`` under torchrun; ``rank N of
        W`` where only the facts' process group names it (no launcher's ``RANK``: one rank
        of a larger job, as torch's fake process group runs it); a notebook kernel's
        notebook (its base name, cleaned: see :func:`notebook_label`); else the pid."""
        rank = self.hello.get("rank")
        world = self.hello.get("world_size")
        if rank is not None and (world or 0) > 1:
            return f"rank {rank}"
        grouped = self.group_rank
        if grouped is not None:
            return f"rank {grouped[0]} of {grouped[1]}"
        notebook = self.hello.get("notebook")
        if isinstance(notebook, str) and notebook:
            name = notebook_label(notebook)
            if name is not None:
                return name
        return f"pid {self.os_pid if self.os_pid is not None else self.pid}"

    @property
    def group_rank(self) -> tuple[int, int] | None:
        """``(rank, world size)`` of the process group its facts name (``parallel``), when
        the world holds two or more; the facts are a script's word: plain, plausible
        integers only."""
        par = self.facts.get("parallel") if isinstance(self.facts, dict) else None
        if not isinstance(par, dict):
            return None
        rank, world = par.get("rank"), par.get("world_size")
        if type(rank) is not int or type(world) is not int:
            return None
        return (rank, world) if 2 <= world <= 1 << 20 and 0 <= rank < world else None

    @property
    def label(self) -> str:
        """:attr:`short_label`, after the recording's origin (host) in a merged replay."""
        return f"{self.origin} {self.short_label}" if self.origin else self.short_label

    # ------------------------------------------------------------------ window queries

    def torch_window(
        self, key: str, column: str, t0: int, t1: int, width: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Min/max-decimated torch column on one device."""
        return self.torch.minmax(column, t0, t1, width, where=self._devices_of(key))

    def _devices_of(self, key: str) -> tuple[str, list[int]] | None:
        """A ``where`` keeping its rows on device ``key``; None when they all are."""
        if all(self.devices.get(d) == key for d in self.torch_devs):
            return None
        return ("dev", [i for i, k in self.devices.items() if k == key])

    def peak_window(self, key: str, column: str, t0: int, t1: int, width: int) -> np.ndarray:
        """Per-column exact allocator peaks (``peak_allocated`` / ``peak_reserved``)."""
        where = self._devices_of(key)
        return self.peaks.segment_max(column, t0, t1, width, self.max_segment, where)

    def spans(self, t0: int, t1: int) -> dict[str, np.ndarray]:
        """Ended spans of this process overlapping ``[t0, t1]`` (columns of PHASE_COLUMNS)."""
        table = self.phases
        known = table.span()  # (first end, last end): known without reading a row
        if known is None or known[1] < t0 or known[0] - self.max_span > t1:
            # None can overlap: a replay of thousands of processes asks each at a cursor.
            return {name: np.zeros(0, np.dtype(code)) for name, code in PHASE_COLUMNS}
        i0 = table.search(t0, "left")
        i1 = table.search(t1 + self.max_span, "right")
        cut = table.rows(i0, i1)
        keep = cut["t0"] <= t1
        if not keep.all():
            cut = {n: c[keep] for n, c in cut.items()}
        return cut

    def band_spans(self, t0: int, t1: int, width: int | None) -> dict[str, np.ndarray]:
        """The ended spans a band of ``width`` cells over ``[t0, t1]`` shows.

        Columns ``t0``, ``t1``, ``name``, ``depth``. All spans in the window while they
        are few (or ``width`` is not known); past four a cell, only those that win a cell
        (see :func:`~.summary.cell_winners`: the band draws them as it would draw all);
        and for archived rows past the table's exact budget, the winners of their
        summaries.
        """
        table = self.phases
        need = ("t0", "t1", "name", "depth")
        plan = table.plan(t0, t1, width or 200, lead=self.max_span)
        parts = []
        if plan.blocks is not None:
            b = plan.blocks
            keep = (b["w_t1"] >= t0) & (b["w_t0"] <= t1)
            parts.append({c: b["w_" + c][keep] for c in need})
        if plan.i1 > plan.i0 or plan.blocks is None:
            cols = table.rows(plan.i0, plan.i1, need)
            keep = cols["t0"] <= t1
            parts.append({c: v[keep] for c, v in cols.items()})
        cols = {c: np.concatenate([p[c] for p in parts]) for c in need}
        if width and len(cols["t0"]) > 4 * width:
            won = sm.cell_winners(cols["t0"], cols["t1"], cols["depth"], t0, t1, width)
            cols = {c: v[won] for c, v in cols.items()}
        return cols

    def phase_cover(self, t0: int, t1: int, width: int) -> np.ndarray:
        """Per column of ``[t0, t1]``: did it run an ended phase there."""
        table = self.phases
        plan = table.plan(t0, t1, width, lead=self.max_span)
        out = np.zeros(max(width, 0), dtype=bool)
        if plan.blocks is not None:
            out |= sm.cover(plan.blocks, t0, t1, width)
        if plan.i1 > plan.i0:
            cols = table.rows(plan.i0, plan.i1, ("t1", "t0"))
            blocks = {"rows": np.ones(len(cols["t1"]), np.int64), "start": cols["t0"]}
            blocks["t_last"] = cols["t1"]
            out |= sm.cover(blocks, t0, t1, width)
        return out


EMPTY_MAP: Mapping[Any, Any] = MappingProxyType({})
"""The empty mapping compacted processes share (read-only: nothing can fill it)."""

EMPTY_SET: frozenset[int] = frozenset()


def compact(proc: Process) -> None:
    """Keep what an ended process did, not room to do more.

    A sweep of thousands of short scripts keeps every one: its empty containers become
    shared read-only ones and, with no span open, its book of open spans goes. A message
    that changes it again finds room first (:func:`thaw`). Callers hold the session lock.
    """
    if proc.book is None or proc.open:
        return  # compacted already, or spans still open: their book is kept
    proc.book = None
    proc.open = EMPTY_MAP  # type: ignore[assignment]
    if not proc.devices:
        proc.devices = EMPTY_MAP  # type: ignore[assignment]
    if not proc.torch_devs:
        proc.torch_devs = EMPTY_SET  # type: ignore[assignment]
    tally = proc.tally
    for name in ("count", "ns", "peaks", "torch"):
        if not getattr(tally, name):
            setattr(tally, name, EMPTY_MAP)


def thaw(proc: Process) -> None:
    """Room again in a compacted process (a late message for it): every container its
    messages fill is its own and writable. Callers hold the session lock."""
    if proc.book is not None:
        return
    proc.open = OrderedDict()
    proc.devices = dict(proc.devices)
    proc.torch_devs = set(proc.torch_devs)
    tally = proc.tally
    tally.count, tally.ns = Counter(tally.count), Counter(tally.ns)
    tally.peaks, tally.torch = dict(tally.peaks), dict(tally.torch)
    proc.book = OpenBook()  # set last: a compacted process is one without a book


def count_sequence(proc: Process, seq: int) -> None:
    """Account for a sequence number received (or rejected): the numbers skipped since the
    last one were lost on the way. Those before the first one seen are not counted: a
    gpuwatch started after the process never heard them."""
    if seq > proc.last_seq + 1 and proc.last_seq >= 0:
        proc.gaps += seq - proc.last_seq - 1
    proc.last_seq = max(proc.last_seq, seq)
