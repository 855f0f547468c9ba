"""The predicted line of each process, from its facts and its phases, for a window.

:mod:`gpuwatch.predict` turns facts and phase spans into a piecewise-linear curve (pure
Python). Only the spans a window shows are turned into a curve; when a window holds more
spans than its columns can show (hours of steps), each column is drawn from one whole
step at its middle, since every step of a run repeats the same predicted shape. Nothing
is stored in recordings: a replay predicts anew from the facts it recorded.
"""

from __future__ import annotations

import bisect
import functools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import numpy as np

from .. import predict as pr
from ..facts import Facts
from ..session import MISSING_INT, Process, Session
from ..session.decimate import column_edges

SPAN_COLUMNS = ("t1", "t0", "name", "step", "depth")
"""What a curve is drawn from (the first columns of a phases row: read without the rest)."""

MAX_SPANS = 2000
"""Above this many spans in a window, draw one representative step per column."""

SAMPLED_SPANS = 20_000
"""Above this many spans in a window (hours of a long run), predict only
:data:`SAMPLED_STEPS` steps spread over it: each column that ran phases shows the range
of the nearest one (every step repeats the same shape), the first step its own."""

SAMPLED_STEPS = 12


def first_optimizer_step(
    session: Session,
    proc: Process,
    start: int = 0,
    since: int | None = None,
    until: int | None = None,
) -> tuple[tuple[int, int] | None, int]:
    """``((step, t1), rows looked at)`` of the process's first ``optimizer.step`` at or
    after row ``start`` (None when none is there, or its step is unknown).

    Reads the phases from ``start`` on, in pieces, and stops at the first one found.

    Args:
        session: The session.
        proc: The process.
        start: The first phase row to look at.
        since, until: Only an ``optimizer.step`` that began in ``[since, until)`` counts
            (one model's: see :class:`Epoch`); None leaves that side open.
    """
    opt = session.find_name("optimizer.step")
    table = proc.phases
    if opt is None:
        return None, 0  # its name is not known yet: look again from the start
    checked = max(start, table.first)
    for cols in table.batches(checked, None, ("t1", "t0", "name", "step")):
        hit = cols["name"] == opt
        if since is not None:
            hit &= cols["t0"] >= since
        hits = np.flatnonzero(hit)
        if until is not None and len(hits):
            hits = hits[cols["t0"][hits] < until]
        if len(hits):
            i = hits[0]
            checked += int(i) + 1
            if cols["step"][i] == MISSING_INT:
                return None, checked
            return (int(cols["step"][i]), int(cols["t1"][i])), checked
        checked += len(cols["name"])
    return None, checked


FIRST_START = -(2**63)
"""Where the first model's time begins: its facts also hold before they were sent."""


@dataclass(eq=False)
class Epoch:
    """One model a process described: its stretch of time and its prediction.

    A span belongs to the model in force when it began (``start <= t0 < end``).

    Attributes:
        start: When its facts came into force (the first model: :data:`FIRST_START`).
        end: When the next model's did, or None for the latest.
        facts: Its facts; None for a model forgotten (nothing predicted in its time).
        prediction: From its facts; None where they cannot be used.
        first_step: The step of its first ``optimizer.step`` (a new model's optimizer
            has no state yet: its first step is higher again), once found.
        first_t: When that ``optimizer.step`` ended.
        checked: Phase rows searched for it.
    """

    start: int
    end: int | None
    facts: dict[str, Any] | None
    prediction: pr.Prediction | None = None
    first_step: int | None = None
    first_t: int | None = None
    checked: int = 0

    def find_first_step(self, session: Session, proc: Process) -> None:
        """Look for its first ``optimizer.step`` in the rows not searched yet."""
        if self.first_step is not None or self.prediction is None:
            return
        since = None if self.start == FIRST_START else self.start
        if self.checked == 0 and since is not None:
            # No span ending before the model began can have begun after it.
            self.checked = proc.phases.search(since, "left")
        found, self.checked = first_optimizer_step(
            session, proc, self.checked, since=since, until=self.end
        )
        if found is not None:
            self.first_step, self.first_t = found


