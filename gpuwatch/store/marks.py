"""Marks read back from a recording: those a bounded session let go of.

A session keeps only its newest marks in memory (see ``Retention``); the recording
holds every one, and views that reach further back read them from it through
:class:`FileMarks`, found by time through the file's ``events_by_time`` index.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np

from ..session import Mark
from . import _bodies
from .archive import ChunkSource

BATCH = 4096
"""Marks read from the file at a time (what reading them all holds at once)."""


def _mark(t: object, pid: object, body: object) -> Mark | None:
    """A stored mark made safe, or None (the file is the recording's word)."""
    if type(t) is not int or not isinstance(body, str):
        return None
    try:
        clean = _bodies.event("mark", json.loads(body))
    except ValueError:
        return None
    if clean is None:
        return None
    pid = pid if type(pid) is int else 0
    return Mark(t, pid, clean["text"], clean.get("level") or "info", clean.get("step"))


class FileMarks:
    """The marks a recording holds, read on demand (what a session reads back those it let
    go of from: a :class:`~gpuwatch.session.ports.MarkSource`).

    Args:
        source: The file's reading connection.
    """

    def __init__(self, source: ChunkSource) -> None:
        self.source = source

    def between(self, t0: int, t1: int, limit: int = BATCH) -> list[Mark]:
        """Marks timed within ``[t0, t1]``, the first ``limit`` of them in time."""
        rows = self.source.query(
            "SELECT t, pid, body FROM events WHERE kind = 'mark' AND t BETWEEN ? AND ? "
            "ORDER BY t LIMIT ?",
            (t0, t1, limit),
        )
        return [m for m in (_mark(*row) for row in rows) if m is not None]

    def times(self) -> tuple[np.ndarray, np.ndarray]:
        """Every mark's time and pid (no text is read into memory)."""
        rows = self.source.query("SELECT t, pid FROM events WHERE kind = 'mark'", ())
        rows = [(t, p if type(p) is int else 0) for t, p in rows if type(t) is int]
        if not rows:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        t, pid = zip(*rows, strict=True)
        return np.array(t, np.int64), np.array(pid, np.int64)

    def every(self) -> Iterator[Mark]:
        """Every mark in the order written, :data:`BATCH` at a time."""
        seq = 0
        while True:
            rows = self.source.query(
                "SELECT seq, t, pid, body FROM events WHERE kind = 'mark' AND seq > ? "
                "ORDER BY seq LIMIT ?",
                (seq, BATCH),
            )
            for row in rows:
                mark = _mark(*row[1:])
                if mark is not None:
                    yield mark
            if len(rows) < BATCH:
                return
            seq = rows[-1][0]
