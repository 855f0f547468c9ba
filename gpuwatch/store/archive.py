"""A recording read on demand: the archive behind a session table (see ``Table.archive``).

:class:`SeriesArchive` answers a table's questions about one stored series from the chunk
index kept in memory (row offsets, time bounds, each chunk's maximum and summary) and from
the chunks themselves, decoded when a window needs their rows and kept in one
process-wide cache of bounded size (:data:`CACHE_BYTES`). A replay holds no rows of its
own; a live session being recorded lets go of the rows its recording holds.
:class:`ChunkSource` is the file: its own read-only connection, so the archive outlives
whoever opened the recording.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..session import summary as sm
from ..session.table import MISSING_INT, TIME_COLUMNS, Side, remap, unknown_column
from . import _codec, _untrusted
from ._schema import SERIES

CACHE_BYTES = 96 << 20
"""Decoded chunks and block summaries kept, over every archive of the process."""

_inflated = [0]  # chunks opened for reading by this process, every archive together


def chunks_read() -> int:
    """Chunks this process has opened for reading so far (a progress line shows it)."""
    return _inflated[0]


MEMO = 256
"""Recent answers an archive keeps (searches and single rows): one redraw asks the same
ones several times (the header, the legend and the breakdown bar at one cursor)."""

SYNC_SUMMARIES = 8
"""Chunks without a stored summary that a query summarises itself (a file written before
summaries existed); beyond, it draws what is summarised and the loader does the rest."""


class _Cache:
    """A least-recently-used cache of decoded pieces, bounded in bytes, for all threads."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.size = 0
        self._items: OrderedDict[tuple[Any, ...], tuple[int, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...]) -> Any:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[1]

    def put(self, key: tuple[Any, ...], value: Any, size: int) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.size -= old[0]
            self._items[key] = (size, value)
            self.size += size
            while self.size > self.budget and len(self._items) > 1:
                _, (s, _) = self._items.popitem(last=False)
                self.size -= s

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.size = 0

    def drop(self, keys: list[tuple[Any, ...]]) -> None:
        """Let go of ``keys`` (those held)."""
        with self._lock:
            for key in keys:
                old = self._items.pop(key, None)
                if old is not None:
                    self.size -= old[0]


CACHE = _Cache(CACHE_BYTES)


