"""Columnar chunk encoding: delta + byte-shuffle + zlib, in blocks, and the rules that cut chunks.

Integer columns are stored as differences from the previous row (time steps, byte counts
that rarely change), and every column is byte-shuffled (all first bytes, then all second
bytes...) so the slowly varying high bytes form long runs that zlib compresses well. Both
steps are exact: integer differences wrap around and the cumulative sum wraps back.

Codec 2 (what gpuwatch writes) cuts a chunk's rows into blocks of :data:`BLOCK_ROWS`, each
its own stream, behind a small table of each block's rows, size and first time: a reader
that wants one moment (the figures at a cursor) or a five-minute window inflates one or a
few blocks, not the chunk's 8192 rows. Codec 1 (files written before) is one stream per
chunk, and is read as a chunk of one block.
"""

from __future__ import annotations

import bisect
import struct
import sys
import threading
import zlib
from collections.abc import Mapping, Sequence

import numpy as np

from ..session.table import MISSING_INT, Side

CODEC = 2
"""``chunks.codec`` of what gpuwatch writes: blocks of rows, each its own stream."""

STREAM = 1
"""``chunks.codec`` of one stream for the whole chunk (recordings of schema 1)."""

CODECS = (STREAM, CODEC)

BLOCK_ROWS = 512
"""Rows in one block of a codec-2 chunk (the last block of a chunk may hold fewer)."""

LEVEL = 6

_COUNT = struct.Struct("<I")
_BLOCK = struct.Struct("<IIq")  # rows, compressed bytes, first time


MAX_ROWS = 1 << 16
"""Most rows a reader takes in one chunk (gpuwatch writes up to
:data:`~gpuwatch.store._schema.CHUNK_ROWS`): what one chunk may cost in memory is bounded
whatever a file's index says."""


class ChunkError(ValueError):
    """A chunk blob that does not decode to the rows its index entry promises."""


def inflate(data: bytes | memoryview, most: int) -> bytes:
    """One whole zlib stream, which may inflate to ``most`` bytes at most.

    A hostile chunk of a few MB can inflate to gigabytes: no more than ``most + 1``
    bytes are ever made.

    Raises:
        ChunkError: Bad or truncated data, or a stream inflating past ``most`` bytes.
    """
    d = zlib.decompressobj()
    try:
        raw = d.decompress(data, most + 1)  # + 1: max_length 0 would mean no limit
    except (zlib.error, TypeError) as exc:
        raise ChunkError(f"damaged chunk: {exc}")
    if len(raw) > most:
        raise ChunkError(f"damaged chunk: it inflates past the {most} bytes of its rows")
    if not d.eof:
        raise ChunkError("damaged chunk: a truncated stream")
    return raw


def _stream(
    cols: Mapping[str, np.ndarray],
    layout: Sequence[tuple[str, np.dtype]],
    start: int,
    stop: int,
    level: int,
) -> bytes:
    """Rows ``[start, stop)`` as one zlib stream of the shuffled columns (codec 1)."""
    parts = []
    for name, dtype in layout:
        a = np.ascontiguousarray(cols[name][start:stop], dtype=dtype)
        if dtype.kind == "i" and len(a) > 1:
            d = np.empty_like(a)
            d[0] = a[0]
            np.subtract(a[1:], a[:-1], out=d[1:])  # wraps around, undone exactly by cumsum
            a = d
        parts.append(a.view(np.uint8).reshape(-1, dtype.itemsize).T.tobytes())
    return zlib.compress(b"".join(parts), level)


def encode(
    cols: Mapping[str, np.ndarray],
    layout: Sequence[tuple[str, np.dtype]],
    start: int,
    stop: int,
    level: int = LEVEL,
    codec: int = CODEC,
    block_rows: int = BLOCK_ROWS,
) -> bytes:
    """Encode rows ``[start, stop)`` of ``cols`` (columns in ``layout`` order).

    The first column of the layout is the time the rows are ordered by (codec 2 keeps
    each block's first one in its table).
    """
    if codec == STREAM:
        return _stream(cols, layout, start, stop, level)
    if codec != CODEC:
        raise ValueError(f"unknown chunk codec {codec}")
    t = cols[layout[0][0]]
    head = [b""]
    blocks = []
    for a in range(start, stop, block_rows):
        b = min(a + block_rows, stop)
        blocks.append(_stream(cols, layout, a, b, level))
        head.append(_BLOCK.pack(b - a, len(blocks[-1]), int(t[a])))
    head[0] = _COUNT.pack(len(blocks))
    return b"".join(head + blocks)


