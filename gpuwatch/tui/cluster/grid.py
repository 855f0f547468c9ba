"""The GPU grid: a line per host, then one per GPU, drawn only where it changed.

:func:`grid_rows` lays the cluster out as styled runs (columns aligned over the whole
grid, dropped by :data:`~gpuwatch.cluster.text.DROP_ORDER` to fit); :class:`Grid` shows
them. :class:`GridRows` formats again only the GPUs whose figures changed, and a refresh hands
the grid every row, but only the rows whose text or style changed lose their painted
strip and are repainted: at 64 hosts most of a screen's rows are the same from one
refresh to the next, and laying out and painting every row each refresh cost most of the
view's CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from ...cluster import STALE, Cluster, Gpu
from ...cluster.text import HEAD, cell_columns, fit_columns, label
from ...fmt import ellipsis, printable
from .._strips import ROW_KEYS
from ..keymap import CLUSTER_IDS

Run = tuple[str, "Style | None"]
"""A styled run of a row: its text (printable, already padded) and its style."""
Runs = tuple[Run, ...]
"""A grid row's runs, left to right."""


class Row:
    """A grid row: its runs, made when first painted (a screen shows a few dozen of the
    hundreds of rows). Two rows are equal when they are one object or their runs, both
    made, are equal."""

    __slots__ = ("_make", "_runs", "width")

    def __init__(
        self, width: int, runs: Runs | None = None, make: Callable[[], Runs] | None = None
    ):
        self.width = width
        self._runs = runs
        self._make = make

    @property
    def made(self) -> bool:
        """Whether its runs were made (it was painted, or compared once made)."""
        return self._runs is not None

    @property
    def runs(self) -> Runs:
        if self._runs is None:
            self._runs = self._make() if self._make is not None else ()
        return self._runs

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Row) or self._runs is None or other._runs is None:
            return False
        return self._runs == other._runs


MEMORY, STATE = HEAD.index("memory"), HEAD.index("state")

CURSOR = Style(reverse=True)
CURSOR_BLURRED = Style(underline=True)
STYLES = {
    name: Style.parse(name) if name else None
    for name in ("", "bold", "dim", "red", "yellow", "green", "bold red")
}
STATE_STYLES = {"ok": "", "lost": "bold red", "stale": "yellow"}


@dataclass(frozen=True)
class Layout:
    """The grid's rows and the header line over them."""

    head: str
    rows: list[tuple[str, Row]]


def _gpu_styles(g: Gpu) -> tuple[str, ...]:
    bar = "red" if g.fill > 0.95 else "yellow" if g.fill > 0.85 else "green"
    styles = [""] * len(HEAD)
    styles[MEMORY] = bar if g.state == "ok" else "dim"
    styles[STATE] = STATE_STYLES.get(g.state, "")
    return tuple(styles)


def _signature(g: Gpu) -> tuple[object, ...] | None:
    """What a GPU's row is made of (None: a stale cell, whose age moves each second)."""
    if g.state == STALE:
        return None
    return (
        g.index, g.used, g.total, g.util, g.temp, g.power, g.others, g.ranks, g.phase,
        g.step, g.peak, g.predicted, g.state,
    )  # fmt: skip


@dataclass
class _Cells:
    """A GPU row's columns and styles, for the signature they were made from."""

    signature: tuple[object, ...] | None
    columns: list[str]
    lengths: tuple[int, ...]
    styles: tuple[str, ...]
    fitted: tuple[tuple[int, ...], Row] | None = None
    """The row's runs for the widths (per column kept, 0 for dropped) it was fitted to."""
    live: tuple[tuple[int, ...], Row] | None = None
    """Out of view: the row formatted when painted, for the widths it was made for (kept
    while not painted: its GPU's figures are read then)."""


