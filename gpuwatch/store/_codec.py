"""Columnar chunk encoding: delta + byte-shuffle + zlib, and the rules that cut chunks.

Integer columns are stored as differences from the previous row (time steps, byte counts
that rarely change), and every column is byte-shuffled (all first bytes, then all second
bytes...) so the slowly varying high bytes form long runs that zlib compresses well. Both
steps are exact: integer differences wrap around and the cumulative sum wraps back.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Mapping, Sequence

import numpy as np

from ..session.table import MISSING_INT

CODEC = 1
"""``chunks.codec`` of this encoding."""

LEVEL = 6


class ChunkError(ValueError):
    """A chunk blob that does not decode to the rows its index entry promises."""


def encode(
    cols: Mapping[str, np.ndarray],
    layout: Sequence[tuple[str, np.dtype]],
    start: int,
    stop: int,
    level: int = LEVEL,
) -> bytes:
    """Encode rows ``[start, stop)`` of ``cols`` (columns in ``layout`` order)."""
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
        upto: Decode only the first ``upto`` columns of the layout (the stream is
            inflated no further than their bytes).

    Raises:
        ChunkError: Unknown codec, bad compressed data or the wrong number of bytes.
    """
    return Inflater(blob, n, layout, codec).columns(len(layout) if upto is None else upto)


class Inflater:
    """A chunk inflated a column at a time, on demand, never twice.

    Columns are stored one after the other in one zlib stream, so the first ones can be
    had without inflating the rest: a search reads the time column, a view asks for more
    later, and the stream goes on from where it stopped.

    One inflater is shared through the cache by every thread (a replay's view and the
    loader summarising an older file): a lock keeps the stream whole, and each caller gets
    its own dict of the columns made.

    Raises:
        ChunkError: Unknown codec (here); bad data or the wrong size (when read).
    """

    def __init__(
        self, blob: bytes, n: int, layout: Sequence[tuple[str, np.dtype]], codec: int = CODEC
    ) -> None:
        if codec != CODEC:
            raise ChunkError(f"unknown chunk codec {codec}")
        self.n = n
        self.layout = list(layout)
        self.cols: dict[str, np.ndarray] = {}
        self._z = zlib.decompressobj()
        self._tail = blob
        self._pending = b""  # inflated bytes of columns not made yet
        self._lock = threading.Lock()

    @property
    def done(self) -> int:
        """Columns made so far."""
        return len(self.cols)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(c.nbytes for c in self.cols.values()) + len(self._tail) + len(self._pending)

    def columns(self, upto: int) -> dict[str, np.ndarray]:
        """The first ``upto`` columns (all the made ones: at least ``upto``)."""
        with self._lock:
            return dict(self._columns(upto))

    def _columns(self, upto: int) -> dict[str, np.ndarray]:
        upto = min(upto, len(self.layout))
        if upto <= self.done:
            return self.cols
        n = self.n
        todo = self.layout[self.done : upto]
        want = n * sum(dt.itemsize for _, dt in todo)
        try:
            if len(self._pending) < want:
                more = self._z.decompress(self._tail, want - len(self._pending))
                self._tail = self._z.unconsumed_tail
                self._pending += more
            if upto == len(self.layout):  # the whole stream: nothing may be left over
                rest = self._z.decompress(self._tail) + self._z.flush()
                self._tail = b""
                if rest or not self._z.eof:
                    raise ChunkError("damaged chunk: more bytes than its rows")
        except zlib.error as exc:
            raise ChunkError(f"damaged chunk: {exc}")
        if len(self._pending) < want:
            raise ChunkError(f"damaged chunk: {len(self._pending)} bytes for {n} rows")
        buf = np.frombuffer(self._pending, dtype=np.uint8, count=want)
        offset = 0
        for name, dtype in todo:
            size = n * dtype.itemsize
            planes = buf[offset : offset + size].reshape(dtype.itemsize, n)
            col = planes.T.copy().view(dtype).reshape(n)
            if dtype.kind == "i":
                np.cumsum(col, dtype=dtype, out=col)
            self.cols[name] = col
            offset += size
        self._pending = self._pending[want:]
        return self.cols


def check(blob: bytes, n: int, layout: Sequence[tuple[str, np.dtype]], codec: int = CODEC) -> None:
    """Raise :class:`ChunkError` unless the chunk inflates to its ``n`` rows (nothing is
    kept: this is :func:`decode` without making the columns)."""
    if codec != CODEC:
        raise ChunkError(f"unknown chunk codec {codec}")
    try:
        size = len(zlib.decompress(blob))
    except zlib.error as exc:
        raise ChunkError(f"damaged chunk: {exc}")
    if size != n * sum(dtype.itemsize for _, dtype in layout):
        raise ChunkError(f"damaged chunk: {size} bytes for {n} rows")


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
