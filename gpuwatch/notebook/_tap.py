"""What a notebook kernel's client flushed, folded into spans with their exact peaks.

The client hands every batch of events to :class:`CellTap` (``Client.tap``), on its sender
thread or at a cell's end; each phase boundary's allocator figures raise the peak of every
span open at that moment, so each ended span carries the exact allocator peak inside it on
CUDA (and nothing on the CPU, where no figures are sent). The session of the dashboard
folds the same boundaries the same way: a span's peak is the highest boundary peak after
its begin, up to and including its end.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

MAX_SPANS = 4096
"""Ended spans kept (every cell's and every phase's, newest last)."""

MAX_SAMPLES = 20_000
"""Allocator figures kept for the chart (time, allocated, reserved), newest last."""


@dataclass
class Ended:
    """One ended span.

    Attributes:
        name: Phase name (a cell's is ``[N] first line``).
        sid: Its id.
        t0, t1: Begin and end (``time.monotonic_ns()``).
        step: Training step at its begin.
        depth: Nesting depth (a cell is 0).
        peak_alloc: Highest allocated bytes inside it (None on the CPU).
        peak_reserved: Highest reserved bytes inside it (None on the CPU).
        error: The exception's class name when it raised.
    """

    name: str
    sid: int
    t0: int
    t1: int
    step: int | None
    depth: int
    peak_alloc: int | None = None
    peak_reserved: int | None = None
    error: str | None = None


@dataclass
class _Open:
    name: str
    t0: int
    step: int | None
    depth: int
    peak_alloc: int | None = None
    peak_reserved: int | None = None


@dataclass
class CellTap:
    """Spans and allocator figures of this process, from the events its client flushed."""

    spans: deque[Ended] = field(default_factory=lambda: deque(maxlen=MAX_SPANS))
    samples: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    first_step: int | None = None  # the step of the first optimizer.step that ended
    _open: dict[int, _Open] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, items: list[tuple[Any, ...]]) -> None:
        """Fold a batch of the client's events (``Client.tap``); never raises."""
        with self._lock:
            for item in items:
                try:
                    kind = item[0]
                    if kind == "phase":
                        self._phase(item)
                    elif kind == "memory":
                        self._figures(item[1], item[2])
                except Exception:
                    continue

    def _phase(self, item: tuple[Any, ...]) -> None:
        _, t, event, name, sid, _parent, depth, step, fig, error = item
        if event == "begin":
            self._figures(t, fig)  # what came before the begin is not the span's
            self._open[sid] = _Open(name, t, step, depth)
            return
        self._figures(t, fig)
        span = self._open.pop(sid, None)
        if span is None:
            return
        self.spans.append(
            Ended(
                name, sid, span.t0, t, span.step, depth, span.peak_alloc, span.peak_reserved, error
            )
        )
        if name == "optimizer.step" and error is None and self.first_step is None:
            self.first_step = step

    def _figures(self, t: int, fig: Any) -> None:
        """A boundary's (or a periodic read's) figures raise the open spans' peaks."""
        if fig is None:
            return
        alloc = fig[3] if fig[3] is not None else fig[1]
        reserved = fig[4] if fig[4] is not None else fig[2]
        self.samples.append((t, int(fig[1]), int(fig[2])))
        for span in self._open.values():
            if span.peak_alloc is None or alloc > span.peak_alloc:
                span.peak_alloc = alloc
            if span.peak_reserved is None or reserved > span.peak_reserved:
                span.peak_reserved = reserved

    def ended(self, sid: int) -> Ended | None:
        """The ended span of id ``sid``, newest first (None if not flushed yet)."""
        with self._lock:
            for span in reversed(self.spans):
                if span.sid == sid:
                    return span
        return None

    def inside(self, cell: Ended) -> list[Ended]:
        """The spans that ran inside ``cell`` (itself excluded), in order of their end."""
        with self._lock:
            return [
                s for s in self.spans if s.sid != cell.sid and s.t0 >= cell.t0 and s.t1 <= cell.t1
            ]

    def history(self, before: int) -> list[Ended]:
        """Every span kept that began before ``before`` (what the predictor walks)."""
        with self._lock:
            return [s for s in self.spans if s.t0 < before]

    def window(self, t0: int, t1: int) -> list[tuple[int, int, int]]:
        """The allocator figures read in ``[t0, t1]``."""
        with self._lock:
            return [s for s in self.samples if t0 <= s[0] <= t1]
