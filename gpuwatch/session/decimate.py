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
        values: Sample values (NaN, or an int column's missing marker converted to NaN by the
            caller, means "unknown" and is skipped).
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
        v = np.asarray(values[i0:i1], dtype=np.float64)
        starts = idx[:-1] - i0
        nonempty = idx[1:] > idx[:-1]
        if nonempty.any():
            s = starts[nonempty]
            lo[nonempty] = np.fmin.reduceat(v, s)
            hi[nonempty] = np.fmax.reduceat(v, s)
    if hold:
        # The value in effect at each column's start is the last sample before the edge.
        prev = idx[:-1] - 1
        valid = prev >= 0
        # Do not extend the line past the newest sample.
        valid &= edges[:-1] <= t[-1]
        if valid.any():
            held = np.full(width, np.nan)
            held[valid] = np.asarray(values[prev[valid]], dtype=np.float64)
            lo = np.fmin(lo, held)
            hi = np.fmax(hi, held)
    return lo, hi


def value_at(t: np.ndarray, values: np.ndarray, at: int) -> float | None:
    """The step-hold value at time ``at``: the last sample at or before it, or None."""
    i = int(np.searchsorted(t, at, "right")) - 1
    if i < 0:
        return None
    v = float(values[i])
    return None if np.isnan(v) else v


def segment_max(
    t_start: np.ndarray, t_end: np.ndarray, values: np.ndarray, t0: int, t1: int, width: int
) -> np.ndarray:
    """Per-column maximum of values that hold over time segments ``[t_start, t_end]``.

    Used for the allocator's exact per-phase peaks: each is known to have happened
    somewhere inside its segment, so it is drawn over the whole segment.

    Returns:
        Float64 array of length ``width``, NaN where no segment overlaps.
    """
    out = np.full(width, -np.inf)
    if width <= 0 or t1 <= t0 or len(values) == 0:
        return np.full(width, np.nan)
    keep = (t_end >= t0) & (t_start <= t1)
    if not keep.any():
        return np.full(width, np.nan)
    a, b = t_start[keep], t_end[keep]
    v = np.asarray(values[keep], dtype=np.float64)
    scale = width / (t1 - t0)
    c0 = np.clip(((a - t0) * scale).astype(np.int64), 0, width - 1)
    c1 = np.clip(((b - t0) * scale).astype(np.int64), 0, width - 1)
    np.maximum.at(out, c0, v)
    np.maximum.at(out, c1, v)
    # Segments are disjoint in time, so their interiors add up to at most `width` columns.
    for i in np.flatnonzero(c1 - c0 >= 2):
        seg = out[c0[i] + 1 : c1[i]]
        np.maximum(seg, v[i], out=seg)
    out[np.isneginf(out)] = np.nan
    return out
