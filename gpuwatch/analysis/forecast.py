"""Foresight: each phase's peak predicted before it runs, against what its device can give.

From a process's facts (and the activations its first training forward measured) the
predictor knows every phase of a full step, the first ``optimizer.step`` included, where
the optimizer's state is created and the foreach temporary comes on top. A
:class:`Forecast` sets those peaks against the bytes the process's allocator can have
(:class:`Capacity`: the GPU's total less the other processes and its own CUDA context, as
NVML counts them; the host's memory for a CPU run) and names each phase not yet run that
will not fit (:class:`Shortfall`: its peak, how much is missing, its largest categories
from the explanation object every view reads, and the planner's cheapest changes that fit).

:class:`Foresight` keeps the forecasts of a live session, off the ingest thread: it marks
each shortfall in the session (so the recording, ``info`` and replay show it) as soon as it
is known, and, when a forecast phase has run, marks how close the forecast came (off by
more than :data:`OFF_BY` is said as such). The dashboard, the exporter and the notebook's
line read the same forecasts; ``gpuwatch.watch(..., warn=True)`` makes one in the training
process itself (:func:`warn_in_process`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from .. import predict as pr
from ..facts import Facts
from ..fmt import fmt_bytes
from ..session import MISSING_INT, Mark, Process, Session
from .explain import CATEGORY_KEYS, Explained, explain_breakdown, labels
from .oom_answer import RESERVE
from .predicted import PredictedLine, predictions
from .rank_feed import newest_snapshot

OFF_BY = 0.10
"""A forecast further than this from the measured peak is marked as off."""

WARN_PREFIX = "forecast: "
"""How a shortfall's mark begins (``info`` finds the forecasts by it)."""

HELD_PREFIX = "forecast held: "
OFF_PREFIX = "forecast off: "

LARGEST = 3
"""Categories a shortfall names."""

CHANGES = 2
"""Changes that fit a shortfall names."""

EVERY = 2.0
"""Seconds between two looks when nothing arrived (the other processes' memory moves)."""


def phase_label(phase: str, first_step: bool) -> str:
    """``optimizer.step (first step)``; a forward after it is ``forward (later steps)``."""
    return f"{phase} ({'first step' if first_step else 'later steps'})"


@dataclass(frozen=True)
class Capacity:
    """What a process's allocator can have on its device.

    Attributes:
        usable: Bytes it can allocate: ``total - others - context``.
        total: The device's memory.
        others: What the other processes on it use (NVML).
        context: Its own memory that torch's allocator does not hold (the CUDA context,
            NVML's figure for it less torch's reserved; :data:`RESERVE` while unseen).
        where: The device in words (``GPU 0``, ``host``).
    """

    usable: int
    total: int
    others: int
    context: int
    where: str

    def text(self) -> str:
        """``58.2 GiB of GPU 0's 79.6 GiB (20.4 GiB other processes, 1.0 GiB context)``."""
        return (
            f"{fmt_bytes(self.usable)} of {self.where}'s {fmt_bytes(self.total)}"
            f" ({fmt_bytes(self.others)} other processes, {fmt_bytes(self.context)} context)"
        )


@dataclass(frozen=True)
class PhaseForecast:
    """One phase's predicted peak.

    Attributes:
        phase: Its name.
        first_step: The first step's variant (before the optimizer state exists).
        explained: Its peak by category: the explanation object of ``info`` and the bar.
        unknowns: What its prediction rests on that is not known (empty: nothing).
    """

    phase: str
    first_step: bool
    explained: Explained
    unknowns: tuple[str, ...] = ()

    @property
    def peak(self) -> int:
        return self.explained.predicted

    @property
    def key(self) -> tuple[str, bool]:
        return self.phase, self.first_step

    @property
    def label(self) -> str:
        return phase_label(self.phase, self.first_step)

    def largest(self, n: int = LARGEST) -> list[tuple[str, int]]:
        """Its ``n`` largest categories, (label, bytes), largest first."""
        parts = sorted(
            (p for p in self.explained.parts if p.key in CATEGORY_KEYS and p.bytes > 0),
            key=lambda p: -p.bytes,
        )
        return [(p.label, p.bytes) for p in parts[:n]]


