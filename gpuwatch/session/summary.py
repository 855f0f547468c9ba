"""Summaries of blocks of rows: what a zoomed-out view draws without reading the rows.

A table's rows are summarised in blocks of consecutive rows. A block keeps how many rows
it holds, its first and last time, where the extent of its rows begins (the earliest
``t0`` of spans and peak segments), the minimum, maximum and last value of the columns a
view draws, and, for phases, the *winner*: the deepest, then longest span, the one a band
cell holding the whole block shows. Summaries combine exactly (the minimum of minima, the
maximum of maxima, the winner of winners), so a block of blocks is a block: a recording
keeps one per chunk and one per :data:`BLOCK_ROWS` rows of a chunk; a session without a
recording keeps them for the rows it let go, merging neighbours as they age.

Nothing here averages: a spike in one row is the maximum of its block, of its chunk and of
every coarser summary, so it shows at any zoom.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .decimate import column_edges

MISSING_INT = np.iinfo(np.int64).min  # the session's "unknown" in int columns (table.py)

VERSION = 1
"""Version of the summary layout (a recording's ``meta.summaries``)."""

BLOCK_ROWS = 128
"""Rows per block."""

_INT_MAX = np.iinfo(np.int64).max
_DUR_BITS = 44  # durations up to 2^44 ns (4.9 h) order winners; longer ones tie at the cap

Blocks = dict[str, np.ndarray]
"""Summary columns (see :meth:`Spec.columns`), one row per block, in time order."""


@dataclass(frozen=True)
class Spec:
    """What is summarised of one kind of table.

    Attributes:
        time: The column the rows are ordered by.
        start: The column where a row's extent begins (``t0`` of a span or a peak
            segment), or None for point samples.
        minmax: Columns kept as minimum, maximum and last value.
        winner: Keep the deepest-then-longest span (phases).
    """

    time: str
    start: str | None
    minmax: tuple[str, ...]
    winner: bool = False

    def columns(self) -> tuple[str, ...]:
        """The summary's column names, in layout order."""
        out = ["rows", "t_first", "t_last", "start"]
        for c in self.minmax:
            out += [f"{c}_min", f"{c}_max", f"{c}_last"]
        if self.winner:
            out += ["w_t0", "w_t1", "w_name", "w_depth"]
        return tuple(out)

    def needs(self) -> tuple[str, ...]:
        """The table columns a summary is computed from."""
        out = [self.time]
        if self.start is not None:
            out.append(self.start)
        out += [c for c in self.minmax if c not in out]
        if self.winner:
            out += [c for c in ("t0", "t1", "name", "depth") if c not in out]
        return tuple(out)

    def dtype(self) -> np.dtype:
        """A packed structured dtype of one summary row (all int64, little-endian)."""
        return np.dtype([(name, "<i8") for name in self.columns()])


SPECS: dict[str, Spec] = {
    "gpu": Spec("t", None, ("used",)),
    "host": Spec("t", None, ("used",)),
    "torch": Spec("t", None, ("dev", "allocated", "reserved")),
    "rss": Spec("t", None, ("rss",)),
    "peaks": Spec("t1", "t0", ("dev", "peak_allocated", "peak_reserved")),
    "phases": Spec("t1", "t0", ("peak_alloc",), winner=True),
}
"""Table kind -> what its summaries keep (``gpu_procs`` has none: it is only read at a time)."""


def empty(spec: Spec) -> Blocks:
    return {name: np.zeros(0, np.int64) for name in spec.columns()}


def summarise(spec: Spec, cols: dict[str, np.ndarray], block_rows: int = BLOCK_ROWS) -> Blocks:
    """Blocks of ``block_rows`` consecutive rows of ``cols`` (the last one may be shorter)."""
    t = np.asarray(cols[spec.time], dtype=np.int64)
    n = len(t)
    if n == 0:
        return empty(spec)
    starts = np.arange(0, n, max(1, block_rows), dtype=np.int64)
    ends = np.append(starts[1:], n)
    out: Blocks = {"rows": ends - starts, "t_first": t[starts], "t_last": t[ends - 1]}
    if spec.start is not None:
        out["start"] = _min_known(np.asarray(cols[spec.start], np.int64), starts)
        out["start"] = np.where(out["start"] == MISSING_INT, out["t_first"], out["start"])
    else:
        out["start"] = out["t_first"].copy()
    for c in spec.minmax:
        v = np.asarray(cols[c], dtype=np.int64)
        out[f"{c}_min"] = _min_known(v, starts)
        out[f"{c}_max"] = np.maximum.reduceat(v, starts)  # the missing marker never wins
        out[f"{c}_last"] = v[ends - 1]
    if spec.winner:
        t0 = np.asarray(cols["t0"], np.int64)
        t1 = np.asarray(cols["t1"], np.int64)
        i = _last_argmax(_winner_key(np.asarray(cols["depth"]), t1 - t0), starts, ends)
        out["w_t0"], out["w_t1"] = t0[i], t1[i]
        out["w_name"] = np.asarray(cols["name"], np.int64)[i]
        out["w_depth"] = np.asarray(cols["depth"], np.int64)[i]
    return {name: out[name] for name in spec.columns()}


def combine(spec: Spec, blocks: Blocks, group: int) -> Blocks:
    """Merge every ``group`` consecutive blocks into one (the last group may be shorter)."""
    n = len(blocks["rows"])
    if n == 0 or group <= 1:
        return blocks
    starts = np.arange(0, n, group, dtype=np.int64)
    return combine_at(spec, blocks, starts)


def combine_at(spec: Spec, blocks: Blocks, starts: np.ndarray) -> Blocks:
    """Merge the blocks between consecutive ``starts`` (indices into ``blocks``) into one."""
    n = len(blocks["rows"])
    if n == 0:
        return blocks
    ends = np.append(starts[1:], n)
    out: Blocks = {
        "rows": np.add.reduceat(blocks["rows"], starts),
        "t_first": blocks["t_first"][starts],
        "t_last": blocks["t_last"][ends - 1],
        "start": np.minimum.reduceat(blocks["start"], starts),
    }
    for c in spec.minmax:
        out[f"{c}_min"] = _min_known(blocks[f"{c}_min"], starts)
        out[f"{c}_max"] = np.maximum.reduceat(blocks[f"{c}_max"], starts)
        out[f"{c}_last"] = blocks[f"{c}_last"][ends - 1]
    if spec.winner:
        key = _winner_key(blocks["w_depth"], blocks["w_t1"] - blocks["w_t0"])
        i = _last_argmax(key, starts, ends)
        for name in ("w_t0", "w_t1", "w_name", "w_depth"):
            out[name] = blocks[name][i]
    return {name: out[name] for name in spec.columns()}


def concat(spec: Spec, parts: Sequence[Blocks]) -> Blocks:
    """Blocks of several parts, in the order given."""
    parts = [p for p in parts if len(p["rows"])]
    if not parts:
        return empty(spec)
    if len(parts) == 1:
        return parts[0]
    return {name: np.concatenate([p[name] for p in parts]) for name in spec.columns()}


def select(blocks: Blocks, keep: np.ndarray) -> Blocks:
    """The blocks where ``keep`` is true (a mask or indices)."""
    return {name: col[keep] for name, col in blocks.items()}


def overlapping(blocks: Blocks, t0: int, t1: int) -> Blocks:
    """The blocks whose extent ``[start, t_last]`` meets ``[t0, t1]``."""
    return select(blocks, (blocks["t_last"] >= t0) & (blocks["start"] <= t1))


def to_bytes(spec: Spec, blocks: Blocks) -> bytes:
    """Packed little-endian rows (a recording's per-chunk summary)."""
    arr = np.empty(len(blocks["rows"]), dtype=spec.dtype())
    for name in spec.columns():
        arr[name] = blocks[name]
    return arr.tobytes()


def from_bytes(spec: Spec, data: bytes) -> Blocks:
    """Rows packed by :func:`to_bytes`.

    Raises:
        ValueError: The bytes are not whole rows of this layout.
    """
    dtype = spec.dtype()
    if len(data) % dtype.itemsize:
        raise ValueError("summary of the wrong size")
    arr = np.frombuffer(data, dtype=dtype)
    return {name: arr[name].astype(np.int64) for name in spec.columns()}


# --------------------------------------------------------------------------- queries


def block_minmax(
    blocks: Blocks, column: str, t0: int, t1: int, width: int, newest: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per-column low and high of a step-hold signal from its block summaries.

    Each block's minimum and maximum count in every column its ``[t_first, t_last]``
    meets, so a spike is never lost (it may reach into the neighbouring column when a
    block straddles the edge). A column starting in a gap between blocks also carries the
    value held from the block before (its last value), as :func:`~.decimate.minmax` does.

    Args:
        blocks: Summaries in time order.
        column: A summarised column.
        t0: Window start.
        t1: Window end.
        width: Number of output columns.
        newest: The newest time of the whole table: no value is held past it.
    """
    lo = np.full(width, np.nan)
    hi = np.full(width, np.nan)
    n = len(blocks["rows"]) if blocks else 0
    if width <= 0 or t1 <= t0 or n == 0:
        return lo, hi
    first, last = blocks["t_first"], blocks["t_last"]
    edges = column_edges(t0, t1, width)
    a = np.searchsorted(last, edges[:-1], "left")
    b = np.searchsorted(first, edges[1:], "left")
    b[-1] = np.searchsorted(first, t1, "right")
    mins = _as_float(blocks[f"{column}_min"])
    maxs = _as_float(blocks[f"{column}_max"])
    lo_r, hi_r = _range_reduce(mins, a, b, np.fmin), _range_reduce(maxs, a, b, np.fmax)
    prev = np.searchsorted(first, edges[:-1], "right") - 1
    valid = (prev >= 0) & (prev < n)
    valid &= edges[:-1] <= (newest if newest is not None else int(last[-1]))
    if valid.any():
        held = np.full(width, np.nan)
        held[valid] = _as_float(blocks[f"{column}_last"][prev[valid]])
        lo_r, hi_r = np.fmin(lo_r, held), np.fmax(hi_r, held)
    return lo_r, hi_r


def block_segment_max(blocks: Blocks, column: str, t0: int, t1: int, width: int) -> np.ndarray:
    """Per-column maximum of values held over segments, from block summaries.

    The blocks of a table of consecutive segments (allocator peaks between boundaries):
    each block's maximum counts over its whole extent ``[start, t_last]``.
    """
    out = np.full(width, np.nan)
    n = len(blocks["rows"]) if blocks else 0
    if width <= 0 or t1 <= t0 or n == 0:
        return out
    edges = column_edges(t0, t1, width)
    a = np.searchsorted(blocks["t_last"], edges[:-1], "left")
    b = np.searchsorted(np.maximum.accumulate(blocks["start"]), edges[1:], "right")
    return _range_reduce(_as_float(blocks[f"{column}_max"]), a, b, np.fmax)


def cover(blocks: Blocks, t0: int, t1: int, width: int) -> np.ndarray:
    """Per column: does any block's extent ``[start, t_last]`` meet it."""
    out = np.zeros(width, dtype=bool)
    n = len(blocks["rows"]) if blocks else 0
    if width <= 0 or t1 <= t0 or n == 0:
        return out
    scale = width / (t1 - t0)
    inside = (blocks["t_last"] >= t0) & (blocks["start"] <= t1)
    c0 = np.clip(((blocks["start"][inside] - t0) * scale).astype(np.int64), 0, width - 1)
    c1 = np.clip(((blocks["t_last"][inside] - t0) * scale).astype(np.int64), 0, width - 1)
    diff = np.zeros(width + 1, np.int64)
    np.add.at(diff, c0, 1)
    np.add.at(diff, c1 + 1, -1)
    return np.cumsum(diff[:-1]) > 0


def cell_winners(
    t0s: np.ndarray, t1s: np.ndarray, depth: np.ndarray, w0: int, w1: int, width: int
) -> np.ndarray:
    """Indices of the spans a band of ``width`` cells over ``[w0, w1]`` shows.

    A cell shows the deepest span that touches it, the longest among equals, the last
    given among equal ones; only such winners are returned (in the order given), which the
    band draws exactly as it would draw all of them. Cells are those of the band's own
    rule (a span owns the cells whose larger part it covers, and at least one).
    """
    n = len(t0s)
    if n == 0 or width <= 0 or w1 <= w0:
        return np.zeros(0, np.int64)
    scale = width / (w1 - w0)
    c0 = np.round((t0s - w0) * scale).astype(np.int64)
    c1 = np.maximum(np.round((t1s - w0) * scale).astype(np.int64) - 1, c0)
    shown = (c1 >= 0) & (c0 <= width - 1)
    idx = np.flatnonzero(shown)
    if len(idx) == 0:
        return idx
    c0, c1 = np.clip(c0[idx], 0, width - 1), np.clip(c1[idx], 0, width - 1)
    order = np.lexsort((idx, t1s[idx] - t0s[idx], depth[idx]))  # ascending key: last wins
    rank = np.empty(len(idx), np.int64)
    rank[order] = np.arange(len(idx))
    counts = c1 - c0 + 1
    cells = np.repeat(c0, counts) + _ramp(counts)
    owner = np.full(width, -1, np.int64)
    np.maximum.at(owner, cells, np.repeat(rank, counts))
    won = np.unique(owner[owner >= 0])
    return np.sort(idx[order[won]])


# --------------------------------------------------------------------------- helpers


def _ramp(counts: np.ndarray) -> np.ndarray:
    """0, 1, ..., counts[0]-1, 0, 1, ..., counts[1]-1, ..."""
    total = int(counts.sum())
    ends = np.cumsum(counts)
    out: np.ndarray = np.arange(total, dtype=np.int64) - np.repeat(ends - counts, counts)
    return out


def _as_float(v: np.ndarray) -> np.ndarray:
    out = np.asarray(v, dtype=np.float64)
    out[v == MISSING_INT] = np.nan
    return out


def _min_known(v: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Minimum per group, the missing marker left out (and kept where all are missing)."""
    out = np.minimum.reduceat(np.where(v == MISSING_INT, _INT_MAX, v), starts)
    return np.where(out == _INT_MAX, MISSING_INT, out)


def _winner_key(depth: np.ndarray, duration: np.ndarray) -> np.ndarray:
    dur = np.clip(np.asarray(duration, np.int64), 0, (1 << _DUR_BITS) - 1)
    return (np.asarray(depth, np.int64) << _DUR_BITS) | dur


def _last_argmax(key: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per group, the index of its largest key (the last one among equals)."""
    best = np.maximum.reduceat(key, starts)
    top = key == np.repeat(best, ends - starts)
    idx = np.where(top, np.arange(len(key)), -1)
    return np.maximum.reduceat(idx, starts)


def _range_reduce(v: np.ndarray, a: np.ndarray, b: np.ndarray, how: np.ufunc) -> np.ndarray:
    """``how``-reduce of ``v[a[i]:b[i]]`` for each i, NaN where the range is empty."""
    out = np.full(len(a), np.nan)
    nonempty = b > a
    if not nonempty.any():
        return out
    ext = np.append(v, np.nan)
    pairs = np.empty(2 * len(a), dtype=np.int64)
    pairs[0::2], pairs[1::2] = np.minimum(a, len(v)), np.minimum(b, len(v))
    # reduceat over (a, b) pairs; an empty or reversed pair gives a stray value: masked.
    red = how.reduceat(ext, pairs)[0::2]
    out[nonempty] = red[nonempty]
    return out
