"""Columnar chunk encoding: delta + byte-shuffle + zlib, and the rules that cut chunks.

Integer columns are stored as differences from the previous row (time steps, byte counts
that rarely change), and every column is byte-shuffled (all first bytes, then all second
bytes...) so the slowly varying high bytes form long runs that zlib compresses well. Both
steps are exact: integer differences wrap around and the cumulative sum wraps back.
"""

from __future__ import annotations

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
    blob: bytes, n: int, layout: Sequence[tuple[str, np.dtype]], codec: int = CODEC
) -> dict[str, np.ndarray]:
    """Decode a chunk of ``n`` rows back to its columns.

    Raises:
        ChunkError: Unknown codec, bad compressed data or the wrong number of bytes.
    """
    if codec != CODEC:
        raise ChunkError(f"unknown chunk codec {codec}")
    try:
        raw = zlib.decompress(blob)
    except zlib.error as exc:
        raise ChunkError(f"damaged chunk: {exc}")
    if len(raw) != n * sum(dtype.itemsize for _, dtype in layout):
        raise ChunkError(f"damaged chunk: {len(raw)} bytes for {n} rows")
    buf = np.frombuffer(raw, dtype=np.uint8)
    out: dict[str, np.ndarray] = {}
    offset = 0
    for name, dtype in layout:
        size = n * dtype.itemsize
        planes = buf[offset : offset + size].reshape(dtype.itemsize, n)
        col = planes.T.copy().view(dtype).reshape(n)
        if dtype.kind == "i":
            np.cumsum(col, dtype=dtype, out=col)
        out[name] = col
        offset += size
    return out


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
