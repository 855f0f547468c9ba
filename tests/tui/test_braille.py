"""The chart's rasteriser and its runs of one style, against dot-by-dot references."""

from __future__ import annotations

import numpy as np
import pytest
from rich.style import Style

from gpuwatch.tui._braille import codes_text, rasterise, to_codes
from gpuwatch.tui.chart import _runs

# Bit of the dot at [row within the cell][column within the cell] (the Unicode braille order).
DOT = [[0x01, 0x08], [0x02, 0x10], [0x04, 0x20], [0x40, 0x80]]


def reference(lines, width: int, height: int, ymax: float) -> tuple[np.ndarray, np.ndarray]:
    """Every dot set one at a time; a cell's colour is the last line with a dot in it."""
    bits = np.zeros((height, width), dtype=np.uint8)
    owner = np.full((height, width), -1, dtype=np.int32)
    rows = 4 * height
    scale = (rows - 1) / ymax
    for index, (lo, hi) in enumerate(lines):
        for x in range(2 * width):
            if np.isnan(lo[x]) or np.isnan(hi[x]):
                continue
            top = int(np.clip(np.rint((ymax - hi[x]) * scale), 0, rows - 1))
            bottom = int(np.clip(np.rint((ymax - lo[x]) * scale), 0, rows - 1))
            for y in range(top, bottom + 1):
                bits[y // 4, x // 2] |= DOT[y % 4][x % 2]
                owner[y // 4, x // 2] = index
    return bits, owner


def test_one_dot_in_each_corner_of_a_cell() -> None:
    nan = np.nan
    # Two cells across, one down: dot columns 0..3; 4 dot rows, ymax 3 -> one value a row.
    top_left = (np.array([3.0, nan, nan, nan]), np.array([3.0, nan, nan, nan]))
    bottom_right = (np.array([nan, nan, nan, 0.0]), np.array([nan, nan, nan, 0.0]))
    bits, owner = rasterise([top_left, bottom_right], 2, 1, 3.0)
    assert bits.tolist() == [[0x01, 0x80]]
    assert owner.tolist() == [[0, 1]]
    assert codes_text(to_codes(bits)) == "⠁⢀"
    assert codes_text(to_codes(np.zeros((1, 3), dtype=np.uint8))) == "   "


@pytest.mark.parametrize("seed", range(6))
def test_rasterise_matches_setting_every_dot(seed: int) -> None:
    rng = np.random.default_rng(seed)
    width, height = int(rng.integers(1, 30)), int(rng.integers(1, 9))
    ymax = float(rng.uniform(0.5, 50))
    lines = []
    for _ in range(int(rng.integers(1, 6))):
        lo = rng.uniform(-0.2 * ymax, 1.2 * ymax, 2 * width)  # off the chart both ways
        hi = lo + rng.uniform(0, ymax, 2 * width) * (rng.random(2 * width) < 0.3)
        lo[rng.random(2 * width) < 0.2] = np.nan
        hi[rng.random(2 * width) < 0.1] = np.nan
        lines.append((lo, hi))
    bits, owner = rasterise(lines, width, height, ymax)
    want_bits, want_owner = reference(lines, width, height, ymax)
    assert np.array_equal(bits, want_bits)
    assert np.array_equal(owner, want_owner)
    assert bits.dtype == np.uint8 and owner.dtype == np.int32  # a line per process: >127


@pytest.mark.parametrize("seed", range(4))
def test_many_lines_on_a_tall_chart_match_setting_every_dot(seed: int) -> None:
    """A host panel's line per process (hundreds, more than int8 holds), crossing cells
    and lying flat in one, some with a high under their low (nothing drawn)."""
    rng = np.random.default_rng(100 + seed)
    width, height, ymax = int(rng.integers(20, 90)), int(rng.integers(10, 40)), 64.0
    lines = []
    for _ in range(int(rng.integers(130, 220))):
        level = rng.uniform(0, ymax)
        lo = level + rng.normal(0, 0.5, 2 * width)
        hi = lo + rng.uniform(0, 4, 2 * width) * (rng.random(2 * width) < 0.2)
        hi[rng.random(2 * width) < 0.05] -= 6.0  # below its low
        lo[rng.random(2 * width) < 0.1] = np.nan
        lines.append((lo, hi))
    bits, owner = rasterise(lines, width, height, ymax)
    want_bits, want_owner = reference(lines, width, height, ymax)
    assert np.array_equal(bits, want_bits)
    assert np.array_equal(owner, want_owner)


def test_nothing_to_draw_is_blank() -> None:
    nan = np.full(8, np.nan)
    bits, owner = rasterise([(nan, nan)], 4, 3, 1.0)
    assert not bits.any() and (owner == -1).all()
    bits, owner = rasterise([], 4, 3, 1.0)
    assert bits.shape == (3, 4) and not bits.any()


@pytest.mark.parametrize("seed", range(4))
def test_runs_cover_each_row_once_in_its_cells_styles(seed: int) -> None:
    rng = np.random.default_rng(seed)
    height, width = int(rng.integers(1, 8)), int(rng.integers(1, 40))
    styles = [Style(color=c) for c in ("red", "green", "blue")] + [Style()]
    # Long runs and single cells, blanks (-1) among them.
    owner = rng.integers(-1, 3, (height, width)).astype(np.int8)
    owner[:, rng.random(width) < 0.5] = 1
    text = "".join(chr(0x2800 + int(c)) for c in rng.integers(0, 256, height * width))
    rows = _runs(text, owner, styles)
    assert len(rows) == height
    for y, segments in enumerate(rows):
        assert "".join(s.text for s in segments) == text[y * width : (y + 1) * width]
        cells = [s.style for s in segments for _ in s.text]
        assert cells == [styles[int(i)] for i in owner[y]]
        changes = int(np.count_nonzero(np.diff(owner[y])))
        assert len(segments) == changes + 1  # one segment per run, never split further