class ChunkSource:
    """Chunks and summaries of one recording, read through a connection of its own.

    Args:
        path: The recording.
        on_error: Called once with a one-line message when a read fails (a damaged chunk,
            a file gone); the failing read returns nothing instead of raising.
    """

    def __init__(self, path: str | os.PathLike[str], on_error: Callable[[str], None] | None = None):
        self.path = Path(path)
        self.on_error = on_error
        self.error: str | None = None
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self.key = id(self)
        self.decoded = 0  # chunks decoded (what a view cost: tests and benchmarks read it)
        self.rows_decoded: Counter[str] = Counter()  # rows of blocks inflated, by series kind
        self.summaries_read = 0  # chunks' block summaries read

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self._db = _untrusted.connect(self.path)
        return self._db

    def query(self, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """Rows of one statement; [] (and :attr:`error` set, once said) when it fails."""
        with self._lock:
            try:
                return self._conn().execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                if _untrusted.timed_out(exc):
                    self.failed(
                        f"{self.path} is damaged or hostile (a read took over "
                        f"{_untrusted.QUERY_SECONDS:.0f} s)"
                    )
                else:
                    self.failed(f"{self.path} cannot be read ({exc})")
                return []

    def failed(self, message: str) -> None:
        if self.error is None:
            self.error = message
            if self.on_error is not None:
                self.on_error(message)

    def close(self) -> None:
        with self._lock:
            self.close_unlocked()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No read while the file is opened again (its writer follows a rename): the
        connection is closed, and the next read after this opens :attr:`path`."""
        with self._lock:
            self.close_unlocked()
            yield

    def close_unlocked(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def __del__(self) -> None:  # pragma: no cover - interpreter teardown
        try:
            self.close()
        except Exception:
            pass


_NO_INTS = np.zeros(0, np.int64)
_NO_FLOATS = np.zeros(0, np.float64)
_NO_BOOLS = np.zeros(0, dtype=bool)
for _empty in (_NO_INTS, _NO_FLOATS, _NO_BOOLS):  # shared by every archive: read-only
    _empty.flags.writeable = False

Recall = Callable[[], "tuple[np.ndarray, sm.Blocks | None, np.ndarray | None] | None"]
"""Gives a sleeping archive its index back: ``(index, own summaries, their row0)`` as
:meth:`SeriesArchive.set_index` takes them, or None (it reads the file)."""

_LAYOUTS: dict[
    tuple[tuple[str, np.dtype], ...], tuple[list[tuple[str, np.dtype]], dict[str, int]]
] = {}


def _stored_layout(
    stored: tuple[tuple[str, np.dtype], ...],
) -> tuple[list[tuple[str, np.dtype]], dict[str, int]]:
    """A stored layout and each column's position, made once for every series of that
    layout (a recording of thousands of processes has four series each): read-only."""
    known = _LAYOUTS.get(stored)
    if known is None:
        positions = {name: i for i, (name, _) in enumerate(stored)}
        known = _LAYOUTS.setdefault(stored, (list(stored), positions))
    return known


def _read_only(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


# No chunk's own summary yet, shared like _NO_INTS by every archive that has none (each
# of the four series of thousands of short processes): replaced as chunks come.
_EMPTY_STATS: dict[sm.Spec, sm.Blocks] = {}


def _empty_stats(spec: sm.Spec | None) -> sm.Blocks | None:
    """No chunk's own summary yet (shared, like :data:`_NO_INTS`), or None without a spec."""
    if spec is None:
        return None
    blocks = _EMPTY_STATS.get(spec)
    if blocks is None:
        made = {name: _read_only(col) for name, col in sm.empty(spec).items()}
        blocks = _EMPTY_STATS.setdefault(spec, made)
    return blocks


class SeriesArchive:
    """Rows ``[0, rows)`` of one stored series, read on demand (a table's archive).

    Args:
        source: The file.
        sid: The series' id in the file (None until the writer has created it).
        kind: The series kind (what its summaries keep).
        stored: The column layout the file has.
        dtypes: The table's columns and dtypes (missing ones read as unknown).
        live: The file is being written: more rows will come.
    """

    # A recording of a sweep has thousands (four a process): no dict of attributes each.
    __slots__ = (
        "__weakref__",
        "_asleep",
        "_gen",
        "_lock",
        "_made",
        "_memo",
        "_pos",
        "_recall_index",
        "dtypes",
        "have",
        "kind",
        "live",
        "maps",
        "n",
        "primary",
        "row0",
        "rows",
        "shift",
        "sid",
        "source",
        "spec",
        "stats",
        "stored",
        "stored_summaries",
        "t_first",
        "t_last",
        "t_vmax",
        "vmax",
    )  # fmt: skip

    def __init__(
        self,
        source: ChunkSource,
        sid: int | None,
        kind: str,
        stored: Sequence[tuple[str, np.dtype]],
        dtypes: dict[str, np.dtype],
        *,
        live: bool = False,
    ) -> None:
        self.source = source
        self.sid = sid
        self.kind = kind
        self.spec = sm.SPECS.get(kind)
        self.primary = SERIES[kind][1]
        self.stored, self._pos = _stored_layout(tuple((name, np.dtype(dt)) for name, dt in stored))
        self.dtypes = dtypes
        self.live = live
        self.shift = 0
        self.maps: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.rows = 0
        self._lock = threading.Lock()
        z = _NO_INTS  # replaced, never written, as the index grows
        self.row0, self.n, self.t_first, self.t_last = z, z, z, z
        self.vmax, self.t_vmax = _NO_FLOATS, z
        # Each chunk's own summary, aligned with the index, and which of them are known.
        self.stats: sm.Blocks | None = _empty_stats(self.spec)
        self.have = _NO_BOOLS
        self.stored_summaries = False  # the file has block summaries for its chunks
        # Block summaries made here, of a file without them (about 1% of its rows' size).
        self._made: dict[int, sm.Blocks] = {}
        # Recent searches and single rows, each keyed with the index's generation: an
        # answer found before the index changed is never given after.
        self._memo: dict[tuple[Any, ...], Any] = {}
        self._gen = 0
        self._asleep: tuple[int, int] | None = None  # raw (first, last) while asleep
        self._recall_index: Recall | None = None  # where a woken index comes from

    @classmethod
    def dormant(
        cls,
        source: ChunkSource,
        sid: int,
        kind: str,
        stored: Sequence[tuple[str, np.dtype]],
        dtypes: dict[str, np.dtype],
        rows: int,
        span: tuple[int, int],
        *,
        live: bool = True,
        recall: Recall | None = None,
    ) -> SeriesArchive:
        """The archive of a series the file holds whole (a settled process's, read again):
        asleep, its index read the first time a view needs it.

        Args:
            live: The file is being written (see the class).
            recall: Gives the index and the chunks' own summaries when woken (a replay's
                loader keeps every series' index packed); None: read from the file.
        """
        archive = cls(source, sid, kind, stored, dtypes, live=live)
        archive.rows = rows
        archive.stats = None
        archive._asleep = span
        archive._recall_index = recall
        # Said by the file's meta: a series asleep is not summarised in the background.
        archive.stored_summaries = recall is not None
        return archive

    # ------------------------------------------------------------------ sleep

    @property
    def asleep(self) -> bool:
        """The index is not in memory (see :meth:`sleep`)."""
        return self._asleep is not None

    def sleep(self) -> None:
        """Let go of the chunk index, summaries and decoded chunks (a series that will not
        grow: an ended process's), read back from the file the first time a view needs
        them."""
        with self._lock:
            if self.sid is None or self._asleep is not None or not len(self.t_first):
                return
            # Its decoded chunks go too: what reads a series and lets it sleep (info, a
            # process at a time) is done with them, and thousands would fill the cache.
            src = self.source.key
            chunks = list(zip(self.row0.tolist(), self.n.tolist(), strict=True))
            CACHE.drop([(src, self.sid, r0, n) for r0, n in chunks])
            CACHE.drop([("blocks", src, self.sid, r0, n) for r0, n in chunks])
            self._asleep = (int(self.t_first[0]), int(self.t_last[-1]))
            z = _NO_INTS
            self.row0, self.n, self.t_first, self.t_last = z, z, z, z
            self.vmax, self.t_vmax = _NO_FLOATS, z
            self.stats, self.have = None, _NO_BOOLS
            self._memo, self._made = {}, {}
            self._gen += 1

    def _wake(self) -> None:
        """Read the index and the chunks' own summaries back (see :meth:`sleep`)."""
        if self._asleep is None:
            return
        recall = self._recall_index
        got = recall() if recall is not None else None
        index, own, row0 = got if got is not None else self._read_index()
        with self._lock:
            if self._asleep is None:  # another thread woke it meanwhile
                return
            self._asleep = None
            self.row0 = _NO_INTS  # set_index keeps nothing of an index it does not have
            self.stats = _empty_stats(self.spec)
        self.set_index(index, own, row0, stored_summaries=own is not None)

    def _read_index(self) -> tuple[np.ndarray, sm.Blocks | None, np.ndarray | None]:
        """The series' chunk index and its chunks' own summaries, from the file."""
        rows = self.source.query(
            "SELECT row0, n, t_first, t_last, ifnull(vmax, ?), ifnull(t_vmax, ?) FROM chunks"
            " WHERE series = ? ORDER BY row0",
            (MISSING_INT, MISSING_INT, self.sid),
        )
        index = np.array(rows, dtype=np.int64).reshape(-1, 6)
        own = row0 = None
        if self.spec is not None:
            stored = self.source.query(
                "SELECT row0, chunk FROM summaries WHERE series = ? ORDER BY row0", (self.sid,)
            )
            if stored and all(isinstance(c, bytes) for _, c in stored):
                try:
                    own = sm.from_bytes(self.spec, b"".join(c for _, c in stored))
                    row0 = np.array([r for r, _ in stored], dtype=np.int64)
                except ValueError:
                    own = None
        return index, own, row0

    # ------------------------------------------------------------------ the index

    def set_index(
        self,
        index: np.ndarray,
        stats: sm.Blocks | None = None,
        stats_row0: np.ndarray | None = None,
        stored_summaries: bool = False,
    ) -> None:
        """Replace the chunk index.

        Args:
            index: int64 rows of ``(row0, n, t_first, t_last, vmax, t_vmax)`` (``vmax``
                :data:`MISSING_INT` where unknown), ordered by ``row0``.
            stats: The chunks' own summaries the file has, one per ``stats_row0``.
            stats_row0: The first row of the chunk each of ``stats`` summarises.
            stored_summaries: The file has block summaries of its chunks too.
        """
        vmax = index[:, 4].astype(np.float64)
        vmax[index[:, 4] == MISSING_INT] = np.nan
        row0 = index[:, 0].copy()
        new, have = self._aligned(row0, stats, stats_row0)
        with self._lock:
            if self.spec is not None and len(self.row0) and self.have.any():
                # Keep what was summarised already (a followed file's chunks, by row0).
                old = np.searchsorted(self.row0, row0)
                old = np.minimum(old, len(self.row0) - 1)
                same = (self.row0[old] == row0) & self.have[old] & ~have
                same &= self.n[old] == index[:, 1]
                if same.any():
                    assert self.stats is not None
                    for name in new:
                        new[name][same] = self.stats[name][old[same]]
                    have = have | same
            self.row0, self.n = row0, index[:, 1].copy()
            self.t_first, self.t_last = index[:, 2].copy(), index[:, 3].copy()
            self.vmax, self.t_vmax = vmax, index[:, 5].copy()
            self.stats, self.have = new, have
            self.stored_summaries = stored_summaries
            self.rows = int(index[-1, 0] + index[-1, 1]) if len(index) else 0
            self._asleep = None  # the index given is the one now
            self._gen += 1

    def _aligned(
        self, row0: np.ndarray, stats: sm.Blocks | None, stats_row0: np.ndarray | None
    ) -> tuple[sm.Blocks, np.ndarray]:
        """``stats`` placed at the index rows of their chunks, and which are known."""
        have = np.zeros(len(row0), dtype=bool)
        if self.spec is None:
            return {}, have
        out = {name: np.zeros(len(row0), np.int64) for name in self.spec.columns()}
        if stats is None or stats_row0 is None or not len(stats_row0) or not len(row0):
            return out, have
        at = np.clip(np.searchsorted(row0, stats_row0), 0, len(row0) - 1)
        hit = row0[at] == stats_row0
        for name in out:
            out[name][at[hit]] = stats[name][hit]
        have[at[hit]] = True
        return out, have

    def add(self, entries: list[tuple[tuple[int, ...], sm.Blocks | None]]) -> None:
        """Chunks the writer sealed (in row order, from :attr:`rows` on)."""
        if not entries:
            return
        index = np.array([e for e, _ in entries], dtype=np.int64).reshape(-1, 6)
        vmax = index[:, 4].astype(np.float64)
        vmax[index[:, 4] == MISSING_INT] = np.nan
        own = [s for _, s in entries]
        self._wake()
        with self._lock:
            self.row0 = np.concatenate([self.row0, index[:, 0]])
            self.n = np.concatenate([self.n, index[:, 1]])
            self.t_first = np.concatenate([self.t_first, index[:, 2]])
            self.t_last = np.concatenate([self.t_last, index[:, 3]])
            self.vmax = np.concatenate([self.vmax, vmax])
            self.t_vmax = np.concatenate([self.t_vmax, index[:, 5]])
            if self.spec is not None and self.stats is not None:
                known = [s if s is not None else sm.empty(self.spec) for s in own]
                self.stats = sm.concat(self.spec, [self.stats, *known])
                self.have = np.concatenate([self.have, [s is not None for s in own]])
            self.stored_summaries = True
            self.rows = int(index[-1, 0] + index[-1, 1])
            self._gen += 1

    def transform(self, shift: int, maps: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        """Add ``shift`` to every time read and renumber mapped columns (a merge)."""
        self.shift += shift
        for name, (old, new) in maps.items():
            if name in self.maps:  # compose: old -> previous new -> this new
                prev_old, prev_new = self.maps[name]
                new = remap(prev_new, old, new)
                old = prev_old
            self.maps[name] = (old, new)

    def _index(self) -> tuple[np.ndarray, ...]:
        self._wake()
        with self._lock:
            return self.row0, self.n, self.t_first, self.t_last

    def _recall(self, key: tuple[Any, ...]) -> Any:
        return self._memo.get((self._gen, *key))

    def _keep(self, gen: int, key: tuple[Any, ...], value: Any) -> None:
        if len(self._memo) >= MEMO:  # a new cursor: the old answers go at once
            self._memo.clear()
        self._memo[(gen, *key)] = value

    def times(self) -> tuple[int, int] | None:
        asleep = self._asleep
        if asleep is not None:  # known without waking: every span() asks
            return asleep[0] + self.shift, asleep[1] + self.shift
        _, _, first, last = self._index()
        if not len(first):
            return None
        return int(first[0]) + self.shift, int(last[-1]) + self.shift

    def count(self, t0: int, t1: int) -> tuple[int, int]:
        _, n, first, last = self._index()
        a, b = t0 - self.shift, t1 - self.shift
        inside = (first >= a) & (last <= b)
        meets = (last >= a) & (first <= b)
        return int(n[inside].sum()), int(n[meets].sum())

    def ranges(self, i0: int, i1: int) -> list[tuple[int, int]]:
        row0, n, _, _ = self._index()
        out = []
        k = max(0, int(np.searchsorted(row0, i0, "right")) - 1)
        while k < len(row0) and i0 < i1:
            end = min(i1, int(row0[k] + n[k]))
            if end > i0:
                out.append((i0, end))
                i0 = end
            k += 1
        return out

    # ------------------------------------------------------------------ rows

    def _upto(self, columns: Sequence[str]) -> int:
        pos = [self._pos[c] for c in columns if c in self._pos]
        return max(pos) + 1 if pos else 1

    def _opened(self, k: int) -> tuple[tuple[Any, ...], int, int, int, Any]:
        """``(cache key, row0, n, offset of row0 in the stored chunk, Inflater)`` of chunk
        ``k``; the inflater is a dict of made-up columns for an unreadable chunk."""
        row0, n, _, _ = self._index()
        r0, cn = int(row0[k]), int(n[k])
        key = (self.source.key, self.sid, r0, cn)
        cached = CACHE.get(key)
        if cached is None:
            cached = self._open_chunk(k, r0, cn)
        return key, r0, cn, cached[0], cached[1]

    def _damaged(self, key: tuple[Any, ...], k: int, exc: Exception) -> dict[str, np.ndarray]:
        """Say chunk ``k`` is damaged once; its rows read as unknown from now on."""
        _, n, first, last = self._index()
        self.source.failed(f"{self.source.path} is damaged ({exc})")
        cols = self._unknown(int(n[k]), int(first[k]), int(last[k]), len(self.stored))
        CACHE.put(key, (0, cols), sum(c.nbytes for c in cols.values()) + 200)
        return cols

    def _chunk(
        self, k: int, upto: int, lo: int = 0, hi: int | None = None
    ) -> tuple[int, int, dict[str, np.ndarray]]:
        """``(row0, n, raw stored columns)`` of rows ``[lo, hi)`` of chunk ``k`` (all of
        it by default; at least its first ``upto`` columns).

        Read-only arrays, shared through the cache. Only the blocks the rows lie in are
        inflated, and only as far as the columns asked for (a search: the time column),
        on from there when more are (see :class:`~gpuwatch.store._codec.Inflater`).
        """
        key, r0, cn, a, inflater = self._opened(k)
        hi = cn if hi is None else hi
        if isinstance(inflater, dict):  # unreadable: made up once
            return r0, cn, {name: col[lo:hi] for name, col in inflater.items()}
        before = inflater.inflated, inflater.nbytes
        try:
            got = inflater.columns(upto, a + lo, a + hi)
        except _codec.ChunkError as exc:
            cols = self._damaged(key, k, exc)
            return r0, cn, {name: col[lo:hi] for name, col in cols.items()}
        for col in got.values():
            col.flags.writeable = False
        self._inflated(key, a, inflater, before)
        return r0, cn, got

    def _inflated(
        self, key: tuple[Any, ...], a: int, inflater: Any, before: tuple[int, int]
    ) -> None:
        """Count what a read inflated; the chunk goes back in the cache at its new size."""
        rows, size = before
        if inflater.inflated != rows or inflater.nbytes != size:
            # A rare lost update between threads only blurs a statistic.
            self.source.rows_decoded[self.kind] += inflater.inflated - rows
            CACHE.put(key, (a, inflater), inflater.nbytes + 200)

    def _open_chunk(self, k: int, r0: int, cn: int) -> tuple[int, Any]:
        """``(offset of row r0 in it, Inflater)`` of the stored chunk holding chunk ``k``."""
        _, _, first, last = self._index()
        rows = self.source.query(
            "SELECT row0, n, codec, data FROM chunks WHERE series = ? AND row0 <= ?"
            " ORDER BY row0 DESC LIMIT 1",
            (self.sid, r0),
        )
        if rows and rows[0][0] <= r0 and rows[0][0] + rows[0][1] >= r0 + cn:
            f0, fn, codec, blob = rows[0]
            self.source.decoded += 1
            _inflated[0] += 1  # a rare lost update between threads only blurs a progress line
            try:
                return r0 - f0, _codec.Inflater(blob, fn, self.stored, codec)
            except _codec.ChunkError as exc:
                self.source.failed(f"{self.source.path} is damaged ({exc})")
        # Unreadable (damaged, or gone): unknown values, times spread over its bounds.
        return 0, self._unknown(cn, int(first[k]), int(last[k]), len(self.stored))

    def _unknown(self, n: int, t0: int, t1: int, upto: int) -> dict[str, np.ndarray]:
        out = {}
        for name, dt in self.stored[:upto]:
            if name == self.stored[0][0]:
                out[name] = np.linspace(t0, t1, n).astype(np.int64)
            else:
                out[name] = unknown_column(n, dt)
        return out

    def _raw(self, i0: int, i1: int, columns: Sequence[str]) -> dict[str, np.ndarray]:
        """Rows ``[i0, i1)`` of the stored ``columns`` it has, untransformed."""
        if i1 == i0 + 1:  # a figure at a cursor: every column of the row, kept a while
            gen = self._gen
            row = self._recall(("row", i0))
            if row is None:
                # Copies: a view would keep its whole block alive after the cache let go.
                got = self._rows(i0, i1, [name for name, _ in self.stored])
                row = {c: v.copy() for c, v in got.items()}
                for v in row.values():
                    v.flags.writeable = False
                self._keep(gen, ("row", i0), row)
            return {c: row[c] for c in columns if c in row}
        return self._rows(i0, i1, columns)

    def _rows(self, i0: int, i1: int, columns: Sequence[str]) -> dict[str, np.ndarray]:
        row0, n, _, _ = self._index()
        upto = self._upto(columns)
        have = [c for c in columns if c in self._pos]
        parts: list[dict[str, np.ndarray]] = []
        k = max(0, int(np.searchsorted(row0, i0, "right")) - 1)
        r = i0
        while r < i1 and k < len(row0):
            c0, cn = int(row0[k]), int(n[k])
            a, b = max(r, c0) - c0, min(i1, c0 + cn) - c0
            if b > a:
                _, _, cols = self._chunk(k, upto, a, b)
                parts.append({c: cols[c] for c in have})
                r = c0 + b
            k += 1
        if not parts:
            return {c: np.empty(0, dtype=self.stored[self._pos[c]][1]) for c in have}
        if len(parts) == 1:
            return parts[0]
        return {c: np.concatenate([p[c] for p in parts]) for c in have}

    def read(self, i0: int, i1: int, columns: Sequence[str]) -> dict[str, np.ndarray]:
        raw = self._raw(i0, i1, columns)
        count = len(next(iter(raw.values()))) if raw else max(0, i1 - i0)
        out = {}
        for name in columns:
            dtype = self.dtypes[name]
            col = raw.get(name)
            if col is None:  # a column this file predates: unknown
                col = unknown_column(count, dtype)
            elif col.dtype != dtype:
                col = col.astype(dtype)
            if name in TIME_COLUMNS and self.shift:
                col = np.where(col != MISSING_INT, col + self.shift, col)
            elif name in self.maps:
                col = remap(col, *self.maps[name])
            else:
                col = _untrusted.counts_checked(name, col)
            out[name] = col
        return out

    def search(self, t: int, side: Side) -> int:
        raw = t - self.shift
        gen = self._gen
        found: int | None = self._recall(("search", raw, side))
        if found is None:
            found = self._search(raw, side)
            self._keep(gen, ("search", raw, side), found)
        return found

    def _search(self, raw: int, side: Side) -> int:
        _, _, _, last = self._index()
        k = int(np.searchsorted(last, raw, side))
        if k >= len(last):
            return self.rows
        key, r0, cn, a, inflater = self._opened(k)
        if not isinstance(inflater, dict):
            before = inflater.inflated, inflater.nbytes
            try:
                i: int = inflater.search(raw, side, a, a + cn) - a
                self._inflated(key, a, inflater, before)
                return r0 + i
            except _codec.ChunkError as exc:
                inflater = self._damaged(key, k, exc)
        return r0 + int(np.searchsorted(inflater[self.stored[0][0]], raw, side))

    def max_rows(self, column: str, i0: int, i1: int) -> tuple[int, int] | None:
        row0, n, _, _ = self._index()
        time = self.stored[0][0]
        best: tuple[int, int] | None = None

        def consider(t: int, v: int) -> None:
            nonlocal best
            if best is None or v > best[1] or (v == best[1] and t < best[0]):
                best = (t, v)

        if column == self.primary and column in self._pos:
            ends = row0 + n
            full = np.flatnonzero((row0 >= i0) & (ends <= i1))
            with self._lock:
                vmax, t_vmax = self.vmax, self.t_vmax
            if len(full):
                v = vmax[full]
                if not np.isnan(v).all():
                    top = np.nanmax(v)
                    for j in full[v == top]:
                        consider(int(t_vmax[j]) + self.shift, int(top))
                edges = [(i0, int(row0[full[0]])), (int(ends[full[-1]]), i1)]
            else:
                edges = [(i0, i1)]
        else:
            edges = [(i0, i1)]
        for a, b in edges:
            for r0, r1 in self.ranges(a, b):
                cols = self.read(r0, r1, (time, column))
                v = cols[column]
                known = ~np.isnan(v) if v.dtype.kind == "f" else v != MISSING_INT
                if known.any():
                    vals = np.where(known, v, -np.inf if v.dtype.kind == "f" else MISSING_INT)
                    i = int(np.argmax(vals))
                    consider(int(cols[time][i]), int(v[i]))
        return best

    # ------------------------------------------------------------------ summaries

    def summary(self, t0: int, t1: int, width: int) -> sm.Blocks | None:
        spec = self.spec
        if spec is None:
            return None
        _, _, first, last = self._index()
        a = int(np.searchsorted(last, t0 - self.shift, "left"))
        b = int(np.searchsorted(first, t1 - self.shift, "right"))
        if b <= a:
            return sm.empty(spec)
        with self._lock:
            stats, have = self.stats, self.have
        if b - a >= 2 * width and stats is not None and have[a:b].all():
            return self._transformed({name: col[a:b] for name, col in stats.items()})
        parts = self._blocks(range(a, b))
        return self._transformed(sm.concat(spec, [p for p in parts if p is not None]))

    def _blocks(self, chunks: range) -> list[sm.Blocks | None]:
        """Block summaries of ``chunks`` (stored, cached or computed; missing beyond
        :data:`SYNC_SUMMARIES` chunks the file has none for)."""
        out: list[sm.Blocks | None] = []
        row0, n, _, _ = self._index()
        missing = 0
        stored = self.stored_summaries
        for k in chunks:
            key = ("blocks", self.source.key, self.sid, int(row0[k]), int(n[k]))
            blocks = CACHE.get(key) if stored else self._made.get(int(row0[k]))
            if blocks is None and stored:
                blocks = self._stored_blocks(k)
            if blocks is None:
                if missing >= SYNC_SUMMARIES:
                    out.append(self._own(k))
                    continue
                missing += 1
                blocks = self.summarise_chunk(k)
            if blocks is not None and stored:
                CACHE.put(key, blocks, sum(c.nbytes for c in blocks.values()) + 200)
            out.append(blocks)
        return out

    def _own(self, k: int) -> sm.Blocks | None:
        """Chunk ``k``'s own summary, if known."""
        self._wake()
        with self._lock:
            if self.stats is None or k >= len(self.have) or not self.have[k]:
                return None
            return {name: col[k : k + 1] for name, col in self.stats.items()}

    def _stored_blocks(self, k: int) -> sm.Blocks | None:
        assert self.spec is not None
        rows = self.source.query(
            "SELECT blocks FROM summaries WHERE series = ? AND row0 = ?",
            (self.sid, int(self.row0[k])),
        )
        if not rows:
            return None
        self.source.summaries_read += 1
        # At most a summary row per stored row: a stream inflating past that is damaged.
        most = (int(self.n[k]) + 1) * self.spec.dtype().itemsize
        try:
            return sm.from_bytes(self.spec, _codec.inflate(rows[0][0], most))
        except (ValueError, TypeError):  # ChunkError, or a blob that is not bytes
            return None

    def summarise_chunk(self, k: int) -> sm.Blocks | None:
        """Summarise chunk ``k`` from its rows (a file without stored summaries); its own
        summary joins the index. Returns the block summaries."""
        spec = self.spec
        if spec is None:
            return None
        _, _, cols = self._chunk(k, self._upto(spec.needs()))
        count = len(cols[self.stored[0][0]])
        full = {
            name: np.asarray(cols[name], np.int64)
            if name in cols
            else np.full(count, MISSING_INT, np.int64)
            for name in spec.needs()
        }
        blocks = sm.summarise(spec, full)
        own = chunk_summary(spec, blocks)
        with self._lock:
            if self._asleep is not None or k >= len(self.row0):
                return blocks  # let go of meanwhile (info is done with it): kept nowhere
            self._made[int(self.row0[k])] = blocks
            if self.stats is not None and k < len(self.have) and not self.have[k]:
                for name, col in self.stats.items():
                    col[k] = own[name][0]
                self.have[k] = True
        return blocks

    def unsummarised(self) -> list[int]:
        """Chunks with no summary of their own yet (a file written before summaries)."""
        if self.spec is None or self.stored_summaries:
            return []
        self._wake()
        with self._lock:
            return np.flatnonzero(~self.have).tolist()

    def _transformed(self, blocks: sm.Blocks) -> sm.Blocks:
        if not self.shift and "name" not in self.maps:
            return blocks
        out = dict(blocks)
        if self.shift:
            for name in ("t_first", "t_last", "start", "w_t0", "w_t1"):
                if name in out:
                    out[name] = out[name] + self.shift
        if "name" in self.maps and "w_name" in out:
            out["w_name"] = remap(out["w_name"], *self.maps["name"])
        return out


def chunk_summary(spec: sm.Spec, blocks: sm.Blocks) -> sm.Blocks:
    """A chunk's own summary: all its blocks as one."""
    return sm.combine(spec, blocks, max(1, len(blocks["rows"])))
