"""Every exact per-phase peak explained: predicted categories against what was measured.

The allocator's exact peak inside a phase (``peak_allocated``) is split into the
predictor's categories at that phase's predicted peak (weights, autocast copies,
gradients, optimizer state, activations, the step's named temporaries) plus what is left
unexplained (or, when the prediction is higher, over-predicted). Beyond the allocated
bytes, the allocator's cache (peak reserved - peak allocated) and the CUDA context and
non-torch memory (NVML's highest "used" in the phase - peak reserved) complete the figure
nvidia-smi shows. One line per phase answers "where did the 13 GB in optimizer.step go".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from .. import predict as pr
from ..facts import Facts
from ..fmt import GIB, fmt_bytes
from ..session import MISSING_INT, Process, Session, Table
from ..session.peaks import table_range_max
from .predicted import FIRST_START, Epoch, epochs_of, split_spans
from .rank_table import phase_key

CATEGORY_KEYS = pr.CATEGORIES
"""The predictor's categories, in the order an explanation lists them."""

_TEMP_LABELS = {
    "forward": "forward temporaries",
    "backward": "activation gradients",
    "clip": "gradient norms",
    "eval": "eval working set",
}


@dataclass
class Part:
    """One term of an explanation.

    Attributes:
        key: A category of :data:`CATEGORY_KEYS`, or ``unexplained`` / ``over_predicted``
            (of the allocated peak), ``cache`` or ``context`` (beyond it).
        label: What to call it (``"AdamW foreach temporary"``).
        bytes: Its size.
        source: Where the figure comes from: ``facts`` (the model's own tensors),
            ``formula`` / ``measured`` (activations), ``rules`` (temporaries),
            ``allocator`` or ``nvml``; empty for the residuals.
    """

    key: str
    label: str
    bytes: int
    source: str = ""


@dataclass
class Explained:
    """One phase (first step or later steps) of one process, measured and predicted.

    Attributes:
        phase: Phase name.
        first_step: The first step (before the optimizer state exists) or later ones.
        count: Spans of that phase in the group.
        measured: Highest exact peak allocated among them (None: not reported).
        predicted: Highest predicted peak among them.
        categories: Predicted bytes by category at the explained span's peak.
        parts: The explanation of the measured peak (categories, then the residual, then
            cache and context when known); the predicted categories alone when nothing
            was measured.
        step: The step of the explained span (the one with the highest measured peak).
        temporaries: What its model calls the phase's temporaries (empty: not known).
    """

    phase: str
    first_step: bool
    count: int
    measured: int | None
    predicted: int
    categories: dict[str, int]
    parts: list[Part] = field(default_factory=list)
    step: int | None = None
    temporaries: str = ""

    @property
    def unexplained(self) -> int | None:
        return None if self.measured is None else self.measured - self.predicted_at_peak

    @property
    def predicted_at_peak(self) -> int:
        return sum(self.categories.values())

    def line(self) -> str:
        """``optimizer.step peak 53.61 GiB = weights 10.73 + ... + unexplained 0.06``."""
        return explain_line(self)


@dataclass
class ProcessExplained:
    """A process's phases, explained, with what the prediction rests on."""

    pid: int
    label: str
    phases: dict[tuple[str, bool], Explained]
    activations_source: str | None
    findings: list[str]
    notes: list[str]
    temporaries_name: str


def _num(v: float) -> str:
    """A figure in the unit of the line (GiB, two decimals; MiB for small lines)."""
    return f"{v / GIB:.2f}"


def explain_line(e: Explained) -> str:
    """The one-line answer for one explained phase."""
    total = e.measured if e.measured is not None else e.predicted_at_peak
    what = "peak" if e.measured is not None else "predicted peak"
    head = f"{e.phase} {what} {fmt_bytes(total)}"
    show = fmt_bytes if total < GIB else _num
    # Parts too small to matter (the held 4-byte loss beside GiBs) are folded into one
    # term, which goes when it prints as nothing in the line's unit.
    small = min(_SMALL, 0.01 * total)
    inside = [p for p in e.parts if p.key not in _BEYOND]
    folded = sum(p.bytes for p in inside if 0 <= p.bytes < small)
    terms = [f"{p.label} {show(p.bytes)}" for p in inside if not 0 <= p.bytes < small]
    if folded and (total < GIB or folded >= 0.005 * GIB):
        terms.append(f"smaller items {show(folded)}")
    # Beyond the allocated peak, each figure in its own unit (as the Peaks tab and the
    # bar give them): the CUDA context is 751 MiB everywhere, never 0.73 here.
    beyond = [f"{p.label} {fmt_bytes(p.bytes)}" for p in e.parts if p.key in _BEYOND]
    line = head + (" = " + " + ".join(terms) if terms else "")
    if beyond:
        line += "; beyond it: " + ", ".join(beyond)
    return line


