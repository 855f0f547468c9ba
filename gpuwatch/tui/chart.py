"""The timeline chart: a Line API widget that draws min/max braille lines, never averages.

The widget asks its data source for one (low, high) pair per dot column of the current
window, rasterises all lines at once with numpy, and keeps the resulting strips until the
data, the window, the size, the cursor or the theme change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.geometry import Size
from textual.message import Message
from textual.strip import Strip

from ..fmt import GIB, axis_label, nice_step
from ._braille import codes_text, rasterise, to_codes
from ._strips import CachedStrips

AXIS_WIDTH = 9
"""Cells left of the plot for y labels, at least (shared with the phase band, so columns
align; a panel widens both for a longer process label, ``pid 4194304``)."""

MONO_MARK = {
    "nvml": "N",
    "reserved": "R",
    "allocated": "A",
    "predicted": "P",
    "peak": "E",
    "forecast": "F",
}
"""Without colour (``NO_COLOR``) every line carries its letter, repeated along it, and the
legend names it the same way: four greys alone cannot tell the lines apart."""
MONO_EVERY = 16
"""Cells between two of a line's letters."""


@dataclass
class Series:
    """One line of the chart: a theme role and per-dot-column low/high values (bytes)."""

    role: str
    lo: np.ndarray
    hi: np.ndarray


@dataclass
class ChartFrame:
    """What the chart draws for one window."""

    series: list[Series]
    ymax: float


Fetch = Callable[[int, int, int], ChartFrame]
"""``fetch(t0, t1, dot_columns) -> ChartFrame``."""