def epochs_of(proc: Process, known: list[Epoch] | None = None) -> list[Epoch]:
    """The process's models as :class:`Epoch` s, without predictions: those of ``known``
    whose facts and stretch are the same are reused (predicted, first step found)."""
    log = proc.facts_epochs()
    reuse = {(id(e.facts), e.start): e for e in known or ()}
    out = []
    for i, entry in enumerate(log):
        start = FIRST_START if i == 0 else entry.start
        end = log[i + 1].start if i + 1 < len(log) else None
        kept = reuse.get((id(entry.facts), start))
        if kept is None or kept.facts is not entry.facts:
            out.append(Epoch(start, end, entry.facts))
        elif kept.end == end:
            out.append(kept)
        else:  # a newer model cut its time short: its first step is looked for again
            out.append(Epoch(start, end, entry.facts, kept.prediction))
    return out


def split_spans(epochs: list[Epoch], spans: list[pr.Span]) -> list[tuple[Epoch, list[pr.Span]]]:
    """``spans`` by the model in force when each began, in the models' order (those with
    no span left out)."""
    if len(epochs) <= 1:
        return [(epochs[0], spans)] if epochs and spans else []
    starts = [e.start for e in epochs[1:]]
    groups: list[list[pr.Span]] = [[] for _ in epochs]
    for sp in spans:
        groups[bisect.bisect_right(starts, sp.t0)].append(sp)
    return [(e, g) for e, g in zip(epochs, groups, strict=True) if g]


def epoch_index(epochs: list[Epoch], t: int) -> int:
    """The index of the model in force at ``t`` among ``epochs`` (not empty)."""
    if len(epochs) == 1:
        return 0
    return bisect.bisect_right([e.start for e in epochs[1:]], t)


P = ParamSpec("P")
R = TypeVar("R")


