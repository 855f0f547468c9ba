"""One refresh in flight at a time, the next an interval after the last began.

The grid's refreshes and a host's drill-down both ask Prometheus on a thread worker at
the scrape interval. :class:`Cadence` holds the rule they share: a refresh asked for
while one is in flight (``r``, a new window) runs as soon as that one ends, never beside
it, and the next timed refresh comes an interval after the last one *began*, so a slow
answer does not stretch the interval.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from textual.dom import DOMNode
from textual.timer import Timer
from textual.worker import Worker, WorkerState

MIN_WAIT = 0.001
"""Shortest wait before the next refresh (s): Textual's timer of 0 s never fires, so a
refresh that took longer than the interval stopped the refreshes for good."""


class Cadence:
    """The refreshes of one worker group.

    Args:
        node: Where the timer runs (the app or the screen that owns the worker).
        start: Starts one refresh's worker (in ``group``).
        interval: Seconds between two refreshes, asked each time (it may change).
        group: The worker group whose ends :meth:`ended` recognises.
    """

    def __init__(
        self,
        node: DOMNode,
        start: Callable[[], object],
        interval: Callable[[], float],
        group: str,
    ) -> None:
        self._node = node
        self._start = start
        self._interval = interval
        self.group = group
        self._next: Timer | None = None
        self._asking = False
        self._again = False

    def now(self) -> None:
        """Refresh now, or right after the refresh in flight if one is."""
        if self._next is not None:
            self._next.stop()
            self._next = None
        if self._asking:
            self._again = True
            return
        self._asking = True
        self._start()

    def ended(self, event: Worker.StateChanged) -> bool:
        """Whether ``event`` is the end (success or error) of one of this cadence's
        refreshes; a cancelled one (the view closing) is not."""
        return event.worker.group == self.group and event.state in (
            WorkerState.SUCCESS,
            WorkerState.ERROR,
        )

    def done(self, began: float) -> None:
        """The refresh that began at ``began`` (monotonic) ended: schedule the next."""
        self._asking = False
        if self._again:
            self._again = False
            self.now()
            return
        wait = max(MIN_WAIT, self._interval() - (time.monotonic() - began))
        self._next = self._node.set_timer(wait, self.now)