class GridRows:
    """Lays the cluster out as grid rows, remembering each GPU's row between refreshes:
    a GPU whose figures did not change is not formatted again, and keeps the very row
    object it had (which :meth:`Grid.set_rows` sees as unchanged at once).

    Only the rows in view (``shown``) are formatted again when their figures move: at 64
    hosts a screen shows a few dozen of 576 rows, whose figures all move each second. A
    row out of view keeps the lengths it was last formatted with for the columns' widths
    (a GPU seen for the first time is formatted wherever it is), and is formatted from
    its GPU's figures as they are if it is painted before the next layout (a scroll lays
    the grid out again: :class:`Grid.Scrolled`)."""

    def __init__(self) -> None:
        self._cells: dict[str, _Cells] = {}

    def layout(
        self,
        cluster: Cluster,
        sort: str,
        text: str,
        room: int,
        now: float,
        shown: range | None = None,
    ) -> Layout:
        """The grid for ``cluster`` as ``sort`` orders it and ``text`` filters it, its
        columns fitted to ``room`` cells, the rows of ``shown`` (row indices; None: all)
        formatted afresh; row keys are ``host\0NAME`` and ``gpu\0HOST:INDEX``."""
        hosts: list[tuple[str, Row]] = []
        gpus: list[tuple[str, _Cells]] = []
        order: list[tuple[bool, int]] = []  # (is a GPU, its index in hosts or gpus)
        cells_now: dict[str, _Cells] = {}
        hidden: dict[int, Gpu] = {}  # index in gpus -> the GPU, of rows out of view
        for host, group in cluster.cells(sort, text):
            note = printable(cluster.host_note(group))
            style = "bold red" if "lost:" in note else "dim"
            order.append((False, len(hosts)))
            hosts.append((f"host\x00{host}", _host_row(host, note, style)))
            for g in group:
                key = g.key
                cells = self._cells.get(key)
                if cells is not None and shown is not None and len(order) not in shown:
                    hidden[len(gpus)] = g  # its lengths as last formatted
                else:
                    sig = _signature(g)
                    if cells is None or sig is None or cells.signature != sig:
                        cells = _format(g, sig, now)
                cells_now[key] = cells
                order.append((True, len(gpus)))
                gpus.append((f"gpu\x00{key}", cells))
        self._cells = cells_now  # the GPUs filtered out or gone are formatted again
        for host, note in cluster.lost_lines(text):
            order.append((False, len(hosts)))
            hosts.append((f"host\x00{host}", _host_row(host, printable(note), "bold red")))
        widths = list(map(max, zip(map(len, HEAD), *(c.lengths for _, c in gpus), strict=True)))
        keep, widths = fit_columns(widths, room)
        head = " " + "  ".join(HEAD[k].ljust(w)[:w] for k, w in zip(keep, widths, strict=True))
        fit = [0] * len(HEAD)
        for k, w in zip(keep, widths, strict=True):
            fit[k] = w
        fitted = tuple(fit)
        row_width = 1 + sum(widths) + 2 * (len(widths) - 1)
        rows: list[tuple[str, Row]] = []
        for is_gpu, i in order:
            if not is_gpu:
                rows.append(hosts[i])
                continue
            key, cells = gpus[i]
            out_of_view = hidden.get(i)
            if out_of_view is not None:  # painted only if scrolled to before the next layout
                if cells.live is None or cells.live[0] != fitted or cells.live[1].made:
                    make = partial(_fit_live, out_of_view, keep, widths)
                    cells.live = (fitted, Row(row_width, make=make))
                rows.append((key, cells.live[1]))
                continue
            if cells.fitted is None or cells.fitted[0] != fitted:
                cells.fitted = (fitted, Row(row_width, make=partial(_fit, cells, keep, widths)))
            rows.append((key, cells.fitted[1]))
        return Layout(head, rows)


def _format(g: Gpu, sig: tuple[object, ...] | None, now: float) -> _Cells:
    cols = cell_columns(g, now)
    cols[0] = "  " + cols[0]
    return _Cells(sig, cols, tuple(map(len, cols)), _gpu_styles(g))


def _fit_live(g: Gpu, keep: list[int], widths: list[int]) -> Runs:
    """A row out of view at the layout, formatted when painted (its figures as they are)."""
    return _fit(_format(g, None, time.time()), keep, widths)


def _fit(cells: _Cells, keep: list[int], widths: list[int]) -> Runs:
    """A GPU row's runs: its kept columns cut or padded to their widths, neighbours of
    one style joined (most columns have none: a row is then a handful of segments to
    paint rather than two per column)."""
    runs: list[Run] = []
    text, style = " ", None
    for k, w in zip(keep, widths, strict=True):
        cell, st = ellipsis(cells.columns[k], w).ljust(w), STYLES[cells.styles[k]]
        if st is style:
            text += cell + "  "
            continue
        runs.append((text, style))
        text, style = cell, st
        if st is None:
            text += "  "
        else:
            runs.append((text, style))
            text, style = "  ", None
    runs.append((text[:-2] if style is None and text.endswith("  ") else text, style))
    return tuple(r for r in runs if r[0])


def grid_rows(cluster: Cluster, sort: str, text: str, room: int, now: float) -> Layout:
    """The grid for ``cluster`` laid out once (:class:`GridRows` for a view that refreshes)."""
    return GridRows().layout(cluster, sort, text, room, now)


def _host_row(host: str, note: str, style: str) -> Row:
    name = " " + label(host, 40)
    runs: Runs = ((name, STYLES["bold"]), ("  ", None), (note, STYLES[style]))
    return Row(len(name) + 2 + len(note), runs)