@dataclass(frozen=True)
class Shortfall:
    """A phase not yet run whose peak is forecast above what its device can give.

    Attributes:
        forecast: The phase's forecast.
        capacity: What the device can give.
        changes: The planner's cheapest changes that fit, in words (may be empty).
    """

    forecast: PhaseForecast
    capacity: Capacity
    changes: tuple[str, ...] = ()

    @property
    def short(self) -> int:
        """Bytes missing."""
        return self.forecast.peak - self.capacity.usable

    def text(self) -> str:
        """One line: the phase, its peak, the shortfall, its largest parts, what fits."""
        f = self.forecast
        parts = ", ".join(f"{label} {fmt_bytes(n)}" for label, n in f.largest())
        line = (
            f"{WARN_PREFIX}{f.label} will need {fmt_bytes(f.peak)}, {fmt_bytes(self.short)}"
            f" more than {self.capacity.where} can give ({fmt_bytes(self.capacity.usable)})"
        )
        line += f": {parts}" if parts else ""
        if self.changes:
            line += "; fits with " + " or ".join(self.changes)
        return line

    def status(self) -> str:
        """The status line's few words: ``optimizer.step (first step) 1.2 GiB short``."""
        return f"forecast: {self.forecast.label} {fmt_bytes(self.short)} short"


@dataclass
class Forecast:
    """One process's phases, predicted, against its device.

    Attributes:
        pid: The process.
        t: When it was made.
        phases: Every phase of a full step (and eval), both variants.
        capacity: What its device can give (None: not known yet).
        ran: The phases (name, first step) that have run.
        shortfalls: The phases not yet run that will not fit (none rest on unknowns).
        unsure: The phases not yet run that might not fit, whose prediction rests on
            unknowns: said, not warned about.
    """

    pid: int
    t: int
    phases: list[PhaseForecast]
    capacity: Capacity | None
    ran: frozenset[tuple[str, bool]] = frozenset()
    shortfalls: list[Shortfall] = field(default_factory=list)
    unsure: list[PhaseForecast] = field(default_factory=list)

    def ahead(self) -> list[PhaseForecast]:
        """The phases not yet run."""
        return [p for p in self.phases if p.key not in self.ran]

    def get(self, phase: str, first_step: bool) -> PhaseForecast | None:
        return next((p for p in self.phases if p.key == (phase, first_step)), None)

    def peaks_ahead(self) -> dict[str, int]:
        """Phase name -> the highest forecast peak of its variants not yet run (and
        resting on nothing unknown): what the chart's line and the exporter show."""
        out: dict[str, int] = {}
        for p in self.ahead():
            if not p.unknowns:
                out[p.phase] = max(out.get(p.phase, 0), p.peak)
        return out


def _unknowns(prediction: pr.Prediction, phase: str) -> tuple[str, ...]:
    """What ``phase``'s predicted peak rests on that the facts do not say."""
    out = []
    if not prediction.layout.modelled:
        out.append("the parallel layout's buffers")
    if phase in ("forward", "backward", "eval") and not prediction.activations_known:
        out.append("the activations, neither measured nor known from a transformer shape")
    if phase == "optimizer.step" and prediction.optimizer.kind in ("none", "other"):
        out.append("the optimizer, not known until its first step (gpuwatch.watch(model, opt))")
    return tuple(out)


def phase_forecasts(prediction: pr.Prediction) -> list[PhaseForecast]:
    """Every phase's forecast from a prediction, in the predictor's order."""
    out = []
    for (phase, first), memory in prediction.phases.items():
        categories = {k: int(memory.peak.get(k, 0)) for k in CATEGORY_KEYS}
        explained = Explained(
            phase=phase,
            first_step=first,
            count=0,
            measured=None,
            predicted=int(pr.total(memory.peak)),
            categories=categories,
            parts=explain_breakdown(prediction, phase, categories, None),
            temporaries=labels(prediction, phase)["temporaries"][0],
        )
        out.append(PhaseForecast(phase, first, explained, _unknowns(prediction, phase)))
    return out


