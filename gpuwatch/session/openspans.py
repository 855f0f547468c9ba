"""The phases a process has open: how many it may have, and what each event costs.

A script that begins phases and never ends them (a leak, an exception path that skips the
``end``) must not make every later event slower, nor memory grow: a process keeps at most
:data:`MAX_OPEN` open spans, and a boundary's peaks reach every open span in
O(log open) through :class:`SuffixMax` instead of a loop over them.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from collections import OrderedDict
from typing import Any

from .model import OpenSpan

MAX_OPEN = 1024
"""Open spans a process keeps; past this, one is closed as abandoned for each new begin."""

OUTER_DEPTH = 8
"""Spans shallower than this are a run's outer phases (train, epoch, step): the oldest
deeper span is abandoned first, so a leak inside a step never closes the run's own phases."""

CHANGED_MAX = 2 * MAX_OPEN
"""Span ids the recorder is told of one by one; past this it rewrites them all."""


class SuffixMax:
    """The largest value pushed at or after a position, for positions of spans still open.

    Values pushed later than a larger one only matter until it is beaten: the entries kept
    are strictly decreasing, so a push pops what it beats and a query is a binary search.
    """

    __slots__ = ("at", "val")

    def __init__(self) -> None:
        self.at: list[int] = []
        self.val: list[int] = []

    def push(self, i: int, v: int) -> None:
        """Value ``v`` at position ``i`` (positions increase)."""
        at, val = self.at, self.val
        while val and val[-1] <= v:
            val.pop()
            at.pop()
        at.append(i)
        val.append(v)

    def since(self, i: int) -> int | None:
        """The largest value pushed at position ``i`` or later, or None."""
        k = bisect_left(self.at, i)
        return self.val[k] if k < len(self.val) else None

    def keep(self, positions: list[int]) -> None:
        """Forget every entry no ``since(p)`` of these sorted positions can return (the
        answers for them, now and after later pushes, stay the same)."""
        at: list[int] = []
        val: list[int] = []
        for p in positions:
            k = bisect_left(self.at, p)
            if k < len(self.at) and (not at or at[-1] != self.at[k]):
                at.append(self.at[k])
                val.append(self.val[k])
        self.at, self.val = at, val


class OpenBook:
    """What a process's open spans need beyond the spans themselves (live ingest only).

    Attributes:
        deep: Ids of open spans at :data:`OUTER_DEPTH` or deeper, oldest first.
        since: Span id -> how many boundaries with peaks came before it began.
        boundaries: Boundaries with peaks so far.
        changed: Span ids begun or ended since the recorder last looked.
        reset: Too many changed: the recorder rewrites every open span.
    """

    __slots__ = ("alloc", "boundaries", "changed", "deep", "reserved", "reset", "since")

    def __init__(self) -> None:
        self.deep: OrderedDict[int, None] = OrderedDict()
        self.since: dict[int, int] = {}
        self.boundaries = 0
        self.alloc = SuffixMax()
        self.reserved = SuffixMax()
        self.changed: set[int] = _NONE  # a set of its own once one changes
        self.reset = True  # a new process: whoever records it writes all of its spans

    def peaks(self, pa: int | None, pr: int | None, open_count: int) -> None:
        """A boundary's peaks: they lay inside every span open now."""
        i = self.boundaries
        self.boundaries = i + 1
        if pa is not None:
            self.alloc.push(i, pa)
        if pr is not None:
            self.reserved.push(i, pr)
        if len(self.alloc.at) + len(self.reserved.at) > 4 * open_count + 64:
            positions = sorted(set(self.since.values()))
            self.alloc.keep(positions)
            self.reserved.keep(positions)

    def peak_of(self, span: OpenSpan) -> tuple[int | None, int | None]:
        """The peaks reported inside ``span`` so far (allocated, reserved)."""
        i = self.since.get(span.id)
        if i is None:
            return span.peak_alloc, span.peak_reserved
        return _max(span.peak_alloc, self.alloc.since(i)), _max(
            span.peak_reserved, self.reserved.since(i)
        )

    def begin(self, spans: dict[int, OpenSpan], span: OpenSpan) -> int:
        """Open ``span``; returns how many spans were abandoned to make room (0 or 1)."""
        abandoned = 0
        if span.id in spans:  # an id begun twice: the new begin replaces the old span
            self.forget(spans, span.id)
        elif len(spans) >= MAX_OPEN:
            victim = next(iter(self.deep)) if self.deep else next(iter(spans))
            self.forget(spans, victim)
            abandoned = 1
        spans[span.id] = span
        self.since[span.id] = self.boundaries
        if span.depth >= OUTER_DEPTH:
            self.deep[span.id] = None
        self._changed(span.id)
        return abandoned

    def end(self, spans: dict[int, OpenSpan], sid: int) -> OpenSpan | None:
        """Close span ``sid`` (None if it is not open); its peaks are final."""
        span = spans.get(sid)
        if span is None:
            return None
        span.peak_alloc, span.peak_reserved = self.peak_of(span)
        self.forget(spans, sid)
        return span

    def forget(self, spans: dict[int, OpenSpan], sid: int) -> None:
        """Drop span ``sid`` from the open ones."""
        spans.pop(sid, None)
        self.since.pop(sid, None)
        self.deep.pop(sid, None)
        self._changed(sid)
        if not spans:  # nothing open: no earlier peak can matter again
            self.alloc = SuffixMax()
            self.reserved = SuffixMax()

    def _changed(self, sid: int) -> None:
        if self.reset:
            return
        if self.changed is _NONE:
            self.changed = set()
        self.changed.add(sid)
        if len(self.changed) > CHANGED_MAX:
            self.changed = _NONE
            self.reset = True

    def take_changes(self) -> tuple[bool, set[int]]:
        """``(rewrite all, ids changed)`` since the last call (the recorder's)."""
        reset, changed = self.reset, self.changed
        self.reset, self.changed = False, _NONE
        return reset, changed


_NONE: set[int] = frozenset()  # type: ignore[assignment]  # shared, never added to


def stored_open(book: OpenBook, span: OpenSpan) -> dict[str, Any]:
    """An open span as a recording stores it, with the peaks reported inside it so far."""
    body = dataclasses.asdict(span)
    body["peak_alloc"], body["peak_reserved"] = book.peak_of(span)
    return body


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a >= b else b
