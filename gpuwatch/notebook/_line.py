"""The line under a notebook cell: its peak and what the largest part of it was.

The figure is the cell's exact allocator peak on CUDA (the highest boundary peak inside
the cell); on the CPU, where torch has no allocator counters, the predicted peak of the
phases the cell ran, with the process's peak RSS. The category comes from the same
explanation object ``gpuwatch info``, the breakdown bar and the Peaks tab read
(:func:`gpuwatch.analysis.explain.explain_span`), for the phase inside the cell whose peak
is the cell's.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, cast

from .. import predict as pr
from ..analysis.explain import CATEGORY_KEYS, Explained, explain_span
from ..analysis.forecast import Capacity, make_forecast
from ..facts import Facts
from ..fmt import fmt_bytes, printable
from ._tap import Ended


@dataclass
class CellReport:
    """What one cell's line says.

    Attributes:
        cell: The cell's span.
        peak: The cell's peak: measured (CUDA) or predicted (CPU); None when unknown.
        measured: Whether ``peak`` is the allocator's exact figure.
        phase: The phase inside the cell the explanation is of (None: none ran).
        explained: That phase's explanation (None without facts or phases).
        rss_peak: The process's peak RSS at the cell's end (CPU runs), and whether the
            cell raised it.
        used: Memory in use on the device before and after the cell, as the driver counts
            it (``cudaMemGetInfo``: what nvidia-smi shows), on CUDA.
        notes: Further short remarks (no model facts, ...).
        curve: The predicted line inside the cell, (time, bytes) points (for its chart).
        ahead: After a cell that ran a backward, what the next ``optimizer.step`` will
            need against what the device can give (:func:`step_ahead`); a leading ``!``
            when it will not fit.
    """

    cell: Ended
    peak: int | None
    measured: bool
    phase: str | None = None
    explained: Explained | None = None
    rss_peak: tuple[int, bool] | None = None
    used: tuple[int, int] | None = None
    notes: list[str] = field(default_factory=list)
    curve: list[tuple[int, int]] = field(default_factory=list)
    ahead: str | None = None

    @property
    def largest(self) -> tuple[str, int] | None:
        """The largest predicted category of the explanation: (label, bytes)."""
        if self.explained is None:
            return None
        parts = [p for p in self.explained.parts if p.key in CATEGORY_KEYS and p.bytes > 0]
        if not parts:
            return None
        top = max(parts, key=lambda p: p.bytes)
        return top.label, top.bytes

    @property
    def unexplained(self) -> int | None:
        """Measured minus predicted at the peak (CUDA with facts), else None."""
        return self.explained.unexplained if self.explained is not None else None

    def pieces(self) -> list[str]:
        """The line's pieces, in order (joined by `` · ``)."""
        out = []
        what = "peak" if self.measured else "predicted peak"
        where = f" in {self.phase}" if self.phase else ""
        out.append(f"{what} {fmt_bytes(self.peak)}{where}" if self.peak is not None else "")
        largest = self.largest
        if largest is not None:
            out.append(f"largest: {largest[0]} {fmt_bytes(largest[1])}")
        un = self.unexplained
        if un is not None:
            word = "unexplained" if un >= 0 else "over-predicted"
            out.append(f"{word} {fmt_bytes(abs(un))}")
        if self.used is not None:
            before, after = self.used
            seen = ""
            if self.peak is not None and self.measured and self.peak > max(before, after):
                seen = " (neither reading saw the peak)"
            out.append(f"nvidia-smi used {fmt_bytes(before)} → {fmt_bytes(after)}{seen}")
        if self.rss_peak is not None:
            rss, raised = self.rss_peak
            out.append(f"host peak RSS {fmt_bytes(rss)}{' (this cell)' if raised else ''}")
        if self.cell.error:
            out.append(f"failed: {self.cell.error}")
        if self.ahead:
            out.append(self.ahead)
        out.extend(self.notes)
        return [p for p in out if p]

    def text(self) -> str:
        """``gpuwatch [3] peak 1.20 GiB in optimizer.step · largest: ... · ...``."""
        return f"gpuwatch {cell_label(self.cell.name)} " + " · ".join(self.pieces())

    def html(self) -> str:
        """The same line as a small HTML block (every figure escaped)."""
        body = " · ".join(html.escape(p) for p in self.pieces())
        return (
            '<div class="gpuwatch-cell" style="font-family:monospace;font-size:12px;'
            'color:#555;border-left:3px solid #76b900;padding-left:6px">'
            f"<b>gpuwatch</b> {html.escape(cell_label(self.cell.name))} {body}</div>"
        )