FORECAST_PHASES = ("forward", "backward", "optimizer.step", "eval")
"""The phases forecast: ``clip`` too where a script has run one; never ``zero_grad``,
which frees gradients and allocates nothing (its peak is the level it starts from)."""


def make_forecast(
    pid: int,
    t: int,
    prediction: pr.Prediction,
    capacity: Capacity | None,
    ran: Iterable[tuple[str, bool]] = (),
    phases: Iterable[str] | None = None,
) -> Forecast:
    """A process's forecast (changes that fit are :func:`with_changes`' work).

    Args:
        pid: The process.
        t: Now.
        prediction: Its prediction.
        capacity: What its device can give, if known.
        ran: The phases that have run.
        phases: Only these phase names (None: :data:`FORECAST_PHASES`).
    """
    done = frozenset(ran)
    names = set(phases) if phases is not None else set(FORECAST_PHASES)
    every = [p for p in phase_forecasts(prediction) if p.phase in names]
    out = Forecast(pid, t, every, capacity, done)
    if capacity is None:
        return out
    for p in out.ahead():
        if p.peak > capacity.usable:
            if p.unknowns:
                out.unsure.append(p)
            else:
                out.shortfalls.append(Shortfall(p, capacity))
    return out


def changes_that_fit(facts: Any, usable: int, n: int = CHANGES) -> tuple[str, ...]:
    """The planner's ``n`` cheapest changes that fit in ``usable`` bytes, in words
    (``--checkpointing (62.58 GiB)``); empty where none fits or the facts cannot be
    planned."""
    try:
        plan, _ = pr.plan_from_facts(facts)
        ans = pr.answer(plan, max(usable, 0))
    except Exception:  # the script's word: a plan it cannot make is no change
        return ()
    fitting = [c for c in ans.changes if c.peak_bytes <= ans.usable]
    return tuple(f"{c.flags} ({fmt_bytes(c.peak_bytes)})" for c in fitting[:n])


def with_changes(fc: Forecast, facts: Any) -> Forecast:
    """``fc`` with each shortfall's changes that fit (the planner's bisection: not per
    frame, once per new shortfall)."""
    if fc.capacity is None or not fc.shortfalls:
        return fc
    changes = changes_that_fit(facts, fc.capacity.usable)
    fc.shortfalls = [Shortfall(s.forecast, s.capacity, changes) for s in fc.shortfalls]
    return fc


# ---------------------------------------------------------------------- in a session


def _gpu_of(session: Session, proc: Process) -> str | None:
    """The key of the GPU the process uses: one its figures name, else one whose NVML
    process list holds it."""
    for key in proc.devices.values():
        dev = session.devices.get(key)
        if dev is not None and dev.kind == "gpu":
            return key
    pids = {proc.pid} | ({proc.container_pid} if proc.container_pid else set())
    for key in sorted(session.gpu_procs):
        if pids & set(newest_snapshot(session, key)):
            return key
    return None


def _reserved(proc: Process) -> int:
    """torch's newest reserved bytes in the process (0: none reported)."""
    figures = list(proc.tally.torch.values())
    if not figures:
        return 0
    reserved = figures[-1][1]
    return 0 if reserved == MISSING_INT else int(reserved)


