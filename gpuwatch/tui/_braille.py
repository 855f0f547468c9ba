"""Braille rasterisation: min/max columns to 2x4-dot terminal cells, with numpy.

Each terminal cell holds a 2-wide, 4-tall dot matrix (U+2800..U+28FF), so a chart of
``W x H`` cells has ``2W x 4H`` dots. A line is given as one (low, high) pair per dot column,
and every dot between low and high is set: a spike one sample wide still lights its column.
"""

from __future__ import annotations

import numpy as np

# Bit of each dot, indexed [row within the cell 0..3][column within the cell 0..1].
_DOT_BITS = np.array([[0x01, 0x08], [0x02, 0x10], [0x04, 0x20], [0x40, 0x80]], dtype=np.uint8)


def rasterise(
    lines: list[tuple[np.ndarray, np.ndarray]], width: int, height: int, ymax: float
) -> tuple[np.ndarray, np.ndarray]:
    """Rasterise lines into braille cells.

    Args:
        lines: ``(lo, hi)`` arrays of length ``2 * width`` per line, in drawing order (later
            lines win the colour of a shared cell). NaN means nothing to draw there.
        width: Cells across.
        height: Cells down.
        ymax: The value at the top edge (the bottom edge is 0).

    Returns:
        ``(bits, owner)``: ``bits`` is a ``height x width`` uint8 array of dot patterns
        (0 = blank); ``owner`` is a same-shaped int32 array with the index of the line that
        colours each cell (-1 where blank).
    """
    bits = np.zeros((height, width), dtype=np.uint8)
    # int32: a host panel draws a line per process, hundreds in a sweep (int8 overflowed).
    owner = np.full((height, width), -1, dtype=np.int32)
    if width <= 0 or height <= 0 or ymax <= 0:
        return bits, owner
    rows = height * 4
    scale = (rows - 1) / ymax
    pix = np.arange(rows)[:, None]
    for index, (lo, hi) in enumerate(lines):
        lo = np.asarray(lo, dtype=np.float64)[: 2 * width]
        hi = np.asarray(hi, dtype=np.float64)[: 2 * width]
        ok = ~(np.isnan(lo) | np.isnan(hi))
        if not ok.any():
            continue
        # Dot row 0 is the top; value 0 sits on the bottom row.
        top = np.full(2 * width, rows, dtype=np.int64)
        bottom = np.full(2 * width, -1, dtype=np.int64)
        top[ok] = np.clip(np.rint((ymax - hi[ok]) * scale), 0, rows - 1).astype(np.int64)
        bottom[ok] = np.clip(np.rint((ymax - lo[ok]) * scale), 0, rows - 1).astype(np.int64)
        mask = (pix >= top[None, :]) & (pix <= bottom[None, :])  # rows x 2*width
        if not mask.any():
            continue
        cell = _pack(mask, width, height)
        bits |= cell
        owner[cell != 0] = index
    return bits, owner


def _pack(mask: np.ndarray, width: int, height: int) -> np.ndarray:
    """Pack a dots mask (4H x 2W) into braille bit patterns (H x W)."""
    m = mask.reshape(height, 4, width, 2)
    return np.einsum("hrwc,rc->hw", m.astype(np.uint8), _DOT_BITS).astype(np.uint8)


def to_text(bits: np.ndarray) -> list[str]:
    """Braille characters for each row of ``bits`` (blank cells become spaces)."""
    codes = bits.astype(np.uint32) + 0x2800
    codes[bits == 0] = 0x20
    return ["".join(map(chr, row)) for row in codes.tolist()]