def _locked(
    method: Callable[Concatenate[PredictedLine, P], R],
) -> Callable[Concatenate[PredictedLine, P], R]:
    """One thread at a time in a line: the dashboard and the exporter's scrapes share it."""

    @functools.wraps(method)
    def call(self: PredictedLine, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._lock:
            return method(self, *args, **kwargs)

    return call


class PredictedLine:
    """The predicted allocated bytes of one process over time.

    Each span is predicted from the model in force when it began (:class:`Epoch`): a
    notebook that builds a new model predicts what follows from it, and what came before
    from the model that ran then.

    Args:
        session: The session the process belongs to.
        proc: The process.
    """

    def __init__(self, session: Session, proc: Process) -> None:
        self.session = session
        self.proc = proc
        self.epochs: list[Epoch] = []
        self._source: tuple[Any, Any] = ((), None)  # the (facts_log, facts) predicted from
        self._version = 0  # bumped when a model's prediction or first step changes
        self._last: tuple[Any, dict[str, int] | None] | None = None  # breakdown_at memo
        self._peak: tuple[Any, pr.SpanPeak | None] | None = None  # span_peak memo
        # What readers derive from the line per span (the moment's explanations), kept
        # with it: it goes with its session, never outlives it in a module's cache.
        self.memo: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._lock = threading.RLock()

    @property
    def prediction(self) -> pr.Prediction | None:
        """The latest model's prediction (what the process runs now)."""
        return self.epochs[-1].prediction if self.epochs else None

    @property
    def first_step(self) -> int | None:
        """The step of the latest model's first ``optimizer.step``, once found."""
        return self.epochs[-1].first_step if self.epochs else None

    @property
    def first_t(self) -> int | None:
        """When the latest model's first ``optimizer.step`` ended, once found."""
        return self.epochs[-1].first_t if self.epochs else None

    def epoch_at(self, t: int) -> Epoch | None:
        """The model in force at ``t`` (None before :meth:`update` found facts)."""
        epochs = self.epochs
        return epochs[epoch_index(epochs, t)] if epochs else None

    def prediction_at(self, t: int) -> pr.Prediction | None:
        """The prediction of the model in force at ``t``."""
        epoch = self.epoch_at(t)
        return epoch.prediction if epoch is not None else None

    @_locked
    def update(self) -> bool:
        """Predict anew the models whose facts changed; False while none can be predicted."""
        proc = self.proc
        if not proc.facts:
            return False
        if proc.facts_log is not self._source[0] or proc.facts is not self._source[1]:
            self._source = (proc.facts_log, proc.facts)
            self.epochs = epochs_of(proc, self.epochs)
            self._version += 1
            for epoch in self.epochs:
                if epoch.prediction is None and epoch.facts and epoch.checked >= 0:
                    self._predict(epoch)
        usable = False
        for epoch in self.epochs:
            if epoch.prediction is not None:
                usable = True
                if epoch.first_step is None:
                    epoch.find_first_step(self.session, proc)
                    if epoch.first_step is not None:
                        self._version += 1
        return usable

    def _predict(self, epoch: Epoch) -> None:
        try:
            # The script's word, unchecked: the predictor checks each field it reads.
            prediction = pr.predict(cast(Facts, epoch.facts))
            for phase, first in prediction.phases:  # every figure computes
                pr.total(pr.breakdown(prediction, phase, first_step=first))
        except Exception as exc:
            self._unusable(epoch, exc)
            return
        epoch.prediction = prediction

    def _unusable(self, epoch: Epoch, exc: BaseException) -> None:
        """Facts the predictor cannot use: no predicted line, a note, never a crash.

        Facts are the script's word (a datagram, or a recording someone shared): whatever
        they hold must not stop the dashboard or the exporter.
        """
        epoch.prediction = None
        epoch.checked = -1  # not predicted again until its facts change
        self._version += 1
        self.session.note(
            f"{self.proc.label}: its model facts cannot be used for a prediction "
            f"({type(exc).__name__}: {str(exc)[:80]})"
        )

    # ------------------------------------------------------------------ curve

    def _span_list(self, cols: dict[str, np.ndarray], with_open: bool) -> list[pr.Span]:
        spans = pr.spans_from_columns(cols, self.session.names)
        if with_open:
            now = self.session.now()
            spans += [
                pr.Span(o.name, o.t0, max(o.t0, now), o.step, o.depth)
                for o in list(self.proc.open.values())
            ]
        return spans

    def _curve(self, spans: list[pr.Span]) -> tuple[np.ndarray, np.ndarray]:
        times: list[int] = []
        values: list[int] = []
        for epoch, group in split_spans(self.epochs, spans):
            if epoch.prediction is None:
                continue
            try:
                t, v = pr.predicted_curve(epoch.prediction, group, first_step=epoch.first_step)
            except Exception as exc:
                self._unusable(epoch, exc)
                continue
            if times and t:  # the earlier model's level holds until the next one's span
                times.append(t[0])
                values.append(values[-1])
            times += t
            values += v
        out = np.asarray(times, dtype=np.int64)
        if len(self.epochs) > 1 and len(out) and (np.diff(out) < 0).any():
            # A span of one model that outlasted the next one's start: a vertical step.
            out = np.maximum.accumulate(out)
        return out, np.asarray(values, dtype=np.float64)

    @_locked
    def points(self, t0: int, t1: int, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Curve points covering ``[t0, t1]``.

        Args:
            t0: Window start.
            t1: Window end.
            width: Columns the window is drawn in; when the window holds more than
                :data:`MAX_SPANS` spans, only one step per column is predicted.
        """
        cols = self.proc.spans(t0, t1)
        n = len(cols["t0"])
        if width is not None and n > MAX_SPANS:
            cols = _representative_steps(cols, t0, t1, width)
        t, v = self._curve(self._span_list(cols, with_open=True))
        if len(t):
            now = self.session.now()
            if now > t[-1] and t1 >= t[-1]:  # between phases the prediction holds its level
                t = np.append(t, now)
                v = np.append(v, v[-1])
        return t, v

    @_locked
    def window(self, t0: int, t1: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """Per-column (low, high) of the piecewise-linear curve over ``[t0, t1]``."""
        lo = np.full(width, np.nan)
        hi = np.full(width, np.nan)
        if width <= 0 or t1 <= t0:
            return lo, hi
        table = self.proc.phases
        inside = table.search(t1 + self.proc.max_span, "right") - table.search(t0, "left")
        if inside > SAMPLED_SPANS and any(e.prediction is not None for e in self.epochs):
            return self._sampled(t0, t1, width)
        t, v = self.points(t0, t1, width)
        if len(t) == 0:
            return lo, hi
        edges = column_edges(t0, t1, width)
        inside = (edges >= t[0]) & (edges <= t[-1])
        at_edge = np.where(inside, np.interp(edges, t, v), np.nan)
        # Each column spans its two edge values and every vertex that falls inside it.
        lo = np.fmin(at_edge[:-1], at_edge[1:])
        hi = np.fmax(at_edge[:-1], at_edge[1:])
        idx = np.searchsorted(t, edges, "left")
        idx[-1] = np.searchsorted(t, t1, "right")
        nonempty = idx[1:] > idx[:-1]
        if nonempty.any():
            starts = idx[:-1][nonempty]
            # reduceat's last group runs to the end: cut `v` at the window's last vertex.
            inner = v[: idx[-1]]
            lo[nonempty] = np.fmin(lo[nonempty], np.minimum.reduceat(inner, starts))
            hi[nonempty] = np.fmax(hi[nonempty], np.maximum.reduceat(inner, starts))
        return lo, hi

    def _sampled(self, t0: int, t1: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`window` of a long stretch from :data:`SAMPLED_STEPS` steps of each model
        over it: a column shows a step of the model it ran, the first step its own."""
        lo = np.full(width, np.nan)
        hi = np.full(width, np.nan)
        ran = np.flatnonzero(self.proc.phase_cover(t0, t1, width))
        if not len(ran):
            return lo, hi
        edges = column_edges(t0, t1, width)
        mids = edges[:-1] + (edges[1:] - edges[:-1]) // 2
        if len(self.epochs) > 1:
            starts = np.array([e.start for e in self.epochs[1:]], dtype=np.int64)
            of_column = np.searchsorted(starts, mids, "right")
        else:
            of_column = np.zeros(width, dtype=np.int64)
        for k, epoch in enumerate(self.epochs):
            mine = ran[of_column[ran] == k]
            if len(mine):
                self._sampled_part(epoch, mine, t0, t1, width, edges, lo, hi)
        return lo, hi

    def _sampled_part(
        self,
        epoch: Epoch,
        ran: np.ndarray,
        t0: int,
        t1: int,
        width: int,
        edges: np.ndarray,
        lo: np.ndarray,
        hi: np.ndarray,
    ) -> None:
        """Fill ``lo`` / ``hi`` at the columns ``ran`` of one model's time."""
        picks = np.unique(
            ran[np.linspace(0, len(ran) - 1, min(SAMPLED_STEPS, len(ran))).round().astype(int)]
        )
        first = None
        if epoch.first_t is not None and t0 <= epoch.first_t <= t1:
            first = min(width - 1, int((epoch.first_t - t0) * width / (t1 - t0)))
        ranges: dict[int, tuple[float, float]] = {}
        for c in sorted({*picks.tolist(), *([first] if first is not None else [])}):
            found = self._step_range((int(edges[c]) + int(edges[c + 1])) // 2)
            if found is not None:
                ranges[c] = found
        later = np.array(sorted(c for c in ranges if c != first), dtype=np.int64)
        for c in ran.tolist():
            if c == first and c in ranges:
                lo[c], hi[c] = ranges[c]
            elif len(later):
                j = int(np.searchsorted(later, c))
                near = [later[k] for k in (j - 1, j) if 0 <= k < len(later)]
                lo[c], hi[c] = ranges[int(min(near, key=lambda x: abs(int(x) - c)))]

    def _step_range(self, t: int) -> tuple[float, float] | None:
        """Lowest and highest predicted bytes of the step running at (or next after) ``t``."""
        table = self.proc.phases
        i = table.search(t, "left")  # the first span ending at or after t
        i = min(i, len(table) - 1)
        if i < table.first:
            return None
        near = table.rows(max(table.first, i - 256), i + 256, SPAN_COLUMNS)
        if not len(near["step"]):
            return None
        j = min(i - max(table.first, i - 256), len(near["step"]) - 1)
        step = int(near["step"][j])
        if step == MISSING_INT:
            return None
        keep = near["step"] == step
        if len(self.epochs) > 1:  # the same step number under another model is not it
            keep &= self._in_epoch(near["t0"], int(near["t0"][j]))
        cols = {k: c[keep] for k, c in near.items()}
        _, v = self._curve(self._span_list(cols, with_open=False))
        if not len(v):
            return None
        return float(v.min()), float(v.max())

    def _in_epoch(self, t0: np.ndarray, t: int) -> np.ndarray:
        """Which of the starts ``t0`` lie in the time of the model in force at ``t``."""
        epoch = self.epochs[epoch_index(self.epochs, t)]
        keep = t0 >= epoch.start
        return keep if epoch.end is None else keep & (t0 < epoch.end)

    def _around(self, t: int) -> list[pr.Span]:
        """The spans of the few steps before ``t`` (enough to place ``t`` on the curve),
        of the model in force at ``t``."""
        cols = self.proc.spans(t - 120 * 10**9, t)
        cols = {k: c[-60:] for k, c in cols.items()}
        if len(self.epochs) > 1:
            keep = self._in_epoch(cols["t0"], t)
            cols = {k: c[keep] for k, c in cols.items()}
        spans = self._span_list(cols, with_open=True)
        return [s for s in spans if s.t0 <= t]

    @_locked
    def value_at(self, t: int) -> float | None:
        """The predicted allocated bytes at ``t`` (None before the first phase)."""
        parts = self.breakdown_at(t)
        return None if parts is None else float(sum(parts.values()))

    @_locked
    def breakdown_at(self, t: int) -> dict[str, int] | None:
        """Predicted bytes by category at ``t``, from the spans around it, by the model in
        force at ``t`` (None before that model's first phase).

        The legend and the breakdown bar both ask for the cursor's time on every frame;
        the last answer is kept until the time or the phases change.
        """
        stamp = (t, len(self.proc.phases), len(self.proc.open), self._version)
        if self._last is not None and self._last[0] == stamp:
            return self._last[1]
        epoch = self.epoch_at(t)
        parts = None
        if epoch is not None and epoch.prediction is not None:
            spans = self._around(t)
            if spans:
                try:
                    parts = pr.breakdown_at(epoch.prediction, spans, t, first_step=epoch.first_step)
                except Exception as exc:
                    self._unusable(epoch, exc)
        self._last = (stamp, parts)
        return parts

    @_locked
    def span_peaks(self, t0: int, t1: int) -> dict[tuple[str, int, int], pr.SpanPeak]:
        """Predicted peaks of the ended spans inside ``[t0, t1]``, by (name, t0, t1), each
        from the model in force when it began.

        The walk starts two minutes earlier, so that whether a span carries earlier
        micro-batches' gradients (accumulation) is known at its start.
        """
        cols = self.proc.spans(t0 - 120 * 10**9, t1)
        spans = pr.spans_from_columns(cols, self.session.names)
        out = {}
        for epoch, group in split_spans(self.epochs, spans):
            if epoch.prediction is None:
                continue
            try:
                peaks = pr.span_peaks(epoch.prediction, group, first_step=epoch.first_step)
            except Exception as exc:
                self._unusable(epoch, exc)
                continue
            out.update({(p.span.name, p.span.t0, p.span.t1): p for p in peaks if p.span.t0 >= t0})
        _containers(out, [sp for sp in spans if sp.t0 >= t0])
        return out

    @_locked
    def span_peak(self, name: str, t0: int, t1: int) -> pr.SpanPeak | None:
        """The predicted peak of the ended span ``(name, t0, t1)``, or None.

        Asked for on every frame while the cursor is in the span: a walk over two minutes
        of spans, kept until the span, the predictions or the first steps change.
        """
        key = (name, t0, t1, self._version)
        if self._peak is None or self._peak[0] != key:
            self._peak = (key, self.span_peaks(t0, t1).get((name, t0, t1)))
        return self._peak[1]


def _containers(out: dict[tuple[str, int, int], pr.SpanPeak], spans: list[pr.Span]) -> None:
    """Give each span the predictor does not model (a notebook cell, a script's own outer
    phase) the predicted peak of the highest modelled span inside it: its peak is the
    highest point of the curve within it, explained as that inner phase is."""
    known = sorted(out.values(), key=lambda p: p.span.t0)
    if not known:
        return
    starts = [p.span.t0 for p in known]
    for sp in spans:
        key = (sp.name, sp.t0, sp.t1)
        if key in out:
            continue
        best: pr.SpanPeak | None = None
        for p in known[bisect.bisect_left(starts, sp.t0) : bisect.bisect_right(starts, sp.t1)]:
            inside = p.span.t1 <= sp.t1 and p.span.depth > sp.depth
            if inside and (best is None or pr.total(p.peak) > pr.total(best.peak)):
                best = p
        if best is not None:
            out[key] = best


def _representative_steps(
    cols: dict[str, np.ndarray], t0: int, t1: int, width: int
) -> dict[str, np.ndarray]:
    """The spans of one step per column: the step running at each column's middle."""
    mids = t0 + (np.arange(width) + 0.5) * ((t1 - t0) / width)
    order = np.argsort(cols["t0"], kind="stable")
    starts = cols["t0"][order]
    at = np.clip(np.searchsorted(starts, mids, "right") - 1, 0, len(starts) - 1)
    steps = np.unique(cols["step"][order][at])
    keep = np.isin(cols["step"], steps)
    return {k: c[keep] for k, c in cols.items()}


class Predictions(Mapping[int, PredictedLine]):
    """One predicted line per process of a session, made once and shared.

    The dashboard (chart, legend, breakdown bar, Peaks tab) and the Prometheus exporter
    read the same lines, so each prediction is computed once. As a mapping it holds the
    lines of processes that sent facts, by pid; :meth:`update` makes new ones and predicts
    anew where facts changed. Get it with :func:`predictions`.
    """

    def __init__(self, session: Session) -> None:
        self.session = session
        self._lines: dict[int, PredictedLine] = {}
        self._lock = threading.Lock()

    def line(self, proc: Process) -> PredictedLine | None:
        """The process's line, up to date with its facts; None while it has sent none."""
        if not proc.facts:
            return self._lines.get(proc.pid)
        with self._lock:
            line = self._lines.get(proc.pid)
            if line is None:
                line = self._lines[proc.pid] = PredictedLine(self.session, proc)
        line.update()
        return line

    def update(self) -> None:
        """Every process's line up to date (a line for each process that sent facts)."""
        for proc in list(self.session.processes.values()):
            self.line(proc)

    def __getitem__(self, pid: int) -> PredictedLine:
        return self._lines[pid]

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._lines))

    def __len__(self) -> int:
        return len(self._lines)


_registries: weakref.WeakKeyDictionary[Session, Predictions] = weakref.WeakKeyDictionary()
# Not the session's lock: a scrape must never wait for an ingest.
_made_lock = threading.Lock()


def predictions(session: Session) -> Predictions:
    """The predicted line of each process of ``session``, shared by every view (made on
    first use, kept while the session lives)."""
    registry = _registries.get(session)
    if registry is None:
        with _made_lock:
            registry = _registries.get(session)
            if registry is None:
                registry = _registries[session] = Predictions(session)
    return registry
