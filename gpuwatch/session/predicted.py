"""The predicted line of each process, from its facts and its phases, cached per step.

:mod:`gpuwatch.predict` turns facts and phase spans into a piecewise-linear curve. Here the
curve of every completed step is computed once and kept as numpy arrays, so drawing a day
of steps costs a range lookup, not a re-prediction; only the running step is recomputed.
Nothing is stored in recordings: a replay predicts anew from the facts it recorded.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import predict as pr
from .decimate import column_edges
from .session import Process, Session
from .table import MISSING_INT


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
        self._times: list[np.ndarray] = []
        self._values: list[np.ndarray] = []
        self._done = 0  # phase rows already turned into cached curve chunks
        self.first_step: int | None = None

    # ------------------------------------------------------------------ updating

    def update(self) -> bool:
        """Bring the cache up to date; False when the process has sent no facts."""
        facts = self.proc.facts
        if not facts:
            return False
        if facts is not self._facts:
            self._facts = facts
            self.prediction = pr.predict(facts)
            self._times, self._values, self._done = [], [], 0
            self.first_step = None
        cols = self.proc.phases.snapshot()
        n = len(cols["t0"])
        if self.first_step is None:
            self.first_step = self._find_first_step(cols)
        if n == self._done:
            return True
        steps = cols["step"][self._done : n]
        newest = int(steps.max())
        # Rows of steps before the newest are complete: cache them in one chunk.
        complete = np.flatnonzero((steps < newest) & (steps != MISSING_INT))
        if len(complete):
            end = self._done + int(complete[-1]) + 1
            self._append(self._spans(cols, self._done, end))
            self._done = end
        return True

    def _find_first_step(self, cols: dict[str, np.ndarray]) -> int | None:
        opt = self.session._name_ids.get("optimizer.step")
        if opt is None:
            return None
        hits = np.flatnonzero(cols["name"] == opt)
        if not len(hits):
            return None
        step = int(cols["step"][hits[0]])
        return None if step == MISSING_INT else step

    def _spans(self, cols: dict[str, np.ndarray], i0: int, i1: int) -> list[pr.Span]:
        part = {k: v[i0:i1] for k, v in cols.items()}
        return pr.spans_from_columns(part, self.session.names)

    def _curve(self, spans: list[pr.Span]) -> tuple[np.ndarray, np.ndarray]:
        assert self.prediction is not None
        times, values = pr.predicted_curve(self.prediction, spans, first_step=self.first_step)
        return np.asarray(times, dtype=np.int64), np.asarray(values, dtype=np.float64)

    def _append(self, spans: list[pr.Span]) -> None:
        t, v = self._curve(spans)
        if not len(t):
            return
        if self._times:
            # Hold the previous chunk's last level up to this chunk's first point.
            t = np.concatenate(([t[0]], t))
            v = np.concatenate(([self._values[-1][-1]], v))
        self._times.append(t)
        self._values.append(v)

    # ------------------------------------------------------------------ reading

    def _cached(self) -> tuple[np.ndarray, np.ndarray]:
        """The completed steps' curve as one pair of arrays (chunks merged once)."""
        if len(self._times) > 1:
            self._times = [np.concatenate(self._times)]
            self._values = [np.concatenate(self._values)]
        if not self._times:
            return np.empty(0, dtype=np.int64), np.empty(0)
        return self._times[0], self._values[0]

    def _running(self, held: float | None) -> tuple[np.ndarray, np.ndarray]:
        """The running step's curve (its spans are still arriving), joined to ``held``."""
        cols = self.proc.phases.snapshot()
        tail = self._spans(cols, self._done, len(cols["t0"]))
        tail += [
            pr.Span(o.name, o.t0, max(o.t0, self.session.now()), o.step, o.depth)
            for o in list(self.proc.open.values())
        ]
        if not tail or self.prediction is None:
            return np.empty(0, dtype=np.int64), np.empty(0)
        tt, tv = self._curve(tail)
        if len(tt) and held is not None:
            tt = np.concatenate(([tt[0]], tt))
            tv = np.concatenate(([held], tv))
        return tt, tv

    def points(self, t0: int, t1: int) -> tuple[np.ndarray, np.ndarray]:
        """Curve points covering ``[t0, t1]`` (one point either side when there is one)."""
        ct, cv = self._cached()
        # Only the window's part of the cached curve is copied, never the whole day.
        i0 = max(0, int(np.searchsorted(ct, t0, "left")) - 1)
        i1 = min(len(ct), int(np.searchsorted(ct, t1, "right")) + 1)
        parts_t, parts_v = [ct[i0:i1]], [cv[i0:i1]]
        if i1 == len(ct):  # the window reaches the running step
            rt, rv = self._running(float(cv[-1]) if len(cv) else None)
            parts_t.append(rt)
            parts_v.append(rv)
        t = np.concatenate(parts_t)
        v = np.concatenate(parts_v)
        if not len(t):
            return t, v
        now = self.session.now()
        if now > t[-1] and t1 >= t[-1]:  # between phases the prediction holds its level
            t = np.append(t, now)
            v = np.append(v, v[-1])
        return t, v

    def window(self, t0: int, t1: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """Per-column (low, high) of the piecewise-linear curve over ``[t0, t1]``."""
        lo = np.full(width, np.nan)
        hi = np.full(width, np.nan)
        t, v = self.points(t0, t1)
        if len(t) == 0 or width <= 0 or t1 <= t0:
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

    def value_at(self, t: int) -> float | None:
        """The predicted allocated bytes at ``t`` (None outside the curve)."""
        pts, vals = self.points(t, t)
        if len(pts) == 0 or t < pts[0] or t > pts[-1]:
            return None
        return float(np.interp(t, pts, vals))

    def breakdown_at(self, t: int) -> dict[str, int] | None:
        """Predicted bytes by category at ``t``, from the spans around it."""
        if self.prediction is None:
            return None
        cols = self.session.spans(self.proc, t - 120 * 10**9, t)
        cols = {k: v[-60:] for k, v in cols.items()}  # the few steps before t are enough
        spans = pr.spans_from_columns(cols, self.session.names)
        spans += [
            pr.Span(o.name, o.t0, max(o.t0, self.session.now()), o.step, o.depth)
            for o in list(self.proc.open.values())
            if o.t0 <= t
        ]
        if not spans:
            return None
        return pr.breakdown_at(self.prediction, spans, t, first_step=self.first_step)

    def phase_peak(self, phase: str, step: int | None) -> int | None:
        """The predicted peak of ``phase`` in ``step`` (the first step is higher)."""
        if self.prediction is None:
            return None
        first = step is not None and self.first_step is not None and step <= self.first_step
        key = (phase, first)
        if key not in self.prediction.phases:
            return None
        return pr.total(pr.breakdown(self.prediction, phase, first_step=first))
