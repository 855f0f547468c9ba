"""What the dashboard's frame reads of the session, taken at once (:meth:`Session.frame`).

A :class:`FrameState` holds figures and tuples only, never one of the session's own
containers: a widget that draws from it cannot see the session change under it, nor
change it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .model import Mark, Oom

WindowOf = Callable[[int], tuple[int, int]]
"""The frame's window, given the data's first time (a window that starts with the data)."""


@dataclass(frozen=True, slots=True)
class FrameState:
    """One frame's view of the session, read under its lock in one go.

    Attributes:
        version: The session's version when read (every change bumps it).
        t_origin: Time zero on the axis.
        live: A live session (else a replay).
        time_range: (first, last) time of anything recorded.
        window: The frame's time window (from ``window_of`` and :attr:`time_range`).
        devices: The keys of every device, in the order they were added.
        gpus: How many of them are GPUs.
        instrumented: Instrumented processes alive in :attr:`window`.
        rejects: Messages refused, all reasons together.
        dropped: Messages the instrumented processes dropped, all together.
        notes: The session's one-line notices.
        events: The OOMs, then the marks, timed within :attr:`window`.
    """

    version: int
    t_origin: int
    live: bool
    time_range: tuple[int, int]
    window: tuple[int, int]
    devices: tuple[str, ...]
    gpus: int
    instrumented: int
    rejects: int
    dropped: int
    notes: tuple[str, ...]
    events: tuple[Mark | Oom, ...]

    def nearest(self, t: int) -> Mark | Oom | None:
        """The mark or OOM in the window nearest to ``t`` (an OOM on a tie), or None."""
        return min(self.events, key=lambda e: abs(e.t - t), default=None)
