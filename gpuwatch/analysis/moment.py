"""One device at one moment: every figure its panel shows, read once a frame.

The header, the legend and the breakdown bar of a panel describe the same moment; a
:class:`Moment` reads the device's sample, each process's allocator figures, phase and
predicted line once, and the widgets only format it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..session import Session, is_host
from .breakdown import Breakdown, _known, breakdown
from .predicted import PredictedLine
from .reading import Reading, read_processes


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
    """

    key: str
    t: int
    row: dict[str, float | int] | None
    readings: list[Reading]
    values: dict[str, float | None] = field(default_factory=dict)
    breakdown: Breakdown | None = None

    @property
    def span(self) -> dict[str, Any] | None:
        """The phase running at ``t`` on this device (first process that has one)."""
        reading = self.span_reading
        return reading.span if reading is not None else None

    @property
    def span_reading(self) -> Reading | None:
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
) -> Moment:
    """Read device ``key`` at ``t`` once (with the bar's breakdown when asked, GPUs only)."""
    if is_host(key):
        table = session.host_table(key)
        procs = session.processes_of_host(key)
        out = Moment(key, t, table.at(t) if len(table) else None, [])
        out.readings = read_processes(session, procs, t)
        out.values["nvml"] = _known(out.row, "used")
        # Only those alive at ``t``: an ended process's memory is freed (its last RSS
        # would make the figure grow under churn, above the host's own used memory).
        rss = [r.proc.rss.value_at("rss", t) for r in out.readings if r.running]
        rss = [v for v in rss if v is not None]
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
    if with_breakdown:
        out.breakdown = breakdown(session, key, t, readings=out.readings, row=row)
    return out