def decode(
    blob: bytes,
    n: int,
    layout: Sequence[tuple[str, np.dtype]],
    codec: int = CODEC,
    upto: int | None = None,
) -> dict[str, np.ndarray]:
    """Decode a chunk of ``n`` rows back to its columns.

    Args:
        blob: The chunk's ``data``.
        n: Its rows.
        layout: The series' column layout.
        codec: The chunk's codec.
        upto: Decode only the first ``upto`` columns of the layout (the streams are
            inflated no further than their bytes).

    Raises:
        ChunkError: Unknown codec, bad compressed data or the wrong number of bytes.
    """
    return Inflater(blob, n, layout, codec).columns(len(layout) if upto is None else upto)


def _table(blob: bytes, n: int) -> tuple[list[int], list[int], list[int]]:
    """``(first row, byte offset, first time)`` of each block of a codec-2 chunk, with one
    more row and offset for the end.

    Raises:
        ChunkError: A table that does not add up to ``n`` rows and the blob's size.
    """
    if len(blob) < _COUNT.size:
        raise ChunkError("damaged chunk: no block table")
    (count,) = _COUNT.unpack_from(blob)
    end = _COUNT.size + count * _BLOCK.size
    if count == 0 or end > len(blob):
        raise ChunkError(f"damaged chunk: a table of {count} blocks")
    # Python lists, not arrays: a chunk has a few blocks, and a seek opens dozens of chunks.
    rows, offsets, firsts = [0], [end], []
    for count_rows, size, first in _BLOCK.iter_unpack(memoryview(blob)[_COUNT.size : end]):
        if count_rows == 0:
            raise ChunkError("damaged chunk: a block of no rows")
        rows.append(rows[-1] + count_rows)
        offsets.append(offsets[-1] + size)
        firsts.append(first)
    if rows[-1] != n or offsets[-1] != len(blob):
        raise ChunkError(f"damaged chunk: its blocks hold {rows[-1]} rows, not {n}")
    return rows, offsets, firsts


def _layout(blob: bytes, n: int, codec: int) -> tuple[list[int], list[int], list[int] | None]:
    """``(first row, byte offset, first time or None)`` of each block of a chunk (codec 1:
    one block, no first times), with one more row and offset for the end.

    Raises:
        ChunkError: Unknown codec, or a damaged block table.
    """
    if not 0 <= n <= MAX_ROWS:
        raise ChunkError(f"damaged chunk: {n} rows (at most {MAX_ROWS} are read)")
    if codec == STREAM:
        return [0, n], [0, len(blob)], None
    if codec == CODEC:
        return _table(blob, n)
    raise ChunkError(f"unknown chunk codec {codec}")


