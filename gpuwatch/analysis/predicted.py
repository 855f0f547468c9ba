"""The predicted line of each process, from its facts and its phases, for a window.

:mod:`gpuwatch.predict` turns facts and phase spans into a piecewise-linear curve (pure
Python). Only the spans a window shows are turned into a curve; when a window holds more
spans than its columns can show (hours of steps), each column is drawn from one whole
step at its middle, since every step of a run repeats the same predicted shape. Nothing
is stored in recordings: a replay predicts anew from the facts it recorded.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
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
    session: Session, proc: Process, start: int = 0
) -> tuple[tuple[int, int] | None, int]:
    """``((step, t1), rows looked at)`` of the process's first ``optimizer.step`` at or
    after row ``start`` (None when none is there, or its step is unknown).

    Reads the phases from ``start`` on, in pieces, and stops at the first one found.
    """
    opt = session.find_name("optimizer.step")
    table = proc.phases
    if opt is None:
        return None, 0  # its name is not known yet: look again from the start
    checked = max(start, table.first)
    for cols in table.batches(checked, None, ("t1", "name", "step")):
        hits = np.flatnonzero(cols["name"] == opt)
        checked += len(cols["name"])
        if len(hits):
            i = hits[0]
            if cols["step"][i] == MISSING_INT:
                return None, checked
            return (int(cols["step"][i]), int(cols["t1"][i])), checked
    return None, checked


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

    Args:
        session: The session the process belongs to.
        proc: The process.
    """

    def __init__(self, session: Session, proc: Process) -> None:
        self.session = session
        self.proc = proc
        self.prediction: pr.Prediction | None = None
        self._facts: Any = None
        self.first_step: int | None = None
        self.first_t: int | None = None  # when that optimizer.step ended
        self._checked = 0  # phase rows searched for the first optimizer.step
        self._last: tuple[Any, dict[str, int] | None] | None = None  # breakdown_at memo
        self._peak: tuple[Any, pr.SpanPeak | None] | None = None  # span_peak memo
        # What readers derive from the line per span (the moment's explanations), kept
        # with it: it goes with its session, never outlives it in a module's cache.
        self.memo: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._lock = threading.RLock()

    @_locked
    def update(self) -> bool:
        """Predict anew when the facts changed; False while the process has sent none."""
        facts = self.proc.facts
        if not facts:
            return False
        if facts is not self._facts:
            self._facts = facts
            self.first_step, self._checked = None, 0
            try:
                # The script's word, unchecked: the predictor checks each field it reads.
                self.prediction = pr.predict(cast(Facts, facts))
                for phase, first in self.prediction.phases:  # every figure computes
                    pr.total(pr.breakdown(self.prediction, phase, first_step=first))
            except Exception as exc:
                self._unusable(exc)
                return False
        if self.prediction is None:
            return False
        if self.first_step is None:
            self._find_first_step()
        return True

    def _unusable(self, exc: BaseException) -> None:
        """Facts the predictor cannot use: no predicted line, a note, never a crash.

        Facts are the script's word (a datagram, or a recording someone shared): whatever
        they hold must not stop the dashboard or the exporter.
        """
        self.prediction = None
        self.session.note(
            f"{self.proc.label}: its model facts cannot be used for a prediction "
            f"({type(exc).__name__}: {str(exc)[:80]})"
        )

    def _find_first_step(self) -> None:
        """The step of the process's first ``optimizer.step`` (the first step is higher)."""
        found, self._checked = first_optimizer_step(self.session, self.proc, self._checked)
        if found is not None:
            self.first_step, self.first_t = found

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
        if self.prediction is None or not spans:
            return np.empty(0, dtype=np.int64), np.empty(0)
        try:
            times, values = pr.predicted_curve(self.prediction, spans, first_step=self.first_step)
            return np.asarray(times, dtype=np.int64), np.asarray(values, dtype=np.float64)
        except Exception as exc:
            self._unusable(exc)
            return np.empty(0, dtype=np.int64), np.empty(0)

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
        if inside > SAMPLED_SPANS and self.prediction is not None:
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
        """:meth:`window` of a long stretch from :data:`SAMPLED_STEPS` steps over it."""
        lo = np.full(width, np.nan)
        hi = np.full(width, np.nan)
        ran = np.flatnonzero(self.proc.phase_cover(t0, t1, width))
        if not len(ran):
            return lo, hi
        edges = column_edges(t0, t1, width)
        picks = np.unique(
            ran[np.linspace(0, len(ran) - 1, min(SAMPLED_STEPS, len(ran))).round().astype(int)]
        )
        first = None
        if self.first_t is not None and t0 <= self.first_t <= t1:
            first = min(width - 1, int((self.first_t - t0) * width / (t1 - t0)))
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
        return lo, hi

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
        cols = {k: c[keep] for k, c in near.items()}
        _, v = self._curve(self._span_list(cols, with_open=False))
        if not len(v):
            return None
        return float(v.min()), float(v.max())

    def _around(self, t: int) -> list[pr.Span]:
        """The spans of the few steps before ``t`` (enough to place ``t`` on the curve)."""
        cols = self.proc.spans(t - 120 * 10**9, t)
        cols = {k: c[-60:] for k, c in cols.items()}
        spans = self._span_list(cols, with_open=True)
        return [s for s in spans if s.t0 <= t]

    @_locked
    def value_at(self, t: int) -> float | None:
        """The predicted allocated bytes at ``t`` (None before the first phase)."""
        parts = self.breakdown_at(t)
        return None if parts is None else float(sum(parts.values()))

    @_locked
    def breakdown_at(self, t: int) -> dict[str, int] | None:
        """Predicted bytes by category at ``t``, from the spans around it.

        The legend and the breakdown bar both ask for the cursor's time on every frame;
        the last answer is kept until the time or the phases change.
        """
        stamp = (t, len(self.proc.phases), len(self.proc.open), self.prediction)
        if self._last is not None and self._last[0] == stamp:
            return self._last[1]
        spans = self._around(t)
        parts = None
        if self.prediction is not None and spans:
            try:
                parts = pr.breakdown_at(self.prediction, spans, t, first_step=self.first_step)
            except Exception as exc:
                self._unusable(exc)
        self._last = (stamp, parts)
        return parts

    @_locked
    def span_peaks(self, t0: int, t1: int) -> dict[tuple[str, int, int], pr.SpanPeak]:
        """Predicted peaks of the ended spans inside ``[t0, t1]``, by (name, t0, t1).

        The walk starts two minutes earlier, so that whether a span carries earlier
        micro-batches' gradients (accumulation) is known at its start.
        """
        if self.prediction is None:
            return {}
        cols = self.proc.spans(t0 - 120 * 10**9, t1)
        spans = pr.spans_from_columns(cols, self.session.names)
        try:
            peaks = pr.span_peaks(self.prediction, spans, first_step=self.first_step)
        except Exception as exc:
            self._unusable(exc)
            return {}
        return {(p.span.name, p.span.t0, p.span.t1): p for p in peaks if p.span.t0 >= t0}

    @_locked
    def span_peak(self, name: str, t0: int, t1: int) -> pr.SpanPeak | None:
        """The predicted peak of the ended span ``(name, t0, t1)``, or None.

        Asked for on every frame while the cursor is in the span: a walk over two minutes
        of spans, kept until the span, the prediction or the first step change.
        """
        key = (name, t0, t1, self.prediction, self.first_step)
        if self._peak is None or self._peak[0] != key:
            self._peak = (key, self.span_peaks(t0, t1).get((name, t0, t1)))
        return self._peak[1]


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