_BEYOND = ("cache", "context")

_SMALL = 2**20
"""Parts under this and under 1% of the line are folded into "smaller items"."""


def labels(prediction: pr.Prediction, phase: str) -> dict[str, tuple[str, str]]:
    """Category -> (label, source) for explanations of ``phase``."""
    act = prediction.activations_source or "unknown"
    opt = prediction.optimizer
    temp = opt.temp_name if phase == "optimizer.step" else _TEMP_LABELS.get(phase, "temporaries")
    return {
        "weights": ("weights", "facts"),
        "amp_copies": ("autocast weight copies", act),
        "gradients": ("gradients", "facts"),
        "optimizer_state": (opt.state_name if opt.kind != "none" else "optimizer state", "facts"),
        "activations": (f"activations ({act})" if act != "unknown" else "activations", act),
        "temporaries": (temp, "rules" if phase == "optimizer.step" else act),
        "blas_workspaces": ("cuBLAS workspaces", "facts"),
        # The parallel layout's buffers (gpuwatch/predict/_parallel.py).
        "ddp_buckets": ("DDP gradient buckets", "layout"),
        "fsdp_unsharded": ("FSDP all-gathered units", "layout"),
        "fsdp_reduce": ("FSDP unsharded gradients and reduce-scatter", "layout"),
        "zero_master": ("ZeRO fp32 master partition", "layout"),
        "zero_buckets": ("ZeRO contiguous gradient buckets", "layout"),
        "zero_gathered": ("ZeRO-3 gathered parameters", "layout"),
    }


def explain_breakdown(
    prediction: pr.Prediction,
    phase: str,
    categories: dict[str, int],
    measured: int | None,
    reserved: int | None = None,
    device_max: float | None = None,
) -> list[Part]:
    """The terms explaining a measured peak (allocated, then cache and context).

    Args:
        prediction: The process's prediction.
        phase: Phase name (names the temporaries).
        categories: Predicted bytes by category at the phase's peak.
        measured: The exact peak allocated, or None.
        reserved: The exact peak reserved in the same phase, or None.
        device_max: NVML's highest "used" reading in the phase, or None.
    """
    names = labels(prediction, phase)
    parts = [
        Part(k, names[k][0], int(categories.get(k, 0)), names[k][1])
        for k in CATEGORY_KEYS
        if categories.get(k, 0) > 0
    ]
    if measured is None:
        return parts
    rest = measured - sum(p.bytes for p in parts)
    if rest >= 0:
        parts.append(Part("unexplained", "unexplained", rest))
    else:
        parts.append(Part("over_predicted", "over-predicted", rest))
    if reserved is not None and reserved >= measured:
        parts.append(Part("cache", "allocator cache", reserved - measured, "allocator"))
        if device_max is not None and device_max >= reserved:
            parts.append(
                Part("context", "CUDA context and non-torch", int(device_max - reserved), "nvml")
            )
    return parts


def explain_span(
    prediction: pr.Prediction,
    span: pr.SpanPeak,
    measured: int | None,
    reserved: int | None = None,
    device_max: float | None = None,
) -> Explained:
    """One span's exact peak explained: the object every view of that phase reads.

    ``gpuwatch info``, the Peaks tab's row and, at a cursor inside the span, the
    breakdown bar and the legend all take their figures from it, so they cannot
    disagree.

    Args:
        prediction: The process's prediction.
        span: The span and its predicted bytes by category at its peak.
        measured: The span's exact peak allocated, or None.
        reserved: Its exact peak reserved, or None.
        device_max: NVML's highest "used" reading during it, or None.
    """
    name = span.span.name
    categories = {k: int(span.peak.get(k, 0)) for k in CATEGORY_KEYS}
    return Explained(
        phase=name,
        first_step=span.first_step,
        count=1,
        measured=measured,
        predicted=int(pr.total(span.peak)),
        categories=categories,
        parts=explain_breakdown(prediction, name, categories, measured, reserved, device_max),
        step=span.span.step,
        temporaries=labels(prediction, name)["temporaries"][0],
    )


