"""What each instrumented process of a device says at one moment, read once.

The panel's legend and its breakdown bar describe the same moment: both read the
processes' allocator figures, their phase and their predicted lines from one list of
:class:`ProcessReading`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..session import Process, Session
from .predicted import PredictedLine


@dataclass
class ProcessReading:
    """One process at time ``t``.

    Attributes:
        proc: The process.
        t: The moment.
        running: Whether it ran then (a process that has exited holds nothing).
        torch: Its allocator row at or before ``t`` while it ran, else None.
        line: Its predicted line, if it sent facts.
    """

    proc: Process
    t: int
    running: bool
    torch: dict[str, float | int] | None
    line: PredictedLine | None
    session: Session = field(repr=False)

    @functools.cached_property
    def span(self) -> dict[str, Any] | None:
        """The innermost phase it ran at ``t`` (read on first use, then kept)."""
        return self.session.span_at(self.proc, self.t)


def read_processes(
    session: Session,
    procs: list[Process],
    t: int,
    predicted: Mapping[int, PredictedLine] | None = None,
) -> list[ProcessReading]:
    """A reading of each of ``procs`` at ``t``, in their order."""
    lines = predicted or {}
    out = []
    for proc in procs:
        running = session.runs_at(proc, t)
        row = proc.torch.at(t) if running else None
        out.append(ProcessReading(proc, t, running, row, lines.get(proc.pid), session))
    return out
