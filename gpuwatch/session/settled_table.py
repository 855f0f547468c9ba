"""A settled process's table, held as its size and time span only.

A process that ended and whose rows its recording holds keeps no table in memory: a sweep
of thousands of short scripts would otherwise keep a table, an archive and their indexes
for each of the four series of every process ever seen. :class:`SettledTable` stands in
for such a table; it answers what every view asks of every process (how many rows, over
what time) and is replaced by the real table, read back from the file, the first time
anything else is asked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .process import Process
    from .table import Table

Reopen = Callable[["Process", str], "Table"]


class SettledTable:
    """Stands in for ``proc.<kind>`` while all its rows are in the recording.

    Args:
        proc: The process whose table this is.
        kind: ``torch``, ``peaks``, ``rss`` or ``phases``.
        rows: Rows the table had (all of them archived).
        span: Their first and last time, or None when there were none.
        reopen: Makes the real table again and puts it in ``proc`` (the session's).
    """

    __slots__ = ("_kind", "_proc", "_reopen", "_rows", "_t0", "_t1")

    def __init__(
        self,
        proc: Process,
        kind: str,
        rows: int,
        span: tuple[int, int] | None,
        reopen: Reopen,
    ) -> None:
        self._proc = proc
        self._kind = kind
        self._rows = rows
        # Two slots, not a tuple: thousands of these are kept.
        self._t0: int | None = span[0] if span is not None else None
        self._t1: int | None = span[1] if span is not None else None
        self._reopen = reopen

    def __len__(self) -> int:
        return self._rows

    def span(self) -> tuple[int, int] | None:
        """(first, last) time of its rows, or None when it had none."""
        return None if self._t0 is None or self._t1 is None else (self._t0, self._t1)

    @property
    def in_memory(self) -> int:
        """Rows held in memory: none."""
        return 0

    def __getattr__(self, name: str) -> Any:
        # Anything else reads rows: the real table, made once (a later read of this
        # stand-in, held by a caller from before, goes to the same one).
        return getattr(self._reopen(self._proc, self._kind), name)