def capacity_of(session: Session, proc: Process) -> Capacity | None:
    """What ``proc``'s allocator can have now: on its GPU, from NVML's newest process
    list; on the host for a process whose facts put the model on the CPU (None: not known)."""
    key = _gpu_of(session, proc)
    if key is not None:
        dev = session.devices[key]
        if not dev.total:
            return None
        snap = newest_snapshot(session, key)
        others = sum(u or 0 for pid, u in snap.items() if pid not in (proc.pid, proc.container_pid))
        mine = snap.get(proc.pid)
        context = max(mine - _reserved(proc), 0) if mine is not None else RESERVE
        where = f"GPU {dev.index}" if dev.index is not None else (dev.name or "its GPU")
        usable = max(int(dev.total) - others - context, 0)
        return Capacity(usable, int(dev.total), others, context, where)
    if not _on_cpu(proc.facts):
        return None
    host = session.host_table(proc.host)
    last = host.last() if len(host) else None
    if not last or int(last.get("total", MISSING_INT)) <= 0:
        return None
    total, available = int(last["total"]), int(last["available"])
    rss = proc.rss.last() if len(proc.rss) else None
    mine = int(rss["rss"]) if rss else 0
    usable = max(available + mine, 0)
    return Capacity(usable, total, max(total - usable, 0), 0, "the host")


def _on_cpu(facts: Any) -> bool:
    groups = (facts or {}).get("params", {}).get("groups") if isinstance(facts, dict) else None
    devices = {str(g.get("device", "")) for g in groups or [] if isinstance(g, dict)}
    return bool(devices) and all(d == "cpu" for d in devices)


@dataclass
class _Watch:
    """What :class:`Foresight` keeps of one process's current model."""

    start: int  # the model's start (its epoch)
    cursor: int  # phase rows read
    stepped: bool = False  # its first optimizer.step has ended
    ran: set[tuple[str, bool]] = field(default_factory=set)
    warned: set[tuple[str, bool]] = field(default_factory=set)
    expected: dict[tuple[str, bool], int] = field(default_factory=dict)  # the latest forecast
    settled: set[tuple[str, bool]] = field(default_factory=set)
    made: tuple[Any, ...] = ()


