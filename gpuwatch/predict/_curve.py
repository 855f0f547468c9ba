"""The predicted line on the timeline: predicted allocated bytes through a process's phases.

The curve is piecewise linear between points placed inside each known phase span:
forward ramps up to its peak at the loss, backward spikes where the simulation puts its
peak and ramps down to the gradients, optimizer.step makes the first step's state at its
start and its temporaries in its middle, zero_grad drops the gradients. Between spans the
level holds. Whether a step is the first is decided by the optimizer state: the first
``optimizer.step`` span (or the one whose ``step`` is ``first_step``) creates it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._graph import CATEGORIES, GRADIENTS
from ._predict import Breakdown, PhaseMemory, Prediction, total


@dataclass(frozen=True)
class Span:
    """One phase span of a process (the columns the session keeps, PHASE_COLUMNS).

    Attributes:
        name: Phase name (``forward``, ``backward``, ``optimizer.step``, ...).
        t0, t1: Start and end (``time.monotonic_ns()``).
        step: Training step, or None.
        depth: Nesting depth (0 = outermost).
    """

    name: str
    t0: int
    t1: int
    step: int | None = None
    depth: int = 0


MISSING = -(2**63)
"""The session's missing-integer marker (``gpuwatch.session.table.MISSING_INT``)."""


def spans_from_columns(cols: Mapping[str, Iterable[Any]], names: Sequence[str]) -> list[Span]:
    """Spans from :meth:`Session.spans` columns and :attr:`Session.names`."""
    # Whole columns to Python ints at once: an element at a time from numpy arrays cost
    # most of a redraw's predicted line (750 spans a 5-minute window).
    name, t0, t1, step, depth = (_as_list(cols[c]) for c in ("name", "t0", "t1", "step", "depth"))
    return [
        Span(names[n], a, b, None if st == MISSING else st, d)
        for n, a, b, st, d in zip(name, t0, t1, step, depth, strict=True)
    ]


def _as_list(col: Iterable[Any]) -> list[Any]:
    tolist = getattr(col, "tolist", None)  # numpy arrays, without importing numpy here
    return tolist() if tolist is not None else list(col)


def _known(spans: Iterable[Span], phases: dict[tuple[str, bool], PhaseMemory]) -> list[Span]:
    """Known phases, outermost first; a known span inside another known one is skipped
    (a forward inside eval is eval's)."""
    names = {name for name, _ in phases}
    chosen: list[Span] = []
    for sp in sorted(spans, key=lambda s: (s.t0, s.depth)):
        if sp.name not in names or sp.t1 < sp.t0:
            continue
        if chosen and sp.t0 >= chosen[-1].t0 and sp.t1 <= chosen[-1].t1:
            continue
        chosen.append(sp)
    return chosen


def _plus_grads(b: Breakdown, grads: int) -> Breakdown:
    return dict(b, **{GRADIENTS: max(b.get(GRADIENTS, 0), grads)})


def _mix(a: Breakdown, b: Breakdown, f: float) -> Breakdown:
    return {c: round(a.get(c, 0) + (b.get(c, 0) - a.get(c, 0)) * f) for c in CATEGORIES}


@dataclass(frozen=True)
class SpanPeak:
    """A known span and the predicted bytes by category at its peak.

    Attributes:
        span: The span.
        first_step: Whether it belongs to the first step (before optimizer state exists).
        peak: Bytes by category at its predicted peak (gradient accumulation and a
            zero_grad with nothing to free included).
    """

    span: Span
    first_step: bool
    peak: Breakdown


