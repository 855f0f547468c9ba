"""Min/max decimation: reduce samples to one (low, high) pair per output column.

Never averages, so a one-sample spike survives any zoom level. Signals are treated as
step-hold (a value holds until the next sample), so each column also covers the value that
was in effect when the column began: lines stay connected, and a column between two sparse
samples carries the held value instead of a gap.
"""

from __future__ import annotations

import numpy as np


def column_edges(t0: int, t1: int, width: int) -> np.ndarray:
    """``width + 1`` int64 edges splitting ``[t0, t1]`` into equal columns."""
    return t0 + (np.arange(width + 1, dtype=np.float64) * ((t1 - t0) / width)).astype(np.int64)


def minmax(
    t: np.ndarray, values: np.ndarray, t0: int, t1: int, width: int, hold: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Per-column min and max of ``values`` sampled at times ``t`` over ``[t0, t1]``.

    Args:
        t: Non-decreasing int64 sample times.
        values: Sample values; NaN (floats) or the session's missing marker (ints) means
            "unknown" and is skipped.
        t0: Start of the window.
        t1: End of the window (exclusive of later samples).
        width: Number of output columns.
        hold: Carry the last value before each column into it (step-hold).

    Returns:
        ``(lo, hi)`` float64 arrays of length ``width``; NaN where nothing is known (before
        the first sample, after the last one, or all unknown).
    """
    lo = np.full(width, np.nan)
    hi = np.full(width, np.nan)
    if width <= 0 or t1 <= t0 or len(t) == 0:
        return lo, hi
    edges = column_edges(t0, t1, width)
    idx = np.searchsorted(t, edges, "left")  # first sample at or after each edge
    i0, i1 = int(idx[0]), int(idx[-1])
    # Samples exactly at t1 belong to the last column.
    i1 = int(np.searchsorted(t, t1, "right"))
    idx[-1] = i1
    if i1 > i0:
        starts = idx[:-1] - i0
        nonempty = idx[1:] > idx[:-1]
        if nonempty.any():
            s = starts[nonempty]
            lo[nonempty], hi[nonempty] = _reduce(values[i0:i1], s)
    if hold:
        # The value in effect at each column's start is the last sample before the edge.
        prev = idx[:-1] - 1
        valid = prev >= 0
        # Do not extend the line past the newest sample.
        valid &= edges[:-1] <= t[-1]
        if valid.any():
            held = np.full(width, np.nan)
            held[valid] = _as_float(values[prev[valid]])
            lo = np.fmin(lo, held)
            hi = np.fmax(hi, held)
    return lo, hi


_MISSING = np.iinfo(np.int64).min  # the session's "unknown" marker in int columns


def _as_float(v: np.ndarray) -> np.ndarray:
    """Small arrays to float64, with the int "unknown" marker as NaN."""
    out = np.asarray(v, dtype=np.float64)
    if v.dtype.kind == "i":
        out[v == _MISSING] = np.nan
    return out


def _reduce(v: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Min and max of ``v`` between consecutive ``starts``, skipping unknown values.

    Integer columns are reduced as integers (no float copy of a million samples); the
    unknown marker is the smallest int64, so it can only ever win the minimum, and the
    minimum is redone without it only when it did.
    """
    if v.dtype.kind == "f":
        return np.fmin.reduceat(v, starts), np.fmax.reduceat(v, starts)
    lo = np.minimum.reduceat(v, starts)
    hi = np.maximum.reduceat(v, starts)
    if (lo == _MISSING).any():
        lo = np.minimum.reduceat(np.where(v == _MISSING, np.iinfo(np.int64).max, v), starts)
        lo = np.where(lo == np.iinfo(np.int64).max, _MISSING, lo)
    return _as_float(lo), _as_float(hi)


def value_at(t: np.ndarray, values: np.ndarray, at: int) -> float | None:
    """The step-hold value at time ``at``: the last sample at or before it, or None."""
    i = int(np.searchsorted(t, at, "right")) - 1
    if i < 0:
        return None
    v = values[i]
    if v == _MISSING and values.dtype.kind == "i":
        return None
    v = float(v)
    return None if np.isnan(v) else v


def segment_max(
    t_start: np.ndarray, t_end: np.ndarray, values: np.ndarray, t0: int, t1: int, width: int
) -> np.ndarray:
    """Per-column maximum of values that hold over time segments ``[t_start, t_end]``.

    Used for the allocator's exact per-phase peaks: each is known to have happened
    somewhere inside its segment, so it is drawn over the whole segment. Segments must be
    in time order and must not overlap (consecutive phase boundaries of one process), so
    both ends are sorted and every column's segments are one contiguous index range.

    Args:
        t_start: Segment starts.
        t_end: Segment ends.
        values: One value per segment; in an int column the session's unknown marker is
            skipped, as if its segment were not there.
        t0: Start of the window.
        t1: End of the window.
        width: Number of output columns.

    Returns:
        Float64 array of length ``width``, NaN where no segment with a known value overlaps.
    """
    out = np.full(width, np.nan)
    if width <= 0 or t1 <= t0 or len(values) == 0:
        return out
    # Only segments that overlap the window: views, no copies.
    i0 = int(np.searchsorted(t_end, t0, "left"))
    i1 = int(np.searchsorted(t_start, t1, "right"))
    if i1 <= i0:
        return out
    a, b = t_start[i0:i1], t_end[i0:i1]
    edges = column_edges(t0, t1, width)
    lo = np.searchsorted(b, edges[:-1], "left")  # first segment ending in or after column
    hi = np.searchsorted(a, edges[1:], "right")  # one past the last starting before its end
    nonempty = hi > lo
    if not nonempty.any():
        return out
    # One reduceat over interleaved (lo, hi) pairs: the even results are each column's max.
    # It reads the window's values in place (no float copy of a million peaks): an index
    # must be below the length, so a column running to the end stops one short of it and
    # takes the last value in below.
    v = values[i0:i1]
    last = len(v) - 1
    pairs = np.empty(2 * width, dtype=np.int64)
    np.minimum(lo, last, out=pairs[0::2])
    np.minimum(hi, last, out=pairs[1::2])
    maxima = np.maximum.reduceat(v, pairs)[0::2]
    tail = nonempty & (hi > last)
    maxima[tail] = np.maximum(maxima[tail], v[last])
    if v.dtype.kind == "i":
        # The unknown marker is the smallest int64: it wins only where all are unknown.
        nonempty &= maxima != _MISSING
    out[nonempty] = maxima[nonempty]
    return out