class Grid(ScrollView, can_focus=True):
    """The GPU rows, drawn line by line: only the rows in view are painted, and of those
    only the ones a refresh changed.

    A DataTable re-laid-out its whole table at each cell update: 128 GPUs took seconds of
    CPU a refresh. ``up``/``down``/``pageup``/``pagedown``/``home``/``end`` move the
    cursor, ``enter`` opens the row's host.
    """

    BINDINGS = [
        *ROW_KEYS,
        Binding("home", "move(-1000000)", "First row", show=False),
        Binding("end", "move(1000000)", "Last row", show=False),
        Binding(
            "enter",
            "open",
            "Open host",
            show=False,
            id=CLUSTER_IDS["open"],
            tooltip="the selected host's timelines (escape: back)",
        ),
    ]

    class Opened(Message):
        """Enter on a row (its key)."""

        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key

    class Scrolled(Message):
        """Other rows came into view: the grid's owner lays them out afresh."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.rows: list[tuple[str, Row]] = []
        self.cursor = 0
        self._strips: dict[int, tuple[int, bool, Strip]] = {}
        self._base: Style | None = None  # rich_style while render_lines paints

    @property
    def selected(self) -> str | None:
        """The key of the row under the cursor (None: no rows)."""
        return self.rows[self.cursor][0] if 0 <= self.cursor < len(self.rows) else None

    def set_rows(self, rows: list[tuple[str, Row]]) -> None:
        """Show ``rows``; the cursor stays on the same key where it still is, and only
        the rows that changed are painted again."""
        key, before = self.selected, self.cursor
        old = self.rows
        self.rows = rows
        if key is not None and (self.cursor >= len(rows) or rows[self.cursor][0] != key):
            keys = [k for k, _ in rows]
            self.cursor = keys.index(key) if key in keys else min(self.cursor, len(rows) - 1)
        self.cursor = max(0, self.cursor)
        width = max((r.width for _, r in rows), default=0)
        size = Size(width, len(rows))
        if size != self.virtual_size:  # a new size lays the screen out again
            self.virtual_size = size
        changed = {i for i, row in enumerate(rows) if i >= len(old) or old[i] != row}
        if self.cursor != before:  # the cursor's style moves with its row
            changed |= {before, self.cursor}
        for i in changed:
            self._strips.pop(i, None)
        for i in range(len(rows), len(old)):
            self._strips.pop(i, None)
        top, height = self.scroll_offset.y, self.size.height
        shown = sorted(i for i in changed if top <= i < top + height)
        if len(rows) < len(old) and len(old) > top:
            self.refresh()  # rows past the new end are blank now
        elif shown:
            self.refresh_lines(shown[0], shown[-1] - shown[0] + 1)

    def shown(self) -> range | None:
        """The rows in view and half a screen either side (None: not laid out yet)."""
        height = self.size.height
        if not height:
            return None
        top = self.scroll_offset.y
        return range(max(0, top - height // 2), top + height + height // 2)

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if round(old_value) != round(new_value):
            self.post_message(self.Scrolled())

    def _repaint_cursor(self, before: int) -> None:
        for i in {before, self.cursor}:
            self._strips.pop(i, None)
            self.refresh_line(i)

    def render_lines(self, crop: Region) -> list[Strip]:
        # The widget's style, worked out once for the lines of this paint: each reading
        # walks every ancestor's styles, and was a third of painting the changed rows.
        self._base = self.rich_style
        try:
            return super().render_lines(crop)
        finally:
            self._base = None

    def _style(self) -> Style:
        return self._base if self._base is not None else self.rich_style

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.size.width
        if index >= len(self.rows):
            return Strip.blank(width, self._style())
        selected = index == self.cursor and self.has_focus
        cached = self._strips.get(index)
        if cached is not None and cached[0] == width + scroll_x and cached[1] == selected:
            strip = cached[2]
        else:
            base = self._style()
            if index == self.cursor:
                base += CURSOR if self.has_focus else CURSOR_BLURRED
            segments = [
                Segment(t, base + st if st is not None else base)
                for t, st in self.rows[index][1].runs
            ]
            strip = Strip(segments).crop_extend(0, width + scroll_x, base)
            self._strips[index] = (width + scroll_x, selected, strip)
        return strip.crop(scroll_x, scroll_x + width)

    def on_focus(self) -> None:
        self._repaint_cursor(self.cursor)

    def on_blur(self) -> None:
        self._repaint_cursor(self.cursor)

    def action_move(self, delta: int) -> None:
        if not self.rows:
            return
        before = self.cursor
        self.cursor = max(0, min(len(self.rows) - 1, self.cursor + delta))
        self.scroll_to_region(Region(0, self.cursor, 1, 1), animate=False)
        self._repaint_cursor(before)

    def action_page(self, direction: int) -> None:
        self.action_move(direction * max(1, self.size.height - 1))

    def action_open(self) -> None:
        if self.selected is not None:
            self.post_message(self.Opened(self.selected))

    def on_click(self, event: events.Click) -> None:
        index = self.scroll_offset.y + event.y
        if 0 <= index < len(self.rows):
            if index == self.cursor and event.chain > 1:
                self.action_open()
            before, self.cursor = self.cursor, index
            self._repaint_cursor(before)