def _opt(v: Any) -> int | None:
    v = int(v)
    return None if v == MISSING_INT else v


def predicted_epochs(session: Session, proc: Process) -> tuple[list[Epoch], list[str]]:
    """Each model of ``proc`` (:class:`~.predicted.Epoch`) predicted from its facts, with
    its first ``optimizer.step`` found, and a note for each whose facts cannot be used.

    Raises:
        Exception: No model's facts can be used (what the predictor raised for the first).
    """
    epochs = epochs_of(proc)
    notes: list[str] = []
    failed: Exception | None = None
    for i, epoch in enumerate(epochs):
        if not epoch.facts:
            continue  # forgotten: its phases are not explained
        try:
            # The script's word, unchecked: the predictor checks each field it reads.
            epoch.prediction = pr.predict(cast(Facts, epoch.facts))
        except Exception as exc:
            failed = failed or exc
            notes.append(f"model {i + 1}: its facts cannot be used ({type(exc).__name__})")
            continue
        epoch.find_first_step(session, proc)
    if not any(e.prediction is not None for e in epochs):
        raise failed or ValueError("no facts")
    return epochs, notes


def explain_process(
    session: Session, proc: Process, key: str | None = None
) -> ProcessExplained | None:
    """Each phase of ``proc`` (first step and later steps) predicted, measured, explained.

    Each span is predicted from the model in force when it began (a notebook that builds
    a new model keeps the earlier phases' own); spans of one name and step kind are one
    group, whatever model ran them, explained at its highest measured peak.

    A process with more than :data:`EXPLAIN_ROWS` phases is read in pieces: counts and
    measured peaks cover every phase, and the prediction is walked over the first steps
    and the two minutes before each phase's highest measured peak (later steps repeat the
    same prediction), so a run of days is explained in bounded memory.

    Args:
        session: The session.
        proc: An instrumented process that sent facts (None is returned otherwise).
        key: The GPU whose NVML readings give the context part (default: the process's
            first GPU).
    """
    if not proc.facts:
        return None
    epochs, failed = predicted_epochs(session, proc)
    table = proc.phases
    counts: Counter[tuple[str, bool]] | None = None
    if len(table) - table.first <= EXPLAIN_ROWS:
        cols = table.snapshot()
    else:
        cols, counts = _sampled(session, proc, epochs)
    spans = pr.spans_from_columns(cols, session.names)
    peaks: list[tuple[pr.SpanPeak, pr.Prediction]] = []
    for epoch, group in split_spans(epochs, spans):
        if epoch.prediction is not None:
            walked = pr.span_peaks(epoch.prediction, group, first_step=epoch.first_step)
            peaks += [(sp, epoch.prediction) for sp in walked]
    index = {(s.name, s.t0, s.t1): i for i, s in enumerate(spans)}
    if key is None:
        gpus = sorted(set(proc.devices.values()))
        key = gpus[0] if gpus else None
    nvml = session.gpu.get(key) if key in session.gpu else None
    groups: dict[tuple[str, bool], list[tuple[pr.SpanPeak, int, pr.Prediction]]] = {}
    for sp, prediction in peaks:
        i = index.get((sp.span.name, sp.span.t0, sp.span.t1))
        if i is not None:
            groups.setdefault((sp.span.name, sp.first_step), []).append((sp, i, prediction))
    out: dict[tuple[str, bool], Explained] = {}
    for (name, first), members in groups.items():
        measured = [(_opt(cols["peak_alloc"][m[1]]), m) for m in members]
        known = [(a, m) for a, m in measured if a is not None]
        if known:
            top, (sp, i, prediction) = max(known, key=lambda k: k[0])
        else:
            top, (sp, i, prediction) = None, max(members, key=lambda m: pr.total(m[0].peak))
        reserved = _opt(cols["peak_reserved"][i])
        device_max = None
        if nvml is not None and len(nvml):
            device_max = table_range_max(nvml, "used", sp.span.t0, sp.span.t1)
        e = explain_span(prediction, sp, top, reserved, device_max)
        e.count = len(members) if counts is None else counts[name, first]
        e.predicted = max(pr.total(m[0].peak) for m in members)
        out[name, first] = e
    predictions = [e.prediction for e in epochs if e.prediction is not None]
    latest = predictions[-1]
    return ProcessExplained(
        pid=proc.pid,
        label=proc.label,
        phases=out,
        activations_source=latest.activations_source,
        findings=list(dict.fromkeys(f for p in predictions for f in p.findings)),
        notes=list(dict.fromkeys([*(n for p in predictions for n in p.notes), *failed])),
        temporaries_name=latest.optimizer.temp_name,
    )