class _Block:
    """One stream of rows, inflated as far as the columns asked for; each column made once.

    Columns are stored one after the other, so the first ones can be had without
    inflating the rest: a search reads the time column, a view asks for more later. No
    decompressor is kept between reads (zlib's state and window are ~40 KB, ten times a
    block's time column): more columns inflate the stream again from its start, past the
    bytes of the columns made. Not locked: its :class:`Inflater` is.
    """

    def __init__(
        self,
        data: bytes | memoryview,
        n: int,
        layout: list[tuple[str, np.dtype]],
        first: int | None = None,
    ) -> None:
        self.n = n
        self.layout = layout
        self.first = first  # the first time the block's table promises (codec 2)
        self.cols: dict[str, np.ndarray] = {}
        self._data = data
        self.nbytes = 0  # bytes of the columns made (the stream is its chunk's)

    def columns(self, upto: int) -> dict[str, np.ndarray]:
        upto = min(upto, len(self.layout))
        done = len(self.cols)
        if upto <= done:
            return self.cols
        n = self.n
        skip = self.nbytes
        want = n * sum(dt.itemsize for _, dt in self.layout[:upto])
        try:
            if upto == len(self.layout):  # the whole stream: nothing may be left over
                raw = inflate(self._data, want)
            else:
                raw = zlib.decompressobj().decompress(self._data, want)
        except zlib.error as exc:
            raise ChunkError(f"damaged chunk: {exc}")
        if len(raw) < want:
            raise ChunkError(f"damaged chunk: {len(raw)} bytes for {n} rows")
        todo = self.layout[done:upto]
        buf = np.frombuffer(raw, dtype=np.uint8, count=want - skip, offset=skip)
        made = _unshuffle(buf, n, todo)
        if done == 0 and self.first is not None and int(made[todo[0][0]][0]) != self.first:
            raise ChunkError("damaged chunk: a block's first time is not its table's")
        self.cols.update(made)
        self.nbytes = want
        return self.cols


def _unshuffle(buf: np.ndarray, n: int, todo: list[tuple[str, np.dtype]]) -> dict[str, np.ndarray]:
    """Columns ``todo`` of ``n`` rows from their byte planes (integers summed back).

    Neighbouring columns of one size are transposed together, and neighbouring integer
    columns of one dtype summed together: a block's dozen columns cost a few numpy calls,
    not a few each.
    """
    made: dict[str, np.ndarray] = {}
    offset = i = 0
    while i < len(todo):
        size = todo[i][1].itemsize
        j = i
        while j < len(todo) and todo[j][1].itemsize == size:
            j += 1
        stop = offset + (j - i) * size * n
        planes = buf[offset:stop].reshape(j - i, size, n).transpose(0, 2, 1).copy()
        a = i
        while a < j:
            dtype = todo[a][1]
            b = a
            while b < j and todo[b][1] == dtype:
                b += 1
            group = planes[a - i : b - i].view(dtype).reshape(b - a, n)
            if dtype.kind == "i":
                np.cumsum(group, axis=1, dtype=dtype, out=group)
            for k in range(a, b):
                made[todo[k][0]] = group[k - a]
            a = b
        offset, i = stop, j
    return made


