"""A thread-safe columnar table of numpy arrays, ordered by a time column, of bounded size.

Samplers append rows from their own threads while the UI reads; appends are amortised O(1)
(capacity doubles) and a read takes a consistent snapshot under a short lock.

Rows are numbered from 0 for the whole life of the table, but memory need not hold them
all. An *archive* (the recording: :class:`Archive`) may hold the older rows, read back on
demand; a table with a retention (:meth:`Table.retain`) keeps only its newest rows in
memory, letting go of those the archive holds, or, without an archive, keeping their
summaries (:mod:`.summary`) as a coarser and coarser history. Window queries
(:meth:`Table.minmax`, :meth:`Table.segment_max`, :meth:`Table.plan`) read rows exactly
while a window holds few enough of them and use summaries beyond: memory stays flat
however long the run, and a zoomed-out view of days costs what one of minutes does.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from . import summary as sm
from .decimate import minmax as _minmax
from .decimate import segment_max as _segment_max

MISSING_INT = np.iinfo(np.int64).min
"""Stored where an integer field is unknown ("n/a"); never a real byte count."""

EXACT_ROWS = 16_384
"""Archived rows a window query reads exactly, at least (beyond: summaries)."""

EXACT_PER_COLUMN = 64
"""...or this many per output column, whichever is more."""

HISTORY_BLOCKS = 4096
"""Summary blocks a table without an archive keeps of the rows it let go; past this,
neighbours merge (older history gets coarser, never lost)."""


Side = Literal["left", "right"]
"""Which end of a run of equal times a search finds (as ``np.searchsorted``)."""


class Archive(Protocol):
    """Where a table's older rows live (a recording): rows ``[0, rows)``, read on demand."""

    rows: int
    live: bool  # more rows may still come (a recording being written)

    def search(self, t: int, side: Side) -> int:
        """Like ``np.searchsorted`` over the archived time column."""

    def read(self, i0: int, i1: int, columns: Sequence[str]) -> dict[str, np.ndarray]:
        """Rows ``[i0, i1)`` of ``columns`` (new arrays, the table's dtypes)."""

    def times(self) -> tuple[int, int] | None:
        """First and last time archived, or None when empty."""

    def count(self, t0: int, t1: int) -> tuple[int, int]:
        """At least and at most how many archived rows lie in ``[t0, t1]`` (from the index
        alone: no row is read)."""

    def summary(self, t0: int, t1: int, width: int) -> sm.Blocks | None:
        """Summary blocks meeting ``[t0, t1]``, fine enough for ``width`` columns (None:
        the archive has none of this kind)."""

    def max_rows(self, column: str, i0: int, i1: int) -> tuple[int, int] | None:
        """``(time, value)`` of the largest known value of ``column`` in rows ``[i0, i1)``
        (the first time it was reached), or None."""

    def ranges(self, i0: int, i1: int) -> list[tuple[int, int]]:
        """Rows ``[i0, i1)`` cut where the archive's own pieces (chunks) end."""

    def transform(self, shift: int, maps: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        """Add ``shift`` to the times it reads and renumber ``maps``' columns (a merge)."""


@dataclass(frozen=True)
class WindowPlan:
    """How to answer a window query: rows to read exactly, summaries for the rest.

    Attributes:
        i0: First row to read exactly.
        i1: One past the last.
        blocks: Summaries of the window's other rows (older than row ``i0``), or None.
        hold_until: Summaries carry a held value into columns starting up to this time.
    """

    i0: int
    i1: int
    blocks: sm.Blocks | None
    hold_until: int


class Table:
    """Columns of equal length, the first of which is a non-decreasing int64 time column.

    Args:
        columns: ``(name, dtype)`` pairs; the first must be the time column.
        capacity: Initial rows to allocate (0: none until the first row, for a table
            whose rows are read from its archive).
        kind: The session table kind (``gpu``, ``torch``, ``phases``...): what its
            summaries keep (see :data:`~.summary.SPECS`).
    """

    def __init__(
        self, columns: Sequence[tuple[str, str]], capacity: int = 1024, *, kind: str | None = None
    ) -> None:
        self.names, self.dtypes = _layout(tuple(columns))  # shared: read-only
        self.time = self.names[0]
        self.kind = kind
        self.spec = sm.SPECS.get(kind) if kind is not None else None
        self._cap = max(16, capacity) if capacity else 0
        if self._cap:
            self._cols = {n: np.empty(self._cap, dtype=self.dtypes[n]) for n in self.names}
        else:  # shared: an empty column is never written (_grow replaces it)
            self._cols = {n: _empty(self.dtypes[n]) for n in self.names}
        self._n = 0  # rows in memory
        self._base = 0  # the row number of the first row in memory
        self._lock = threading.Lock()
        self.version = 0
        self.archive: Archive | None = None
        self.history: sm.Blocks | None = None  # summaries of rows let go, in no archive
        self.keep: int | None = None  # rows kept in memory (None: all)

    # ------------------------------------------------------------------ size

    def __len__(self) -> int:
        a = self.archive.rows if self.archive is not None else 0
        return max(a, self._base + self._n)

    @property
    def first(self) -> int:
        """The first row that can be read (0, unless rows went without an archive)."""
        return 0 if self.archive is not None else self._base

    @property
    def in_memory(self) -> int:
        """Rows held in memory."""
        return self._n

    def retain(self, rows: int | None) -> None:
        """Keep at most about ``rows`` rows in memory (twice that between trims); None: all.

        Rows go only once the archive holds them; without an archive (or once it stopped
        growing), what goes is kept as summaries (:attr:`history`).
        """
        self.keep = rows
        self._maybe_trim()

    def set_archive(self, archive: Archive | None) -> None:
        """Attach the archive holding rows ``[0, archive.rows)`` (a recording)."""
        with self._lock:
            self.archive = archive
        self.version += 1

    def resume(self, archive: Archive) -> None:
        """Attach the archive holding every row so far (an empty table): new rows follow
        them."""
        with self._lock:
            self.archive = archive
            self._base, self._n = archive.rows, 0
        self.version += 1

    def archive_grew(self) -> None:
        """The archive holds more rows now: memory may let go of them."""
        self.version += 1
        self._maybe_trim()

    # ------------------------------------------------------------------ appending

    def _grow(self, need: int) -> None:
        cap = max(self._cap, 16)
        while cap < need:
            cap *= 2
        if cap == self._cap:
            return
        n = self._n
        for name in self.names:
            new = np.empty(cap, dtype=self.dtypes[name])
            new[:n] = self._cols[name][:n]
            self._cols[name] = new
        self._cap = cap

    def append(self, row: Mapping[str, float | int | None] | Sequence[float | int | None]) -> None:
        """Append one row, given as a mapping by name or a sequence in column order.

        Missing names in a mapping are stored as NaN (floats) or :data:`MISSING_INT`.
        """
        with self._lock:
            n = self._n
            if n >= self._cap:
                self._grow(n + 1)
            cols = self._cols
            if isinstance(row, Mapping):
                for name in self.names:
                    value = row.get(name)
                    cols[name][n] = missing_value(self.dtypes[name]) if value is None else value
            else:
                for name, value in zip(self.names, row, strict=True):
                    cols[name][n] = missing_value(self.dtypes[name]) if value is None else value
            self._n = n + 1
            self.version += 1
        if self.keep is not None and self._n > 2 * self.keep:
            self._maybe_trim()

    def extend(self, columns: Mapping[str, np.ndarray | Sequence[float | int]]) -> None:
        """Append many rows given column-wise (all columns the same length); a column not
        given is unknown in them (as :meth:`append` stores a missing name)."""
        k = len(columns[self.time])
        arrays = {
            n: np.asarray(columns[n], dtype=self.dtypes[n])
            if n in columns
            else unknown_column(k, self.dtypes[n])
            for n in self.names
        }
        if k == 0:
            return
        with self._lock:
            n = self._n
            self._grow(n + k)
            for name in self.names:
                self._cols[name][n : n + k] = arrays[name]
            self._n = n + k
            self.version += 1
        if self.keep is not None and self._n > 2 * self.keep:
            self._maybe_trim()

    def _maybe_trim(self) -> None:
        """Let go of the oldest rows beyond :attr:`keep` (see :meth:`retain`)."""
        keep = self.keep
        if keep is None:
            return
        with self._lock:
            base, n = self._base, self._n
            cut = base + n - keep
            archive = self.archive
            archived = archive.rows if archive is not None else 0
            if archive is not None and archive.live:
                cut = min(cut, archived)  # the recording will hold them soon: wait for it
            if cut <= base:
                if not keep and not n and self._cap:  # an empty table kept empty: no room
                    self._cols = {name: _empty(self.dtypes[name]) for name in self.names}
                    self._cap = 0
                return
            drop = cut - base
            lost = max(0, cut - max(base, archived))  # rows no archive holds
            if lost and self.spec is not None:
                start = drop - lost
                part = {c: self._cols[c][start:drop] for c in self.spec.needs()}
                self._remember(sm.summarise(self.spec, part))
            # New arrays: a reader may still hold views of the old ones.
            rest = n - drop
            cap = 16 if rest or keep else 0  # nothing to keep (an ended process): no room
            while cap < 2 * max(rest, keep):
                cap *= 2
            cols = {}
            for name in self.names:
                if not cap:  # shared: an empty column is never written (_grow replaces it)
                    cols[name] = _empty(self.dtypes[name])
                    continue
                new = np.empty(cap, dtype=self.dtypes[name])
                new[:rest] = self._cols[name][drop:n]
                cols[name] = new
            self._cols, self._cap = cols, cap
            self._base, self._n = cut, rest
            self.version += 1

    def _remember(self, blocks: sm.Blocks) -> None:
        assert self.spec is not None
        history = sm.concat(self.spec, [self.history or sm.empty(self.spec), blocks])
        while len(history["rows"]) > HISTORY_BLOCKS:
            history = sm.combine(self.spec, history, 2)
        self.history = history

    # ------------------------------------------------------------------ rows

    def _memory(self) -> tuple[int, int, dict[str, np.ndarray]]:
        """``(base, n, views)`` of the rows in memory, consistent."""
        with self._lock:
            n = self._n
            if not n:  # a replay's tables hold no rows: no views to make at every read
                return self._base, 0, {}
            return self._base, n, {name: col[:n] for name, col in self._cols.items()}

    def rows(self, i0: int, i1: int, columns: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Rows ``[i0, i1)`` (clamped to what can be read) of ``columns`` (default all).

        Views of memory when memory holds them all; rows from the archive otherwise.
        """
        names = tuple(columns) if columns is not None else self.names
        base, n, mem = self._memory()
        archive = self.archive
        archived = archive.rows if archive is not None else 0
        total = max(archived, base + n)
        i0, i1 = max(i0, 0 if archive is not None else base), min(i1, total)
        parts: list[dict[str, np.ndarray]] = []
        if archive is not None:
            a1 = min(i1, archived, base if n else archived)
            if a1 > i0:
                parts.append(archive.read(i0, a1, names))
        m0, m1 = max(i0, base), min(i1, base + n)
        if m1 > m0:
            parts.append({c: mem[c][m0 - base : m1 - base] for c in names})
        if not parts:
            return {c: np.empty(0, dtype=self.dtypes[c]) for c in names}
        if len(parts) == 1:
            return parts[0]
        return {c: np.concatenate([p[c] for p in parts]) for c in names}

    def snapshot(self) -> dict[str, np.ndarray]:
        """Every row that can be read (views when memory holds them all).

        A table backed by a long recording reads all of it: window queries use
        :meth:`between`, :meth:`minmax` and the like instead.
        """
        return self.rows(self.first, len(self))

    def search(self, t: int, side: Side = "left") -> int:
        """The row number where ``t`` would go (``np.searchsorted`` over all rows)."""
        base, n, mem = self._memory()
        if n:
            first = mem[self.time][0]
            if t > first or (side == "right" and t >= first):
                return base + int(np.searchsorted(mem[self.time], t, side))
        if self.archive is not None:
            found = self.archive.search(t, side)
            return min(found, base) if n else found
        return base

    def between(
        self, t0: int, t1: int, pad: int = 0, columns: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Rows with ``t0 <= time <= t1``, plus ``pad`` rows either side."""
        i0 = self.search(t0, "left") - pad
        i1 = self.search(t1, "right") + pad
        return self.rows(i0, i1, columns)

    def batches(
        self, i0: int | None = None, i1: int | None = None, columns: Sequence[str] | None = None
    ) -> Iterator[dict[str, np.ndarray]]:
        """Rows ``[i0, i1)`` in pieces (an archive's chunks, then memory): for streaming."""
        lo = self.first if i0 is None else max(i0, self.first)
        hi = len(self) if i1 is None else min(i1, len(self))
        base = self._base if self._n else len(self)
        if self.archive is not None:
            for a, b in self.archive.ranges(lo, min(hi, base, self.archive.rows)):
                yield self.rows(a, b, columns)
        start = max(lo, base)
        step = 65_536
        for a in range(start, hi, step):
            yield self.rows(a, min(hi, a + step), columns)

    def last(self) -> dict[str, float | int] | None:
        """The newest row as Python values, or None when empty."""
        with self._lock:
            n = self._n
            if n:
                return {name: col[n - 1].item() for name, col in self._cols.items()}
        total = len(self)
        if total == 0 or self.archive is None:
            return None
        return _row(self.rows(total - 1, total))

    def at(self, t: int) -> dict[str, float | int] | None:
        """The newest row at or before ``t`` (step-hold), or None."""
        i = self.search(t, "right") - 1
        if i < self.first:
            return None
        return _row(self.rows(i, i + 1))

    def value_at(self, column: str, t: int) -> float | None:
        """The step-hold value of ``column`` at ``t``: None before the first row or unknown."""
        i = self.search(t, "right") - 1
        if i < self.first:
            return None
        v = self.rows(i, i + 1, (column,))[column]
        if len(v) == 0 or (v.dtype.kind == "i" and v[0] == MISSING_INT):
            return None
        out = float(v[0])
        return None if np.isnan(out) else out

    def group_at(self, t: int) -> dict[str, np.ndarray] | None:
        """Every row stamped with the newest time at or before ``t`` (one snapshot of a
        list, such as NVML's processes), or None."""
        i = self.search(t, "right")
        if i - 1 < self.first:
            return None
        at = int(self.rows(i - 1, i, (self.time,))[self.time][0])
        return self.rows(self.search(at, "left"), i)

    def span(self) -> tuple[int, int] | None:
        """(first, last) time, or None when empty (rows let go count: their summaries)."""
        _, n, mem = self._memory()
        times = self.archive.times() if self.archive is not None else None
        first = last = None
        if times is not None:
            first, last = times
        history = self.history
        if history is not None and len(history["rows"]):
            h0, h1 = int(history["t_first"][0]), int(history["t_last"][-1])
            first = h0 if first is None else min(first, h0)
            last = h1 if last is None else max(last, h1)
        if n:
            m0, m1 = int(mem[self.time][0]), int(mem[self.time][n - 1])
            first = m0 if first is None else min(first, m0)
            last = m1 if last is None else max(last, m1)
        return None if first is None or last is None else (first, last)

    # ------------------------------------------------------------------ windows

    def plan(self, t0: int, t1: int, width: int, lead: int = 0) -> WindowPlan:
        """Which rows of ``[t0, t1 + lead]`` to read exactly, which to take as summaries.

        Memory rows are always read; archived ones while the window holds at most
        :data:`EXACT_ROWS` (or :data:`EXACT_PER_COLUMN` per column) of them. Rows let go
        without an archive are only summaries.
        """
        base, n, mem = self._memory()
        archive = self.archive
        archived = archive.rows if archive is not None else 0
        mem0 = base if n else max(archived, base)
        first_mem_t = int(mem[self.time][0]) if n else None
        end = t1 + lead if first_mem_t is None else min(t1 + lead, first_mem_t)
        parts: list[sm.Blocks] = []
        if first_mem_t is not None:
            hold = first_mem_t - 1  # the rows in memory say what held from then on
        else:  # no value is held past the newest row
            times = archive.times() if archive is not None else None
            hold = min(t1 + lead, times[1]) if times is not None else t1 + lead
        budget = max(EXACT_ROWS, EXACT_PER_COLUMN * width)
        blocks = None
        if archive is not None and self.spec is not None and archive.count(t0, end)[0] > budget:
            # Too many rows to read: the archive's summaries answer for them (the index
            # says so without reading a row).
            blocks = archive.summary(t0, end, width)
        if blocks is not None:
            parts.append(blocks)
            i0 = mem0
            after = first_mem_t is not None and t1 + lead >= first_mem_t
            i1 = self.search(t1 + lead, "right") if after else mem0
        else:
            i0 = self.search(t0, "left")
            i1 = self.search(t1 + lead, "right")
        history = self.history
        if (
            history is not None
            and len(history["rows"])
            and self.spec is not None
            and t0 <= int(history["t_last"][-1])
        ):
            parts.append(sm.overlapping(history, t0, end))
        blocks = sm.concat(self.spec, parts) if parts and self.spec is not None else None
        if blocks is not None and not len(blocks["rows"]):
            blocks = None
        return WindowPlan(i0, i1, blocks, hold)

    def minmax(
        self,
        column: str,
        t0: int,
        t1: int,
        width: int,
        where: tuple[str, Iterable[int]] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per-column min and max of a step-hold column over ``[t0, t1]`` (never averaged).

        Args:
            column: The column to draw.
            t0: Window start.
            t1: Window end.
            width: Output columns.
            where: ``(column, values)``: only rows whose ``column`` is one of ``values``.
        """
        lo = np.full(width, np.nan)
        hi = np.full(width, np.nan)
        if width <= 0 or t1 <= t0 or len(self) == 0:
            return lo, hi
        plan = self.plan(t0, t1, width)
        need = [self.time, column] + ([where[0]] if where and where[0] != column else [])
        if plan.i1 > plan.i0 or plan.blocks is None:
            cols = self.rows(plan.i0 - 1, plan.i1 + 1, need)
            if where is not None:
                keep = np.isin(cols[where[0]], list(where[1]))
                if not keep.all():
                    cols = {c: v[keep] for c, v in cols.items()}
            lo, hi = _minmax(cols[self.time], cols[column], t0, t1, width)
        if plan.blocks is not None:
            blocks = _filter_blocks(plan.blocks, where)
            blo, bhi = sm.block_minmax(blocks, column, t0, t1, width, plan.hold_until)
            lo, hi = np.fmin(lo, blo), np.fmax(hi, bhi)
        return lo, hi

    def segment_max(
        self,
        column: str,
        t0: int,
        t1: int,
        width: int,
        lead: int = 0,
        where: tuple[str, Iterable[int]] | None = None,
    ) -> np.ndarray:
        """Per-column maximum of values held over ``[start, time]`` segments (peaks).

        Args:
            column: The value column.
            t0: Window start.
            t1: Window end.
            width: Output columns.
            lead: How far past ``t1`` a segment that began in the window may end.
            where: Only rows whose ``where[0]`` is one of ``where[1]``.
        """
        out = np.full(width, np.nan)
        spec = self.spec
        if width <= 0 or t1 <= t0 or len(self) == 0 or spec is None or spec.start is None:
            return out
        plan = self.plan(t0, t1, width, lead)
        if plan.i1 > plan.i0 or plan.blocks is None:
            need = [spec.start, self.time, column] + ([where[0]] if where else [])
            cols = self.rows(plan.i0, plan.i1, need)
            # Unknown values stay in: _segment_max skips them without a mask of every row.
            if where is not None:
                keep = np.isin(cols[where[0]], list(where[1]))
                if not keep.all():
                    cols = {c: v[keep] for c, v in cols.items()}
            out = _segment_max(cols[spec.start], cols[self.time], cols[column], t0, t1, width)
        if plan.blocks is not None:
            blocks = _filter_blocks(plan.blocks, where)
            out = np.fmax(out, sm.block_segment_max(blocks, column, t0, t1, width))
        return out

    def max_between(
        self, column: str, t0: int | None = None, t1: int | None = None
    ) -> tuple[int, float] | None:
        """``(time, value)`` of the largest known value of ``column`` in ``[t0, t1]`` (the
        first time it was reached), or None. Archived chunks answer from their index."""
        lo = self.first if t0 is None else self.search(t0, "left")
        hi = len(self) if t1 is None else self.search(t1, "right")
        base, n, _ = self._memory()
        archive = self.archive
        best: tuple[int, float] | None = None
        mem0 = base if n else len(self)
        if archive is not None:
            a1 = min(hi, mem0, archive.rows)
            if a1 > lo:
                stored = archive.max_rows(column, lo, a1)
                if stored is not None:
                    best = (stored[0], float(stored[1]))
        m0 = max(lo, mem0)
        if hi > m0:
            cols = self.rows(m0, hi, (self.time, column))
            found = _argmax(cols[self.time], cols[column])
            if found is not None and (best is None or found[1] > best[1]):
                best = found
        history = self.history
        if self.spec is not None and history is not None and column in self.spec.minmax:
            lo_t = -(2**62) if t0 is None else t0
            h = sm.overlapping(history, lo_t, 2**62 if t1 is None else t1)
            found = _argmax(h["t_first"], h[f"{column}_max"])
            if found is not None and (best is None or found[1] > best[1]):
                best = found
        return best

    def shift(
        self, shift: int, maps: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
    ) -> None:
        """Move every time by ``shift`` and renumber values (merging recordings).

        Args:
            shift: Nanoseconds added to every known time (``t``, ``t0``, ``t1``).
            maps: Column -> ``(old values, new values)``, applied to rows in memory; an
                archive applies its own (see ``gpuwatch.store.archive``).
        """
        _, _, cols = self._memory()
        for name, col in cols.items():
            if name in TIME_COLUMNS and shift:
                col[col != MISSING_INT] += shift
            elif maps and name in maps:
                old, new = maps[name]
                col[:] = remap(col, old, new)
        if self.history is not None and shift:
            for name in ("t_first", "t_last", "start", "w_t0", "w_t1"):
                if name in self.history:
                    self.history[name] = self.history[name] + shift
        self.version += 1


TIME_COLUMNS = frozenset(("t", "t0", "t1"))
"""The time columns of every table kind (a merge shifts them)."""

_EMPTY: dict[np.dtype, np.ndarray] = {}
_LAYOUTS: dict[tuple[tuple[str, str], ...], tuple[tuple[str, ...], dict[str, np.dtype]]] = {}


def _layout(
    columns: tuple[tuple[str, str], ...],
) -> tuple[tuple[str, ...], dict[str, np.dtype]]:
    """Column names and dtypes of a layout, made once for every table of that layout (a
    replay of thousands of processes has four tables each)."""
    known = _LAYOUTS.get(columns)
    if known is None:
        names = tuple(name for name, _ in columns)
        dtypes = {name: np.dtype(dtype) for name, dtype in columns}
        known = _LAYOUTS.setdefault(columns, (names, dtypes))
    return known


def _empty(dtype: np.dtype) -> np.ndarray:
    """A read-only column of no rows, one per dtype for every table that holds none."""
    col = _EMPTY.get(dtype)
    if col is None:
        col = np.empty(0, dtype=dtype)
        col.flags.writeable = False
        col = _EMPTY.setdefault(dtype, col)
    return col


def remap(col: np.ndarray, old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``col`` with each value found in ``old`` replaced by the matching ``new`` one."""
    out = col.copy()
    if len(old) == 0:
        return out
    order = np.argsort(old)
    o, nw = old[order], new[order]
    i = np.clip(np.searchsorted(o, col), 0, len(o) - 1)
    hit = o[i] == col
    out[hit] = nw[i[hit]].astype(col.dtype)
    return out


def _filter_blocks(blocks: sm.Blocks, where: tuple[str, Iterable[int]] | None) -> sm.Blocks:
    """Blocks whose rows all had an allowed ``where`` value (a block mixing an allowed
    value with another is left out: its extremes may be the other's)."""
    if where is None:
        return blocks
    column, values = where
    allowed = np.array(sorted(set(values)), dtype=np.int64)
    lo, hi = blocks[f"{column}_min"], blocks[f"{column}_max"]
    keep = (lo == hi) & np.isin(lo, allowed)
    return sm.select(blocks, keep)


def _argmax(t: np.ndarray, v: np.ndarray) -> tuple[int, float] | None:
    """(time, value) of the first largest known value, or None."""
    if len(v) == 0:
        return None
    if v.dtype.kind == "f":
        if np.isnan(v).all():
            return None
        i = int(np.nanargmax(v))
    else:
        known = v != MISSING_INT
        if not known.any():
            return None
        i = int(np.argmax(np.where(known, v, MISSING_INT)))
    return int(t[i]), float(v[i])


def _row(cols: dict[str, np.ndarray]) -> dict[str, float | int] | None:
    if not len(next(iter(cols.values()))):
        return None
    return {name: col[0].item() for name, col in cols.items()}


def missing_value(dtype: np.dtype) -> float | int:
    """What an unknown value of a ``dtype`` column is: NaN, :data:`MISSING_INT` in an int64
    column, else 0 (the narrow columns, a name id, a depth, a flag, hold no marker: the
    missing marker does not fit them)."""
    if dtype.kind == "f":
        return np.nan
    return MISSING_INT if dtype == np.int64 else 0


def unknown_column(n: int, dtype: np.dtype) -> np.ndarray:
    """``n`` unknown values of ``dtype`` (a column a file predates, a damaged chunk)."""
    return np.full(n, missing_value(dtype), dtype=dtype)
