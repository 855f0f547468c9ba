"""One device at one moment: every figure its panel shows, read once a frame.

The header, the legend and the breakdown bar of a panel describe the same moment; a
:class:`Moment` reads the device's sample, each process's allocator figures, phase and
predicted line once, and the widgets only format it. Inside a phase whose exact peak is
known, the figures come from that phase's explanation (:func:`explain_span`, the object
``gpuwatch info`` and the Peaks tab read), not from the predicted curve at the instant:
the bar at the phase's peak splits it exactly as ``info`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..session import Oom, Session, is_host
from ..session.peaks import table_range_max
from .breakdown import Breakdown, _known, breakdown
from .explain import Explained, explain_span
from .predicted import PredictedLine
from .process_reading import ProcessReading, read_processes


@dataclass
class Moment:
    """A device at time ``t``.

    Attributes:
        key: The device.
        t: The moment.
        row: The device's sample at or before ``t`` (NVML's, or the host's RAM), or None.
        readings: Its processes at ``t``: those on the GPU, or those of the host.
        values: Each line's step-hold value (``nvml``, ``reserved``, ``allocated``,
            ``predicted``; the host's ``nvml`` is RAM used and ``allocated`` the RSS).
        breakdown: The bar's split of the GPU's memory, when asked for.
        explained: Pid -> the explanation of the phase it ran at ``t``, for each process
            in an ended phase with an exact peak and a prediction.
        oom: An out-of-memory error that ended the phase a process ran at ``t``, at or
            before ``t`` (the newest), or None.
    """

    key: str
    t: int
    row: dict[str, float | int] | None
    readings: list[ProcessReading]
    values: dict[str, float | None] = field(default_factory=dict)
    breakdown: Breakdown | None = None
    explained: dict[int, Explained] = field(default_factory=dict)
    oom: Oom | None = None

    @property
    def span(self) -> dict[str, Any] | None:
        """The phase running at ``t`` on this device (first process that has one)."""
        reading = self.span_reading
        return reading.span if reading is not None else None

    @property
    def span_reading(self) -> ProcessReading | None:
        """The reading of the first process running a phase at ``t``."""
        for reading in self.readings:
            if reading.span:
                return reading
        return None


def moment(
    session: Session,
    key: str,
    t: int,
    predicted: Mapping[int, PredictedLine] | None = None,
    with_breakdown: bool = False,
    explain: bool = True,
) -> Moment:
    """Read device ``key`` at ``t`` once (with the bar's breakdown when asked, GPUs only).

    ``explain=False`` reads the figures alone: no phase explained, no OOM looked for (the
    overview's rows show neither, and read every GPU at each frame).
    """
    if is_host(key):
        host = session.host_table(key)
        procs = session.processes_of_host(key)
        out = Moment(key, t, host.at(t) if len(host) else None, [])
        out.readings = read_processes(session, procs, t)
        out.values["nvml"] = _known(out.row, "used")
        # Only those alive at ``t``: an ended process's memory is freed (its last RSS
        # would make the figure grow under churn, above the host's own used memory).
        alive = [r.proc.rss.value_at("rss", t) for r in out.readings if r.running]
        rss = [v for v in alive if v is not None]
        if rss:
            out.values["allocated"] = float(sum(rss))
        return out
    table = session.gpu.get(key)
    row = table.at(t) if table is not None and len(table) else None
    out = Moment(key, t, row, read_processes(session, session.processes_on(key), t, predicted))
    if table is not None and len(table):
        out.values["nvml"] = _known(row, "used")
    for reading in out.readings:
        if not reading.running:  # a process that has exited holds nothing
            continue
        for role in ("reserved", "allocated"):
            v = _known(reading.torch, role)
            if v is not None:
                out.values[role] = (out.values.get(role) or 0) + v
        v = reading.line.value_at(t) if reading.line is not None else None
        if v is not None:
            out.values["predicted"] = (out.values.get("predicted") or 0) + v
    if not (explain or with_breakdown):
        return out
    out.explained = _explain(session, key, out.readings)
    out.oom = _oom_at(session, out.readings, t)
    if with_breakdown:
        phase = {pid: e.categories for pid, e in out.explained.items()}
        out.breakdown = breakdown(
            session, key, t, readings=out.readings, row=row, phase_predicted=phase, oom=out.oom
        )
    return out


MEMO_SIZE = 64
"""Explanations kept per predicted line (one per phase the cursor visits: every frame asks)."""


def _explain(session: Session, key: str, readings: list[ProcessReading]) -> dict[int, Explained]:
    """Each running process's phase at the moment, explained (see :class:`Moment`)."""
    out: dict[int, Explained] = {}
    for reading in readings:
        line, span = reading.line, reading.span
        if not reading.running or line is None or span is None:
            continue
        if span.get("peak_alloc") is None or span.get("t1") is None:
            continue  # an open phase, or no exact peak: the curve at the instant
        name, t0, t1 = span["name"], span["t0"], span["t1"]
        epoch = line.epoch_at(t0)  # the model the span ran: a later one does not explain it
        prediction = epoch.prediction if epoch is not None else None
        if epoch is None or prediction is None:
            continue
        nvml = session.gpu.get(key)
        rows = len(nvml) if nvml is not None else 0
        # (The prediction by identity: the value holds it, so the id is not reused.)
        memo = line.memo
        stamp = ("explained", id(prediction), epoch.first_step, key, name, t0, t1, rows)
        kept = memo.get(stamp)
        if kept is not None and kept[0] is prediction:
            memo.move_to_end(stamp)
            found = kept[1]
        else:
            sp = line.span_peak(name, t0, t1)
            found = None
            if sp is not None:
                used = table_range_max(nvml, "used", t0, t1) if nvml is not None and rows else None
                found = explain_span(
                    prediction, sp, span["peak_alloc"], span.get("peak_reserved"), used
                )
            memo[stamp] = (prediction, found)
            if len(memo) > MEMO_SIZE:
                memo.popitem(last=False)
        if found is not None:
            out[reading.proc.pid] = found
    return out


LATE_NS = 5_000_000
"""An OOM stamped this soon after the phase it names ended belongs to that phase: before
the event kept the allocator observer's time, it carried the time the error left the
phase (recordings of that version, the OOM sample among them)."""


def _oom_at(session: Session, readings: list[ProcessReading], t: int) -> Oom | None:
    """The newest OOM of a process in the phase it ran at ``t``, from its start to ``t``:
    the phase it broke tells the error's story until the phase ends."""
    found: Oom | None = None
    for reading in readings:
        span, late = reading.span, False
        if span is None:
            # Between phases (most frames): a phase's lookup only for an OOM just before.
            pid = reading.proc.pid
            if not any(o.pid == pid for o in session.events_between(t - LATE_NS, t)[1]):
                continue
            span = session.span_at(reading.proc, t - LATE_NS)
            late = True
            if span is None or span["t1"] is None:
                continue
        for oom in session.events_between(span["t0"], t)[1]:
            if oom.pid != reading.proc.pid or (found is not None and oom.t <= found.t):
                continue
            if late and not (oom.t > span["t1"] and oom.body.get("phase") == span["name"]):
                continue
            found = oom
    return found