class TimelineChart(CachedStrips):
    """Memory lines over time with a GiB y axis, a time axis and a cursor.

    Args:
        fetch: Supplies the series for a window.
        origin: Time shown as zero on the time axis (``Session.t_origin``).
    """

    DEFAULT_CSS = """
    TimelineChart {
        height: 1fr;
        min-height: 5;
    }
    """

    class CursorSet(Message):
        """The user clicked the plot: put the cursor at ``t``."""

        def __init__(self, t: int) -> None:
            super().__init__()
            self.t = t

    class Zoom(Message):
        """The user turned the wheel over the plot: zoom by ``factor`` around ``t``."""

        def __init__(self, t: int, factor: float) -> None:
            super().__init__()
            self.t = t
            self.factor = factor

    class Pan(Message):
        """The user scrolled sideways: move the window by ``fraction`` of its width."""

        def __init__(self, fraction: float) -> None:
            super().__init__()
            self.fraction = fraction

    def __init__(self, fetch: Fetch, origin: int, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.fetch = fetch
        self.origin = origin
        self.window: tuple[int, int] = (origin, origin + 60 * 10**9)
        self.cursor: int | None = None
        self.data_version = 0
        self.last_frame: ChartFrame | None = None
        # The frame for (t0, t1, dot columns, data version), read with the rest of its
        # panel's frame (see :meth:`give`); a draw for another key fetches its own.
        self._given: tuple[tuple[int, int, int, int], ChartFrame] | None = None
        self.build_count = 0  # how often strips were rebuilt (tests check the cache)
        self.axis_width = AXIS_WIDTH
        self.unit = "bytes"  # or "%": how the y axis is labelled

    # ------------------------------------------------------------------ updates

    def update_view(self, window: tuple[int, int], cursor: int | None, data_version: int) -> None:
        """Set what to show; redraws only if something changed."""
        if (window, cursor, data_version) != (self.window, self.cursor, self.data_version):
            self.window, self.cursor, self.data_version = window, cursor, data_version
            self.refresh()

    def on_mount(self) -> None:
        self.watch(self.app, "theme", self._theme_changed, init=False)

    def _theme_changed(self) -> None:
        self.invalidate()

    def invalidate(self) -> None:
        """Drop the cached strips (a setting that is not part of the cache key changed)."""
        self.forget_strips()
        self.refresh()

    def forget_frame(self) -> None:
        """Fetch anew at the next draw (a setting the frame depends on changed)."""
        self._given = None
        self.invalidate()

    def dot_columns(self, axis_width: int) -> int:
        """Dot columns of the plot with ``axis_width`` cells of labels (0 before layout)."""
        plot_w, plot_h = self.size.width - axis_width, self.size.height - 1
        return plot_w * 2 if plot_w > 0 and plot_h > 0 else 0

    def holds(self, window: tuple[int, int], data_version: int, dots: int) -> bool:
        """Is the frame for ``window`` at ``data_version`` and ``dots`` columns held?"""
        return self._given is not None and self._given[0] == (*window, dots, data_version)

    def give(
        self, window: tuple[int, int], data_version: int, dots: int, frame: ChartFrame
    ) -> None:
        """The frame to draw ``window`` at ``data_version`` with ``dots`` columns."""
        self._given = ((*window, dots, data_version), frame)

    def frame_held(self) -> ChartFrame | None:
        """The frame given or fetched last (what the lines drawn next show), or None."""
        return self._given[1] if self._given is not None else self.last_frame

    def set_axis_width(self, width: int) -> None:
        """Cells left of the plot (the panel keeps it equal to the band's label column)."""
        if width != self.axis_width:
            self.axis_width = width
            self.invalidate()

    @property
    def plot_width(self) -> int:
        return max(0, self.size.width - self.axis_width)

    def x_to_time(self, x: int) -> int:
        """Time under cell column ``x`` of the widget."""
        t0, t1 = self.window
        col = min(max(x - self.axis_width, 0), max(self.plot_width - 1, 0))
        return int(t0 + (col + 0.5) * (t1 - t0) / max(self.plot_width, 1))

    def time_to_col(self, t: int) -> int | None:
        """Plot column of time ``t``, or None when outside the window."""
        t0, t1 = self.window
        w = self.plot_width
        if w <= 0 or not t0 <= t <= t1:
            return None
        return min(w - 1, int((t - t0) * w / max(t1 - t0, 1)))

    def on_click(self, event: events.Click) -> None:
        if event.x >= self.axis_width:
            self.post_message(self.CursorSet(self.x_to_time(event.x)))

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        event.stop()  # zoom, do not scroll the panel list
        self.post_message(self.Zoom(self.x_to_time(event.x), 0.8))

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        event.stop()
        self.post_message(self.Zoom(self.x_to_time(event.x), 1.25))

    def on_mouse_scroll_left(self, event: events.MouseScrollLeft) -> None:
        event.stop()
        self.post_message(self.Pan(-0.1))

    def on_mouse_scroll_right(self, event: events.MouseScrollRight) -> None:
        event.stop()
        self.post_message(self.Pan(0.1))

    # ------------------------------------------------------------------ drawing

    def strips_key(self, size: Size) -> object:
        return (self.window, self.cursor, self.data_version, size, self.app.theme)

    def _style(self, role: str) -> Style:
        variables = self.app.theme_variables
        return Style(color=variables.get(f"gw-{role}", "#ffffff"))

    def build_strips(self, size: Size) -> list[Strip]:
        self.build_count += 1
        width, height = size.width, size.height
        axis_w = self.axis_width
        plot_w, plot_h = width - axis_w, height - 1
        base = self.rich_style
        if plot_w <= 0 or plot_h <= 0:
            return [Strip.blank(width, base) for _ in range(height)]
        t0, t1 = self.window
        key = (t0, t1, plot_w * 2, self.data_version)
        if self._given is not None and self._given[0] == key:
            frame = self._given[1]
        else:  # a size the frame was not read for (a resize between frames)
            frame = self.fetch(t0, t1, plot_w * 2)
            self._given = (key, frame)
        self.last_frame = frame
        ymax = frame.ymax if frame.ymax > 0 else 1.0
        bits, owner = rasterise([(s.lo, s.hi) for s in frame.series], plot_w, plot_h, ymax)
        codes = to_codes(bits)
        # Index -1 (a blank cell) is the last entry: the widget's own style.
        styles = [base + self._style(s.role) for s in frame.series]
        axis_style = base + self._style("axis")
        cursor_col = self.time_to_col(self.cursor) if self.cursor is not None else None
        if cursor_col is not None:
            # The cursor is a vertical rule through the empty cells of its column.
            styles.append(base + self._style("cursor"))
            blank = bits[:, cursor_col] == 0
            owner[blank, cursor_col] = len(styles) - 1
            codes[blank, cursor_col] = ord("│")
        if self.app.no_color:
            _mark_lines(codes, owner, [s.role for s in frame.series])
        styles.append(base)
        rows = _runs(codes_text(codes), owner, styles)
        labels = _y_labels(ymax, plot_h) if self.unit == "bytes" else _pct_labels(ymax, plot_h)
        strips = []
        for row in range(plot_h):
            label = labels.get(row)
            axis = label.rjust(axis_w - 1) + "┤" if label else " " * (axis_w - 1) + "│"
            strips.append(Strip([Segment(axis, axis_style), *rows[row]], width))
        strips.append(Strip([Segment(self._time_axis(plot_w), axis_style)], width))
        return strips

    def _time_axis(self, plot_w: int) -> str:
        t0, t1 = self.window
        span = t1 - t0
        step = nice_step(span / 1e9, max(1, plot_w // 12)) * 1e9
        axis_w = self.axis_width
        line = [" "] * (axis_w + plot_w)
        line[axis_w - 1] = "└"
        for i in range(plot_w):
            line[axis_w + i] = "─"
        first = int(np.ceil((t0 - self.origin) / step))
        k = first
        while True:
            t = self.origin + k * step
            if t > t1:
                break
            col = int((t - t0) * plot_w / span)
            label = axis_label(t - self.origin, step)
            if col >= 0 and col + 1 + len(label) <= plot_w:  # whole labels only
                line[axis_w + col] = "┴"
                for j, ch in enumerate(label):
                    line[axis_w + col + 1 + j] = ch
            k += 1
        return "".join(line[: axis_w + plot_w])


def _mark_lines(codes: np.ndarray, owner: np.ndarray, roles: list[str]) -> None:
    """Put each line's letter (:data:`MONO_MARK`) on it, once every :data:`MONO_EVERY`
    cells, in place in the code points: the first cell it colours in each stretch (its
    highest there)."""
    for index, role in enumerate(roles):
        mark = MONO_MARK.get(role)
        if mark is None:
            continue
        mine = owner == index
        cols = np.flatnonzero(mine.any(axis=0))
        last = -MONO_EVERY
        for col in cols.tolist():
            if col - last < MONO_EVERY:
                continue
            last = col
            codes[int(np.argmax(mine[:, col])), col] = ord(mark)


def _y_labels(ymax: float, rows: int) -> dict[int, str]:
    """Row -> GiB label at 1-2-5 steps, top row included, no two labels adjacent."""
    gib = ymax / GIB
    step = _label_step(gib, rows)
    digits = 0 if step >= 1 else 1 if step >= 0.1 else 2
    return _labels(gib, rows, step, lambda v: f"{v:.{digits}f}G")


def _pct_labels(ymax: float, rows: int) -> dict[int, str]:
    """Row -> percentage label at 1-2-5 steps (a process's SM % and CPU %)."""
    return _labels(ymax, rows, _label_step(ymax, rows), lambda v: f"{v:g}%")


def _label_step(top: float, rows: int) -> float:
    # At least four steps asked for: a short chart (80x24) still gets three or four labels.
    return nice_step(top, max(4, rows // 3))


def _labels(top: float, rows: int, step: float, text: Callable[[float], str]) -> dict[int, str]:
    """Row -> ``text(v)`` for v = 0, step, 2 step … up to ``top``, no two labels adjacent."""
    labels: dict[int, str] = {}
    v = 0.0
    while v <= top * 1.0001:
        row = round((1 - v / top) * (rows - 1)) if top > 0 else rows - 1
        if all(abs(row - r) > 1 for r in labels):
            labels[row] = text(v)
        v += step
    return labels


def _runs(text: str, owner: np.ndarray, styles: list[Style]) -> list[list[Segment]]:
    """Segments of equal colour along each row, all rows at once.

    Args:
        text: The cells' characters, row after row (``owner.size`` of them).
        owner: Index into ``styles`` of each cell's style (height x width).
        styles: Styles by index; -1 takes the last one.

    Returns:
        One list of segments per row.
    """
    height, width = owner.shape
    if width == 0:
        return [[] for _ in range(height)]
    # A run starts at each row's first cell and wherever the owner changes. Row-major, the
    # next start is where a run ends: the next row's first cell ends the row's last run.
    start = np.empty((height, width), dtype=bool)
    start[:, 0] = True
    np.not_equal(owner[:, 1:], owner[:, :-1], out=start[:, 1:])
    flat = np.flatnonzero(start)
    starts = flat.tolist()
    ends = [*starts[1:], owner.size]
    # tuple.__new__ makes the Segment without the named tuple's Python-level __new__: a
    # redraw makes about a thousand of them.
    new = tuple.__new__
    segments = [
        new(Segment, (text[s:e], styles[i], None))
        for s, e, i in zip(starts, ends, owner.ravel()[flat].tolist(), strict=True)
    ]
    firsts = np.searchsorted(flat, np.arange(0, owner.size + 1, width)).tolist()
    return [segments[a:b] for a, b in pairwise(firsts)]