EXPLAIN_ROWS = 200_000
"""Phases :func:`explain_process` walks all of; a longer run is sampled (see there)."""

LEAD = 120 * 10**9
"""How far back a sampled walk starts before the span it explains (accumulation)."""

_NEVER = np.iinfo(np.int64).max


def _sampled(
    session: Session, proc: Process, epochs: list[Epoch]
) -> tuple[dict[str, np.ndarray], Counter[tuple[str, bool]]]:
    """The phases an explanation of a long run walks, and how many of each there were.

    One pass over the rows, in pieces, counts the spans of every predicted phase (first
    step or later, by the model each ran) and finds each name's highest measured peak;
    the rows returned are the start of each model's time (to two minutes after its first
    optimizer step) and the two minutes before each of those peaks.
    """
    table = proc.phases
    usable = [e for e in epochs if e.prediction is not None]
    known = {
        session.find_name(name)
        for e in usable
        for name, _ in e.prediction.phases  # type: ignore[union-attr]
    } - {None}
    opt = session.find_name("optimizer.step")
    starts = np.array([e.start for e in epochs[1:]], dtype=np.int64)
    predicted = np.array([e.prediction is not None for e in epochs])
    first_steps = np.array(
        [_NEVER if e.first_step is None else e.first_step for e in epochs], dtype=np.int64
    )
    first_t0 = np.full(len(epochs), _NEVER, dtype=np.int64)  # each model's first step began
    counts: Counter[tuple[str, bool]] = Counter()
    top: dict[int, tuple[int, int]] = {}  # name id -> (peak, t1)
    for cols in table.batches(columns=("t1", "t0", "name", "step", "peak_alloc")):
        model = np.searchsorted(starts, cols["t0"], "right")
        if opt is not None:
            hits = np.flatnonzero(cols["name"] == opt)
            for k in np.flatnonzero(first_t0 == _NEVER).tolist():
                mine = hits[model[hits] == k]
                if len(mine):
                    first_t0[k] = cols["t0"][mine[0]]
        names = cols["name"]
        step = cols["step"]
        early = cols["t0"] <= first_t0[model]
        early &= (step == MISSING_INT) | (step <= first_steps[model])
        walked = predicted[model]
        for nid in np.unique(names).tolist():
            if nid not in known:
                continue
            sel = (names == nid) & walked
            name = session.names[nid]
            n_first = int((sel & early).sum())
            counts[name, True] += n_first
            counts[name, False] += int(sel.sum()) - n_first
            peaks = np.where(sel, cols["peak_alloc"], MISSING_INT)
            i = int(np.argmax(peaks))
            if peaks[i] != MISSING_INT and (nid not in top or peaks[i] > top[nid][0]):
                top[nid] = (int(peaks[i]), int(cols["t1"][i]))
    for key in [k for k, v in counts.items() if v == 0]:
        del counts[key]
    merged = _walked(table, usable, sorted(t1 for _, t1 in top.values()))
    parts = [table.rows(a, b) for a, b in merged]
    cols = {c: np.concatenate([p[c] for p in parts]) for c in table.names}
    return cols, counts


