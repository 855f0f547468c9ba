"""What the views ask of a session: who ran when, windows of its series, its events.

:class:`SessionQueries` is the read side of :class:`~gpuwatch.session.Session` (a base
class of it): these methods read the data model and change nothing in it but caches.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from .model import Mark, Oom
from .process import Process
from .table import MISSING_INT, Table

if TYPE_CHECKING:
    from .retention import Retention

SILENT_END = 500 * 10**6
"""How long a replayed process that never said goodbye is taken to run after its last
message: a script sends its allocator figures every 50 ms, so a recording stopped while it
ran keeps it to its end, and one killed is gone half a second later."""


class SessionQueries:
    """The queries of a session (see :class:`~gpuwatch.session.Session` for its data)."""

    t_origin: int
    live: bool
    version: int
    gpu: dict[str, Table]
    hosts: dict[str, Table]
    processes: dict[int, Process]
    names: list[str]
    marks: list[Mark]
    ooms: list[Oom]
    retention: Retention
    _lock: threading.RLock
    _range: tuple[int, tuple[int, int]] | None
    _event_index: dict[str, tuple[Any, ...]]

    # ------------------------------------------------------------------ who ran when

    def alive(self, t: int) -> list[Process]:
        """Instrumented processes running at time ``t`` (seen by then, not yet gone)."""
        return [p for p in list(self.processes.values()) if self.runs_at(p, t)]

    def runs_at(self, proc: Process, t: int) -> bool:
        """Did ``proc`` run at ``t``: seen by then, not yet gone. A process that never
        said goodbye runs on until the host sampler finds it gone, or while the session is
        live; in a replay, until its last message and :data:`SILENT_END` after (its
        figures after that are no one's)."""
        if t < proc.first_t:
            return False
        if proc.ended is not None:
            return t < proc.ended
        if proc.gone is not None:  # killed, or its bye lost: the host sampler saw it go
            return t < proc.gone
        return self.live or t <= proc.last_t + SILENT_END

    def active(self, t0: int, t1: int) -> list[Process]:
        """Instrumented processes whose life overlaps ``[t0, t1]``: those a window shows.

        A process that never said goodbye lives on while the session is live; in a replay it
        ends with its last message.
        """
        out = []
        for p in list(self.processes.values()):
            end = p.ended if p.ended is not None else (None if self.live else p.last_t)
            if p.first_t <= t1 and (end is None or end >= t0):
                out.append(p)
        return out

    def processes_on(self, key: str) -> list[Process]:
        """Instrumented processes that report figures for device ``key``."""
        return [p for p in self.processes.values() if key in p.devices.values()]

    def now(self) -> int:
        """The newest time seen (live: the clock; replay: the last sample)."""
        if self.live:
            return time.monotonic_ns()
        return self.time_range()[1]

    def time_range(self) -> tuple[int, int]:
        """(first, last) time of anything recorded; (t_origin, t_origin) when empty."""
        cached = self._range
        if cached is not None and cached[0] == self.version:
            return cached[1]
        result = self._time_range()
        self._range = (self.version, result)
        return result

    def _time_range(self) -> tuple[int, int]:
        lo, hi = None, None
        tables: list[Table] = [*self.hosts.values(), *self.gpu.values()]
        for p in self.processes.values():
            tables += [p.torch, p.phases, p.rss]
        for table in tables:
            s = table.span()
            if s is None:
                continue
            lo = s[0] if lo is None else min(lo, s[0])
            hi = s[1] if hi is None else max(hi, s[1])
        for p in self.processes.values():
            for span in list(p.open.values()):
                hi = span.t0 if hi is None else max(hi, span.t0)
        if lo is None or hi is None:
            return self.t_origin, self.t_origin
        return lo, hi

    # ------------------------------------------------------------------ windows

    def gpu_window(
        self, key: str, column: str, t0: int, t1: int, width: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Min/max-decimated NVML column of a GPU over ``[t0, t1]`` in ``width`` columns."""
        return self.gpu[key].minmax(column, t0, t1, width)

    def events_between(self, t0: int, t1: int) -> tuple[list[Mark], list[Oom]]:
        """The marks and OOMs timed within ``[t0, t1]`` (a run that marks every step has
        many: found by their times, not by looking at each)."""
        marks = self.retention.marks_between(t0, t1, self._between(self.marks, "marks", t0, t1))
        return marks, self._between(self.ooms, "ooms", t0, t1)

    def _between(self, events: list[Any], name: str, t0: int, t1: int) -> list[Any]:
        """``events`` (the list ``name``) within ``[t0, t1]``, from a sorted index of their
        times kept until the list changes."""
        cache = self._event_index.get(name)
        if cache is None or cache[0] is not events or cache[1] != len(events):
            times = np.array([e.t for e in events], dtype=np.int64)
            order = np.argsort(times, kind="stable")
            cache = (events, len(events), times[order], order)
            self._event_index[name] = cache
        _, _, times, order = cache
        i0, i1 = np.searchsorted(times, t0, "left"), np.searchsorted(times, t1, "right")
        return [events[i] for i in sorted(order[i0:i1].tolist())]

    # ------------------------------------------------------------------ phases

    def span_at(self, proc: Process, t: int) -> dict[str, Any] | None:
        """The innermost phase of ``proc`` running at time ``t``, or None.

        Returns:
            ``name``, ``t0``, ``t1`` (None while running), ``step``, ``depth``,
            ``peak_alloc`` and ``peak_reserved`` (None when not reported).
        """
        cols = proc.spans(t, t)
        best: dict[str, Any] | None = None
        for i in range(len(cols["t0"])):
            depth = int(cols["depth"][i])
            if cols["t0"][i] <= t <= cols["t1"][i] and (best is None or depth > best["depth"]):
                best = {
                    "name": self.names[int(cols["name"][i])],
                    "t0": int(cols["t0"][i]),
                    "t1": int(cols["t1"][i]),
                    "step": _none(int(cols["step"][i])),
                    "depth": depth,
                    "peak_alloc": _none(int(cols["peak_alloc"][i])),
                    "peak_reserved": _none(int(cols["peak_reserved"][i])),
                }
        for span in list(proc.open.values()):
            if span.t0 <= t and (best is None or span.depth > best["depth"]):
                with self._lock:  # the receiver's thread updates the book
                    book = proc.book
                    peak_alloc, peak_reserved = (
                        book.peak_of(span) if book is not None else (None, None)
                    )
                best = {
                    "name": span.name,
                    "t0": span.t0,
                    "t1": None,
                    "step": span.step,
                    "depth": span.depth,
                    "peak_alloc": peak_alloc,
                    "peak_reserved": peak_reserved,
                }
        return best

    def phase_at(self, proc: Process, t: int) -> str | None:
        """The name of the innermost phase of ``proc`` running at time ``t``."""
        span = self.span_at(proc, t)
        return span["name"] if span else None


def _none(v: int) -> int | None:
    return None if v == MISSING_INT else v
