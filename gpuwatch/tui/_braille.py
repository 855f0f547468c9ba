"""Braille rasterisation: min/max columns to 2x4-dot terminal cells, with numpy.

Each terminal cell holds a 2-wide, 4-tall dot matrix (U+2800..U+28FF), so a chart of
``W x H`` cells has ``2W x 4H`` dots. A line is given as one (low, high) pair per dot column,
and every dot between low and high is set: a spike one sample wide still lights its column.
"""

from __future__ import annotations

import numpy as np

# Bit of each dot, indexed [row within the cell 0..3][column within the cell 0..1].
_DOT_BITS = np.array([[0x01, 0x08], [0x02, 0x10], [0x04, 0x20], [0x40, 0x80]], dtype=np.uint8)


def _span_bits(column: int) -> np.ndarray:
    """Bits of the dots ``[a, b)`` of one cell column, indexed ``5 * a + b`` (a, b in 0..4)."""
    table = np.zeros(25, dtype=np.uint8)
    for a in range(5):
        for b in range(a + 1, 5):
            table[5 * a + b] = np.bitwise_or.reduce(_DOT_BITS[a:b, column])
    return table


# A dot column's lit rows within one cell are one range [a, b): a line is a vertical
# stretch per dot column. Looking its bits up per cell row avoids a mask of every dot.
_LEFT_BITS = _span_bits(0)
_RIGHT_BITS = _span_bits(1)


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
    if width <= 0 or height <= 0 or ymax <= 0 or not lines:
        return bits, owner
    rows = height * 4
    scale = (rows - 1) / ymax
    # All lines at once: (lines, dot columns).
    lo = np.array([np.asarray(lo, dtype=np.float64)[: 2 * width] for lo, _ in lines])
    hi = np.array([np.asarray(hi, dtype=np.float64)[: 2 * width] for _, hi in lines])
    # Dot row 0 is the top; value 0 sits on the bottom row. Only the drawn dot columns are
    # looked at, and of each only the cells its stretch crosses: a line is a thin stretch
    # per dot column, one or two cells of a tall chart, and a host panel draws a line per
    # process (going through every cell of every line was most of its frame).
    line, col = np.nonzero(~(np.isnan(lo) | np.isnan(hi)))
    top = np.clip(np.rint((ymax - hi[line, col]) * scale), 0, rows - 1).astype(np.int64)
    bottom = np.clip(np.rint((ymax - lo[line, col]) * scale), 0, rows - 1).astype(np.int64)
    drawn = top <= bottom  # a high under its low draws nothing
    line, col, top, bottom = line[drawn], col[drawn], top[drawn], bottom[drawn]
    # One entry per (dot column, cell row it crosses), in line order.
    first_cell = top // 4
    count = bottom // 4 - first_cell + 1
    at = np.repeat(np.cumsum(count) - count, count)
    cell_row = np.repeat(first_cell, count) + (np.arange(int(count.sum())) - at)
    line, col = np.repeat(line, count), np.repeat(col, count)
    # The stretch's dot rows inside the cell, [a, b) with 0 <= a < b <= 4.
    start = 4 * cell_row
    a = np.clip(np.repeat(top, count) - start, 0, 4)
    b = np.clip(np.repeat(bottom, count) + 1 - start, 0, 4)
    code = 5 * a + b
    right = (col & 1).astype(bool)
    cell_bits = np.where(right, np.take(_RIGHT_BITS, code), np.take(_LEFT_BITS, code))
    cell_col = col >> 1
    np.bitwise_or.at(bits, (cell_row, cell_col), cell_bits)
    # A shared cell is the later line's (every entry lights at least one dot).
    np.maximum.at(owner, (cell_row, cell_col), line.astype(np.int32))
    return bits, owner


def to_codes(bits: np.ndarray) -> np.ndarray:
    """Code points of the braille characters of ``bits`` (blank cells become spaces)."""
    codes = bits.astype(np.uint32) + 0x2800
    codes[bits == 0] = 0x20
    return codes


def codes_text(codes: np.ndarray) -> str:
    """The characters of a uint32 code point array, row after row, as one string."""
    return np.ascontiguousarray(codes, dtype="<u4").tobytes().decode("utf-32-le")