def _walked(table: Table, usable: list[Epoch], peaks_t1: list[int]) -> list[tuple[int, int]]:
    """The row ranges a sampled explanation walks, merged so no span is walked twice:
    the start of each model's time (to :data:`LEAD` after its first optimizer step, at
    most a share of :data:`EXPLAIN_ROWS`) and the :data:`LEAD` before each peak's end."""
    head = max(4096, EXPLAIN_ROWS // 4 // max(1, len(usable)))
    pieces = []
    for e in usable:
        start = table.first if e.start == FIRST_START else table.search(e.start, "left")
        if e.first_t is not None:
            head_end = table.search(e.first_t + LEAD, "right")
        else:
            head_end = start + 4096
        pieces.append((start, min(head_end, start + head)))
    for t1 in peaks_t1:
        pieces.append((table.search(t1 - LEAD, "left"), table.search(t1, "right")))
    merged: list[tuple[int, int]] = []
    end = -1
    for a, b in sorted(pieces):
        a = max(a, end)
        if b > a:
            merged.append((a, b))
            end = b
    return merged


def predicted_json(ex: ProcessExplained, prediction: pr.Prediction | None = None) -> dict:
    """The ``predicted`` object of ``gpuwatch info --json`` for one process.

    Keyed by phase name: ``peak_bytes`` / ``first_step_peak_bytes`` (predicted),
    ``measured_peak_bytes`` / ``first_step_measured_peak_bytes``, ``unexplained_bytes`` /
    ``first_step_unexplained_bytes`` (measured - predicted at the measured peak's span),
    ``categories`` / ``first_step_categories``, ``activations_source``, ``temporaries``
    (what the step's temporary is) and ``explained`` (the one-line answer, later steps
    when there are any).
    """
    out: dict[str, Any] = {}
    names = sorted({name for name, _ in ex.phases}, key=phase_key)
    for name in names:
        later, first = ex.phases.get((name, False)), ex.phases.get((name, True))
        main = later or first
        assert main is not None
        entry: dict[str, Any] = {
            "peak_bytes": later.predicted if later else None,
            "first_step_peak_bytes": first.predicted if first else None,
            "measured_peak_bytes": later.measured if later else None,
            "first_step_measured_peak_bytes": first.measured if first else None,
            "unexplained_bytes": later.unexplained if later else None,
            "first_step_unexplained_bytes": first.unexplained if first else None,
            "categories": dict(main.categories),
            "first_step_categories": dict(first.categories) if first else None,
            "activations_source": ex.activations_source,
            "temporaries": main.temporaries or labels_for(ex, name),
            "explained": main.line() + (" (first step)" if main.first_step else ""),
        }
        out[name] = entry
    return out


def labels_for(ex: ProcessExplained, phase: str) -> str:
    """What the temporaries of ``phase`` are called in this process's explanations."""
    if phase == "optimizer.step":
        return ex.temporaries_name
    return _TEMP_LABELS.get(phase, "temporaries")


def format_predicted(
    label: str, predicted: dict[str, Any], findings: list[str], notes: list[str]
) -> list[str]:
    """The text of ``gpuwatch info`` for one process, from its ``predicted`` JSON object:
    a table of predicted against measured peaks, then one line per phase."""
    sources = {e.get("activations_source") for e in predicted.values()}
    src = next(iter(sources), None) or "unknown"
    lines = [
        f"predicted vs measured, {label} (exact allocator peaks; activations: {src})",
        f"  {'phase':18} {'first step: predicted':>22} {'measured':>11}"
        f" {'later: predicted':>17} {'measured':>11}",
    ]
    for name, e in predicted.items():
        lines.append(
            f"  {name[:18]:18}"
            f" {fmt_bytes(e.get('first_step_peak_bytes')):>22}"
            f" {fmt_bytes(e.get('first_step_measured_peak_bytes')):>11}"
            f" {fmt_bytes(e.get('peak_bytes')):>17}"
            f" {fmt_bytes(e.get('measured_peak_bytes')):>11}"
        )
    for e in predicted.values():
        if e.get("explained"):
            lines.append(f"  {e['explained']}")
    lines += [f"  finding: {f}" for f in findings]
    lines += [f"  prediction: {n}" for n in notes]
    return lines