def _walk(
    prediction: Prediction, spans: Iterable[Span], first_step: int | None
) -> tuple[list[tuple[int, Breakdown]], list[SpanPeak]]:
    """The curve's points and each known span's peak, in one pass."""
    phases = prediction.phases
    grads_total = phases["optimizer.step", False].start.get(GRADIENTS, 0)
    state = prediction.optimizer.present
    grads = False
    points: list[tuple[int, Breakdown]] = []
    peaks: list[SpanPeak] = []
    for sp in _known(spans, phases):
        if first_step is not None and sp.step is not None and sp.step > first_step:
            state = True
        first = not state
        pm = phases[sp.name, first]
        start, peak, end = pm.start, pm.peak, pm.end
        if sp.name == "zero_grad":
            # It frees the gradients there are: none before the first backward (HF's
            # Trainer zeroes them before its first step), all of them after a backward.
            level = points[-1][1] if points else phases["forward", first].start
            start = peak = dict(level)
            end = dict(level, **{GRADIENTS: 0})
        elif grads and sp.name in ("forward", "eval", "backward"):
            # Gradient accumulation: earlier gradients are still there.
            start, peak, end = (_plus_grads(b, grads_total) for b in (start, peak, end))
            if sp.name == "backward" and first in prediction.accumulating:
                peak = prediction.accumulating[first]
        peaks.append(SpanPeak(sp, first, peak))
        d = sp.t1 - sp.t0
        if points:
            points.append((sp.t0, points[-1][1]))  # hold the level up to this span
        points.append((sp.t0, start))
        if sp.name == "forward":
            points.append((sp.t0 + round(d * _at(prediction, "forward")), peak))
        elif sp.name == "backward":
            points.append((sp.t0 + round(d * _at(prediction, "backward")), peak))
            grads = True
        elif sp.name == "optimizer.step":
            if not state:
                made = dict(start, **{"optimizer_state": end.get("optimizer_state", 0)})
                points.append((sp.t0 + d // 10, made))
            points.append((sp.t0 + d // 2, peak))
            state = True
        elif sp.name == "eval":
            points.append((sp.t0 + d // 2, peak))
        elif sp.name == "zero_grad":
            grads = False
        points.append((sp.t1, end))
    return points, peaks


def curve_points(
    prediction: Prediction, spans: Iterable[Span], *, first_step: int | None = None
) -> list[tuple[int, Breakdown]]:
    """The curve as ``(time, breakdown)`` points, in time order (times may repeat: steps).

    Args:
        prediction: From :func:`predict`.
        spans: The process's phase spans (any order; unknown names are ignored).
        first_step: The step of the process's first ``optimizer.step``, when the spans do
            not reach back to it; None infers it from the spans.
    """
    return _walk(prediction, spans, first_step)[0]


def span_peaks(
    prediction: Prediction, spans: Iterable[Span], *, first_step: int | None = None
) -> list[SpanPeak]:
    """Each known span's predicted peak, in time order (outermost spans only, as drawn).

    The same walk as the curve, so what a span's peak means here is what the line shows:
    a forward of the second micro-batch of a step carries the first one's gradients.
    """
    return _walk(prediction, spans, first_step)[1]


def _at(prediction: Prediction, phase: str) -> float:
    where = prediction.peak_at.get(phase)
    return 0.5 if where is None else min(1.0, max(0.0, where))


def predicted_curve(
    prediction: Prediction, spans: Iterable[Span], *, first_step: int | None = None
) -> tuple[list[int], list[int]]:
    """Predicted allocated bytes at the curve's points: ``(times, values)``.

    Draw it by joining the points with straight lines; equal times make vertical steps.
    """
    pts = curve_points(prediction, spans, first_step=first_step)
    # Steps share their breakdowns (a phase's start, peak and end): sum each one once.
    totals: dict[int, int] = {}
    values = []
    for _, b in pts:
        v = totals.get(id(b))
        if v is None:
            v = totals[id(b)] = total(b)
        values.append(v)
    return [t for t, _ in pts], values


def breakdown_at(
    prediction: Prediction, spans: Iterable[Span], t: int, *, first_step: int | None = None
) -> Breakdown | None:
    """Predicted bytes by category at time ``t`` (None before the first known span)."""
    pts = curve_points(prediction, spans, first_step=first_step)
    if not pts or t < pts[0][0]:
        return None
    for (ta, a), (tb, b) in itertools.pairwise(pts):
        if ta <= t <= tb:
            if tb == ta:
                continue
            return _mix(a, b, (t - ta) / (tb - ta))
    return dict(pts[-1][1])