class Inflater:
    """A chunk inflated on demand: the blocks a caller's rows lie in, as far as the
    columns it asks for.

    One inflater is shared through the cache by every thread (a replay's view and the
    loader summarising an older file): a lock keeps each block whole, and each caller
    gets its own dict of columns.

    Raises:
        ChunkError: Unknown codec or a damaged block table (here); bad data or the wrong
            size (when read).
    """

    def __init__(
        self, blob: bytes, n: int, layout: Sequence[tuple[str, np.dtype]], codec: int = CODEC
    ) -> None:
        self.n = n
        self.layout = list(layout)
        self._blob = blob
        self._rows, self._offsets, self._firsts = _layout(blob, n, codec)
        self._blocks: list[_Block | None] = [None] * (len(self._rows) - 1)
        self._lock = threading.Lock()
        self.inflated = 0  # rows of the blocks opened so far (what a read cost)
        self._made = 0  # bytes of the blocks' columns, kept as they are made (the cache
        # asks at every read)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return len(self._blob) + self._made

    def _block(self, j: int, upto: int) -> dict[str, np.ndarray]:
        block = self._blocks[j]
        if block is None:
            view = memoryview(self._blob)[self._offsets[j] : self._offsets[j + 1]]
            first = None if self._firsts is None else self._firsts[j]
            block = _Block(view, self._rows[j + 1] - self._rows[j], self.layout, first)
            self._blocks[j] = block
            self.inflated += block.n
        if upto <= len(block.cols):
            return block.cols
        before = block.nbytes
        try:
            return block.columns(upto)
        finally:
            self._made += block.nbytes - before

    def columns(self, upto: int, lo: int = 0, hi: int | None = None) -> dict[str, np.ndarray]:
        """Rows ``[lo, hi)`` of the first ``upto`` columns (all of the chunk by default).

        A range within one block comes as views of it; across blocks, as copies.
        """
        hi = self.n if hi is None else hi
        rows = self._rows
        last = len(rows) - 2
        j0 = min(max(0, bisect.bisect_right(rows, lo) - 1), last)
        j1 = min(max(j0 + 1, bisect.bisect_left(rows, hi)), last + 1)
        with self._lock:
            got = [(rows[j], self._block(j, upto)) for j in range(j0, j1)]
        if len(got) == 1:
            start, cols = got[0]
            a, b = lo - start, hi - start
            if a == 0 and b == len(next(iter(cols.values()))):
                return dict(cols)
            return {name: col[a:b] for name, col in cols.items()}
        names = [name for name, _ in self.layout[:upto]]
        start = got[0][0]
        return {
            name: np.concatenate([cols[name] for _, cols in got])[lo - start : hi - start]
            for name in names
        }

    def search(self, t: int, side: Side, lo: int = 0, hi: int | None = None) -> int:
        """``np.searchsorted`` of ``t`` in the time column (the first), kept to
        ``[lo, hi]``: one block's times are inflated, found from the block table."""
        hi = self.n if hi is None else hi
        j = 0
        if self._firsts is not None:
            # The last block starting before t ("left") or at it ("right"): every row
            # before it is earlier, every block after starts later, so the answer is in it
            # or at the next block's first row.
            find = bisect.bisect_left if side == "left" else bisect.bisect_right
            j = max(0, find(self._firsts, t) - 1)
        with self._lock:
            times = self._block(j, 1)[self.layout[0][0]]
        i = self._rows[j] + int(np.searchsorted(times, t, side))
        return min(max(i, lo), hi)


def check(blob: bytes, n: int, layout: Sequence[tuple[str, np.dtype]], codec: int = CODEC) -> None:
    """Raise :class:`ChunkError` unless the chunk inflates to its ``n`` rows (nothing is
    kept: this is :func:`decode` without making the columns)."""
    rows, offsets, firsts = _layout(blob, n, codec)
    width = sum(dtype.itemsize for _, dtype in layout)
    size, signed = layout[0][1].itemsize, layout[0][1].kind == "i"
    view = memoryview(blob)
    for j in range(len(rows) - 1):
        count = rows[j + 1] - rows[j]
        raw = inflate(view[offsets[j] : offsets[j + 1]], count * width)
        if len(raw) != count * width:
            raise ChunkError(f"damaged chunk: {len(raw)} bytes for {count} rows")
        if firsts is not None:
            # The time's bytes of row 0, one per byte plane (no numpy: a week's check
            # looks at 400k blocks).
            first = int.from_bytes(raw[: size * count : count], sys.byteorder, signed=signed)
            if first != firsts[j]:
                raise ChunkError("damaged chunk: a block's first time is not its table's")


def cut(t: np.ndarray, start: int, stop: int, rows: int, span: int) -> list[int]:
    """Where chunks of rows ``[start, stop)`` end: at most ``rows`` rows and ``span`` ns each.

    A chunk ends before the first row ``span`` or more after its own first row. Returns the
    end index of every chunk; the last is ``stop``.
    """
    ends = []
    i = start
    while i < stop:
        by_time = int(np.searchsorted(t, t[i] + span, "left"))
        j = min(i + rows, max(by_time, i + 1), stop)
        ends.append(j)
        i = j
    return ends


def summary(t: np.ndarray, values: np.ndarray) -> tuple[int | None, int | None]:
    """``(max, time of max)`` of the known values (NaN and the missing marker skipped)."""
    if len(values) == 0:
        return None, None
    if values.dtype.kind == "f":
        known = ~np.isnan(values)
        if not known.any():
            return None, None
        i = int(np.nanargmax(values))
        return int(values[i]), int(t[i])
    known = values != MISSING_INT
    if not known.any():
        return None, None
    i = int(np.argmax(np.where(known, values, MISSING_INT)))
    return int(values[i]), int(t[i])