class Foresight:
    """The forecasts of a session's processes, kept up to date off the ingest thread.

    As a session listener it only notes that facts or phases came; its thread (or a
    caller of :meth:`update`) forecasts anew and marks each new shortfall and each
    forecast phase that has run. Get the shared one with :func:`foresight`.

    Args:
        session: The session.
        marks: Mark shortfalls and outcomes in the session (False for a replay, whose
            recording holds the marks it made live).
    """

    def __init__(self, session: Session, marks: bool = True) -> None:
        self.session = session
        self.marks = marks
        self.forecasts: dict[int, Forecast] = {}
        self.failures = 0
        self._watch: dict[int, _Watch] = {}
        self._due = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.updated = 0  # forecasts made (a test waits on it)
        # Some process has a phase of a step still to run, or a shortfall: its phases' ends
        # matter (True until the first look).
        self.waiting = True
        self.cpu_seconds = 0.0  # CPU time of its thread (benchmarks/bench_forecast.py)

    @property
    def running(self) -> bool:
        """Its thread keeps the forecasts up to date (else :meth:`update` does)."""
        return self._thread is not None and self._thread.is_alive()

    def __call__(self, event: object) -> None:
        """Session listener: facts came, or a phase ended while one forecast is still to
        run (cheap: the thread does the work; a long run's thousands of phases a second
        do not wake it once every phase forecast has run)."""
        # A message from a process is its own event (protocol.Message): it has a kind.
        kind = getattr(event, "kind", None)
        ended = kind == "phase" and getattr(event, "body", {}).get("event") == "end"
        if kind == "facts" or (ended and self.waiting):
            self._due.set()

    def start(self) -> None:
        """Subscribe to the session and forecast on a thread of its own (again: nothing)."""
        if self._thread is not None:
            return
        self.session.subscribe(self)
        self._thread = threading.Thread(target=self._run, name="gpuwatch-foresight", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (after a last look)."""
        self._stop.set()
        self._due.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            self._due.wait(EVERY)
            self._due.clear()
            stopping = self._stop.is_set()
            start = time.thread_time()
            try:
                self.update()
            except Exception as exc:  # tried again next time; the session goes on
                self.failures += 1
                if self.failures == 1:
                    self.session.note(f"cannot forecast ({type(exc).__name__}): {exc}"[:160])
            self.cpu_seconds += time.thread_time() - start

    def update(self) -> dict[int, Forecast]:
        """Forecast every running process that sent facts; marks what is new."""
        with self._lock:
            running = set()
            for proc in list(self.session.processes.values()):
                if proc.facts and proc.ended is None and proc.gone is None:
                    running.add(proc.pid)
                    self._one(proc)
            for pid in set(self.forecasts) - running:  # ended: nothing of it is to come
                del self.forecasts[pid]
            for pid in set(self._watch) - running:
                del self._watch[pid]
            self.waiting = not running or any(
                fc.shortfalls or any(p.phase in STEP_PHASES for p in fc.ahead())
                for fc in self.forecasts.values()
            )
            return dict(self.forecasts)

    def _one(self, proc: Process) -> None:
        line = predictions(self.session).line(proc)
        if line is None or line.prediction is None or not line.epochs:
            return
        watch = self._follow(proc, line)
        capacity = capacity_of(self.session, proc)
        stamp = (id(line.prediction), capacity, frozenset(watch.ran))
        if stamp == watch.made:
            return
        watch.made = stamp
        clip = {pr.CLIP} if (pr.CLIP, True) in watch.ran or (pr.CLIP, False) in watch.ran else set()
        names = set(FORECAST_PHASES) | clip
        now = self.session.now()
        fc = make_forecast(proc.pid, now, line.prediction, capacity, watch.ran, names)
        watch.expected.update({p.key: p.peak for p in fc.ahead() if not p.unknowns})
        if any(s.forecast.key not in watch.warned for s in fc.shortfalls):
            fc = with_changes(fc, proc.facts)
        for s in fc.shortfalls:
            if s.forecast.key not in watch.warned:
                watch.warned.add(s.forecast.key)
                self._mark(proc.pid, s.text(), "warning")
        self.forecasts[proc.pid] = fc
        self.updated += 1

    def _follow(self, proc: Process, line: PredictedLine) -> _Watch:
        """The process's watch, its phases read up to now (a new model starts anew)."""
        start = line.epochs[-1].start
        watch = self._watch.get(proc.pid)
        if watch is None or watch.start != start:
            first = proc.phases.search(start, "left") if len(line.epochs) > 1 else 0
            watch = self._watch[proc.pid] = _Watch(start, first)
        table = proc.phases
        if len(table) <= watch.cursor:
            return watch
        opt = self.session.find_name("optimizer.step")
        for cols in table.batches(watch.cursor, None, ("t1", "name", "peak_alloc")):
            names, peaks = cols["name"], cols["peak_alloc"]
            cut, stepped = (0, True) if watch.stepped else (len(names), False)
            if not stepped and opt is not None:
                hits = np.flatnonzero(names == opt)
                if len(hits):  # the first optimizer.step: what ends after it is a later step's
                    cut, stepped = int(hits[0]) + 1, True
            # Only the first span of each name in each variant matters: one pass in numpy.
            for first, lo, hi in ((True, 0, cut), (False, cut, len(names))):
                ids, at = np.unique(names[lo:hi], return_index=True)
                for name_id, i in zip(ids.tolist(), at.tolist(), strict=True):
                    self._ran(proc.pid, watch, name_id, first, int(peaks[lo + i]))
            watch.stepped = stepped
            watch.cursor += len(names)
        return watch

    def _ran(self, pid: int, watch: _Watch, name_id: int, first: bool, peak: int) -> None:
        names = self.session.names
        key = (names[name_id] if 0 <= name_id < len(names) else "", first)
        if key not in watch.ran:
            watch.ran.add(key)
            self._settle(pid, watch, key, peak)

    def _settle(self, pid: int, watch: _Watch, key: tuple[str, bool], peak: int) -> None:
        """A phase forecast before it ran has run: mark a forecast off by more than
        :data:`OFF_BY`, and how close a warning came (only where the allocator measured
        its peak: CUDA)."""
        forecast = watch.expected.get(key)
        if forecast is None or key in watch.settled or peak == MISSING_INT or peak <= 0:
            return
        watch.settled.add(key)
        off = (forecast - peak) / peak
        label = phase_label(*key)
        figures = f"forecast {fmt_bytes(forecast)}, measured {fmt_bytes(peak)}"
        if abs(off) > OFF_BY:
            self._mark(pid, f"{OFF_PREFIX}{label} off by {off:+.0%} ({figures})", "warning")
        elif key in watch.warned:
            self._mark(pid, f"{HELD_PREFIX}{label} within {abs(off):.0%} ({figures})", "info")

    def _mark(self, pid: int, text: str, level: str) -> None:
        if self.marks:
            self.session.add_mark(Mark(self.session.now(), pid, text, level))

    def warning(self) -> str | None:
        """The status line's warning: a shortfall of a phase still to come, or None."""
        for fc in list(self.forecasts.values()):
            if fc.shortfalls:
                s = max(fc.shortfalls, key=lambda s: s.short)
                return s.status()
        return None


STEP_PHASES = ("forward", "backward", pr.CLIP, "optimizer.step")
"""The phases of a training step: the chart's line is at the highest still to come (eval,
which a run may never do, is left to the warnings)."""


def level_ahead(session: Session, pid: int) -> int | None:
    """The highest forecast peak of the training-step phases ``pid`` has still to run (the
    chart's forecast line); None when none is left, or nothing forecasts this session."""
    fs = foresight_of(session)
    fc = fs.forecasts.get(pid) if fs is not None else None
    if fc is None:
        return None
    peaks = [v for k, v in fc.peaks_ahead().items() if k in STEP_PHASES]
    return max(peaks) if peaks else None


_registries: weakref.WeakKeyDictionary[Session, Foresight] = weakref.WeakKeyDictionary()
_made_lock = threading.Lock()


def foresight_of(session: Session) -> Foresight | None:
    """The forecasts of ``session`` if something made them (the live sources), else None:
    a view that only reads makes none."""
    return _registries.get(session)


def foresight(session: Session, marks: bool = False) -> Foresight:
    """The forecasts of ``session``, shared by every view (made on first use; ``marks``
    only decides for the first caller: the live sources, which start its thread)."""
    with _made_lock:
        found = _registries.get(session)
        if found is None:
            found = _registries[session] = Foresight(session, marks)
        return found


# ---------------------------------------------------------------------- came true or not


@dataclass(frozen=True)
class Outcome:
    """What became of a forecast marked in a session (``gpuwatch info``'s forecasts).

    Attributes:
        t: When it was marked.
        pid: The process.
        text: The mark's text.
        outcome: What happened, in words.
        came_true: True (the phase ran out of memory, or ran within :data:`OFF_BY` of the
            forecast), False (off by more), None (not known: it has not run, or ran
            where no allocator measured it).
    """

    t: int
    pid: int
    text: str
    outcome: str
    came_true: bool | None


def warned_phase(text: str) -> tuple[str, bool] | None:
    """(phase, first step) of a shortfall mark's text, or None for another mark."""
    if not text.startswith(WARN_PREFIX):
        return None
    head = text[len(WARN_PREFIX) :].split(" will need ", 1)[0]
    for first in (True, False):
        suffix = phase_label("", first)
        if head.endswith(suffix):
            return head[: -len(suffix)], first
    return None


def _settled_label(text: str) -> str:
    """``optimizer.step (first step)`` of a held or off mark."""
    rest = text.split(": ", 1)[-1]
    return rest.split(")", 1)[0] + ")" if ")" in rest else rest


def _ran_after(session: Session, pid: int, phase: str, t: int) -> bool:
    proc = session.processes.get(pid)
    nid = session.find_name(phase)
    if proc is None or nid is None:
        return False
    start = max(proc.phases.search(t, "left"), proc.phases.first)
    for cols in proc.phases.batches(start, None, ("t1", "t0", "name")):
        if bool(((cols["name"] == nid) & (cols["t0"] >= t)).any()):
            return True
    return False


def outcomes(session: Session) -> list[Outcome]:
    """Each shortfall marked in ``session`` and what became of it, then each forecast
    marked off when its phase ran, in time order."""
    marks = sorted(session.every_mark(), key=lambda m: m.t)
    settled = {
        (m.pid, _settled_label(m.text)): m
        for m in marks
        if m.text.startswith((HELD_PREFIX, OFF_PREFIX))
    }
    out: list[Outcome] = []
    told: set[int] = set()
    for m in marks:
        found = warned_phase(m.text)
        if found is None:
            continue
        phase, first = found
        oom = next(
            (
                o
                for o in session.ooms
                if o.pid == m.pid and o.t >= m.t and o.body.get("phase") == phase
            ),
            None,
        )
        after = settled.get((m.pid, phase_label(phase, first)))
        if after is not None:
            told.add(id(after))
            held = after.text.startswith(HELD_PREFIX)
            word = "came true" if held else "did not come true"
            said = after.text.split(": ", 1)[-1]
            out.append(Outcome(m.t, m.pid, m.text, f"{word}: {said}", held))
        elif oom is not None:
            late = f"{(oom.t - m.t) / 1e9:.1f} s later"
            what = f"came true: out of memory in {phase}, {late}"
            out.append(Outcome(m.t, m.pid, m.text, what, True))
        elif _ran_after(session, m.pid, phase, m.t):
            what = "its phase ran without an error; no allocator measured its peak"
            out.append(Outcome(m.t, m.pid, m.text, what, None))
        else:
            out.append(Outcome(m.t, m.pid, m.text, "its phase has not run", None))
    for m in marks:
        if m.text.startswith(OFF_PREFIX) and id(m) not in told:
            out.append(Outcome(m.t, m.pid, m.text, "marked when its phase ran", False))
    return sorted(out, key=lambda o: o.t)


# ---------------------------------------------------------------------- in the training process


def _host_capacity() -> Capacity | None:
    """The host's available memory plus this process's own resident set (Linux)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            info = {k: int(v.split()[0]) * 1024 for k, v in (ln.split(":", 1) for ln in f)}
        with open("/proc/self/statm", encoding="ascii") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
    total, available = info.get("MemTotal", 0), info.get("MemAvailable", 0)
    usable = min(available + rss, total)
    return Capacity(usable, total, total - usable, 0, "the host")


def capacity_here(facts: Any) -> Capacity | None:
    """What this process's allocator can have, read in the process itself (the notebook
    kernel, ``watch(..., warn=True)``): on CUDA, ``cudaMemGetInfo``'s free bytes plus what
    torch's allocator holds already (the rest, other processes and the CUDA context
    together, as ``others``); for a model on the CPU, the host's. Never initialises CUDA;
    None where it cannot tell."""
    if _on_cpu(facts):
        return _host_capacity()
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized():
            return None
        free, total = cuda.mem_get_info()
        usable = int(free) + int(cuda.memory_reserved())
    except Exception:
        return None
    return Capacity(usable, int(total), max(int(total) - usable, 0), 0, "this GPU")


def warn_text(facts: Any, capacity: Capacity) -> str | None:
    """The warning ``watch(..., warn=True)`` gives for ``facts`` on ``capacity``: the
    largest shortfall's line, or None where every phase fits (or rests on unknowns)."""
    try:
        prediction = pr.predict(cast(Facts, facts))
    except Exception:
        return None
    fc = make_forecast(0, 0, prediction, capacity)
    if not fc.shortfalls:
        return None
    fc = with_changes(fc, facts)
    return max(fc.shortfalls, key=lambda s: s.short).text()