def cell_label(name: str) -> str:
    """``[3]`` of a cell's phase name ``[3] loss.backward()``."""
    head = name.split(" ", 1)[0]
    return printable(head) if head.startswith("[") else ""


class Predictor:
    """The model's prediction, made once per facts object (facts change rarely)."""

    def __init__(self) -> None:
        self._facts: Any = None
        self._prediction: pr.Prediction | None = None
        self.error: str | None = None

    def __call__(self, facts: Any) -> pr.Prediction | None:
        if not facts:
            return None
        if facts is not self._facts:
            self._facts = facts
            try:
                self._prediction = pr.predict(cast(Facts, facts))
                self.error = None
            except Exception as exc:
                self._prediction = None
                self.error = f"{type(exc).__name__}: {str(exc)[:80]}"
        return self._prediction


def spans_of(history: list[Ended]) -> list[pr.Span]:
    """The predictor's spans of ended spans."""
    return [pr.Span(s.name, s.t0, s.t1, s.step, s.depth) for s in history]


def report(
    cell: Ended,
    inside: list[Ended],
    spans: list[pr.Span],
    prediction: pr.Prediction | None,
    first_step: int | None,
) -> CellReport | None:
    """What the line under ``cell`` says; None when the cell used no torch memory.

    Args:
        cell: The cell's span.
        inside: The spans that ran inside it.
        spans: Every span kept up to the cell's end (:func:`spans_of`; the predictor walks
            them in order: gradients left by an earlier cell's backward are still there).
        prediction: The model's prediction, if its facts are known.
        first_step: The step of the process's first optimizer.step, if one ended.
    """
    measured = cell.peak_alloc is not None
    if not inside and not measured:
        return None  # a CPU cell that ran no phase: nothing to say
    out = CellReport(cell, cell.peak_alloc, measured)
    if prediction is None:
        if inside:
            out.notes.append("no model facts yet (gpuwatch.watch(model) or a training forward)")
        return out if measured or inside else None
    # The walk keeps the outermost known spans only; each is found again by its times.
    mine = {(s.name, s.t0, s.t1): s for s in inside}
    peaks = [
        (sp, mine[key])
        for sp in pr.span_peaks(prediction, spans, first_step=first_step)
        if (key := (sp.span.name, sp.span.t0, sp.span.t1)) in mine
    ]
    if not peaks:
        return out if measured else None
    if measured:
        sp, s = max(peaks, key=lambda m: -1 if m[1].peak_alloc is None else m[1].peak_alloc)
    else:
        sp, s = max(peaks, key=lambda m: pr.total(m[0].peak))
    out.phase = s.name
    out.explained = explain_span(prediction, sp, s.peak_alloc, s.peak_reserved)
    if not measured:
        out.peak = int(pr.total(sp.peak))
    return out


def step_ahead(
    inside: list[Ended],
    prediction: pr.Prediction | None,
    first_step: int | None,
    capacity: Capacity | None,
) -> str | None:
    """After a cell that ran a backward, what the step cell will need: ``next
    optimizer.step (first step) will need 40.0 MiB of 30.0 MiB this GPU can give (10.0 MiB
    short)``, ``!`` first when it will not fit; None after any other cell.

    Args:
        inside: The spans that ran inside the cell.
        prediction: The model's prediction, if its facts are known.
        first_step: The step of the process's first optimizer.step, if one ended.
        capacity: What the device can give (:func:`~gpuwatch.analysis.forecast.capacity_here`).
    """
    if prediction is None or not any(s.name == "backward" for s in inside):
        return None
    first = first_step is None
    fc = make_forecast(0, 0, prediction, capacity, phases=("optimizer.step",))
    step = fc.get("optimizer.step", first)
    if step is None:
        return None
    what = f"next {step.label if first else 'optimizer.step'}"
    if step.unknowns:
        return f"{what}: not forecast, it rests on {step.unknowns[0]}"
    text = f"{what} will need {fmt_bytes(step.peak)}"
    if capacity is None:
        return text
    text += f" of {fmt_bytes(capacity.usable)} {capacity.where} can give"
    if step.peak > capacity.usable:
        largest = ", ".join(f"{label} {fmt_bytes(n)}" for label, n in step.largest(2))
        return f"! {text} ({fmt_bytes(step.peak - capacity.usable)} short: {largest})"
    return text
