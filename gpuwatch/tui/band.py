"""The phase band: one row per instrumented process under the chart, on the same time axis.

Each phase is a coloured run of cells named where there is room; nested phases draw over
their parents, so the innermost phase shows. Marks and OOMs are markers on the row. Many
processes fold into a ``+N more`` row; a key under the rows names the colours.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from rich.segment import Segment
from rich.style import Style
from textual.color import Color, ColorParseError
from textual.geometry import Size
from textual.strip import Strip

from ..fmt import printable
from ..session import Process
from ._strips import CachedStrips
from .chart import AXIS_WIDTH

PHASE_KINDS = ("data", "forward", "backward", "optimizer", "zero-grad", "eval", "other")


def phase_kind(name: str) -> str:
    """The colour family of a phase name (``optimizer.step`` -> ``optimizer``, ...)."""
    n = name.lower()
    if n.startswith("optimizer") or n in ("step", "opt.step", "optim"):
        return "optimizer"
    if n in ("forward", "fwd") or n.startswith("forward"):
        return "forward"
    if n in ("backward", "bwd") or n.startswith("backward"):
        return "backward"
    if "zero_grad" in n or "zero-grad" in n:
        return "zero-grad"
    if n.startswith(("eval", "val", "test", "predict")):
        return "eval"
    if n.startswith(("data", "load", "batch", "fetch")):
        return "data"
    return "other"


@dataclass
class BandSpan:
    """A phase to draw: ``t1`` None while it is still running."""

    name: str
    t0: int
    t1: int
    depth: int


def process_spans(
    proc: Process, names: list[str], t0: int, t1: int, cells: int, now: int
) -> list[BandSpan]:
    """A process's phases in ``[t0, t1]`` as a band of ``cells`` shows them: the ended
    spans its table keeps for that width, then the open ones drawn up to ``now``."""
    cols = proc.band_spans(t0, t1, cells)
    spans = [  # Python ints first: a window can hold a thousand spans
        BandSpan(names[n], a, b, d)
        for n, a, b, d in zip(
            cols["name"].tolist(),
            cols["t0"].tolist(),
            cols["t1"].tolist(),
            cols["depth"].tolist(),
            strict=True,
        )
    ]
    spans += [
        BandSpan(o.name, o.t0, max(o.t0, now), o.depth)
        for o in list(proc.open.values())
        if o.t0 <= t1
    ]
    return spans


@dataclass
class BandMarker:
    """A point on a row: a mark (``level``) or an OOM (``level == "oom"``)."""

    t: int
    level: str


@dataclass
class BandRow:
    """One process's row."""

    label: str
    spans: list[BandSpan]
    markers: list[BandMarker]


BandFetch = Callable[[int, int, int], list[BandRow]]
"""``fetch(t0, t1, cells)``: the rows a band of ``cells`` columns shows over ``[t0, t1]``."""

FRAME = 3
"""Columns of a device panel around its band (border and right padding): before its first
layout, a band takes the screen's width less these as its own."""

MAX_ROWS = 6
"""Process rows a band shows before the rest fold into one ``+N more`` row."""


def fold_rows(rows: list[BandRow], limit: int) -> list[BandRow]:
    """At most ``limit`` rows: past it, the rest become one ``+N more`` row.

    The folded row carries the others' marks and OOMs (an OOM is never hidden) but none of
    their phases: overlaid, several processes' phases would read as one process's.
    """
    limit = max(1, limit)
    if len(rows) <= limit:
        return rows
    kept, rest = rows[: limit - 1], rows[limit - 1 :]
    markers = [m for row in rest for m in row.markers]
    return [*kept, BandRow(f"+{len(rest)} more", [], markers)]


def label_width(rows: list[BandRow]) -> int:
    """The label column the rows need (never narrower than the chart's y axis)."""
    return max([AXIS_WIDTH, *(len(printable(r.label)) + 1 for r in rows)])


def span_cells(t0: int, t1: int, w0: int, scale: float, plot_w: int) -> tuple[int, int] | None:
    """First and last cell of a span: each cell goes to the span covering most of it.

    Adjacent spans share no cell (a boundary falls in the cell of whichever side holds more
    of it), so a phase gets all the room its length earns; one shorter than half a cell
    still gets one cell, so nothing vanishes.
    """
    c0 = round((t0 - w0) * scale)
    c1 = round((t1 - w0) * scale) - 1
    c1 = max(c1, c0)
    if c1 < 0 or c0 > plot_w - 1:
        return None
    return max(0, c0), min(plot_w - 1, c1)


class PhaseBand(CachedStrips):
    """Phases of each instrumented process on a device, aligned with the chart above.

    Below the rows, a key names the phases in view in their colours, and the markers.
    """

    DEFAULT_CSS = """
    PhaseBand {
        height: auto;
    }
    """

    def __init__(self, fetch: BandFetch, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.fetch = fetch
        self.window: tuple[int, int] = (0, 1)
        self.cursor: int | None = None
        self.data_version = 0
        self.rows: list[BandRow] = []
        self.max_rows = MAX_ROWS
        self.axis_width = AXIS_WIDTH
        self._cells = 0  # the plot width the rows were fetched for

    def plot_cells(self) -> int:
        """Columns of the band's time axis (right of the labels).

        Before the first layout the band has no width: it takes the screen's (less a
        panel's frame) rather than fetch every span in the window, which a long window
        of a busy process would make thousands (a 1 h recording's first frame: 9000 a
        process); the layout's resize then fetches again for the real width.
        """
        width = self.size.width or self.app.size.width - FRAME
        return max(width - self.axis_width, 1)

    def update_view(self, window: tuple[int, int], cursor: int | None, data_version: int) -> None:
        """Set what to show; re-fetches rows and redraws only if something changed."""
        cells = self.wants(window, cursor, data_version)
        if cells is not None:
            self.take(window, cursor, data_version, cells, self.fetch(*window, cells))

    def wants(self, window: tuple[int, int], cursor: int | None, data_version: int) -> int | None:
        """The plot cells to fetch rows for to show ``window``, or None when the rows
        shown stand (nothing changed)."""
        cells = self.plot_cells()
        if (window, cursor, data_version, cells) == (
            self.window,
            self.cursor,
            self.data_version,
            self._cells,
        ):
            return None
        return cells

    def take(
        self,
        window: tuple[int, int],
        cursor: int | None,
        data_version: int,
        cells: int,
        rows: list[BandRow],
    ) -> None:
        """Show ``rows``, fetched for ``window`` at ``data_version`` and ``cells`` columns."""
        self.window, self.cursor, self.data_version = window, cursor, data_version
        self._cells = cells
        self.set_rows(rows)

    def _fetch(self, cells: int) -> None:
        self._cells = cells
        self.set_rows(self.fetch(*self.window, cells))

    def on_resize(self) -> None:
        # Rows past four spans a cell are the winners of cells of the old width: a
        # different width has different winners.
        cells = self.plot_cells()
        if self.rows and cells != self._cells:
            self._fetch(cells)

    def set_rows(self, rows: list[BandRow]) -> None:
        """Show ``rows`` (folded to :attr:`max_rows`)."""
        rows = fold_rows(rows, self.max_rows)
        if len(rows) != len(self.rows):
            self.rows = rows
            self.refresh(layout=True)
        else:
            self.rows = rows
            self.refresh()
        self.forget_strips()

    def set_max_rows(self, limit: int) -> None:
        """Fold past ``limit`` rows from the next update on (the layout changed)."""
        if limit != self.max_rows:
            self.max_rows = limit
            self.data_version = -1  # re-fetch at the next update

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self.rows) + 1 if self.rows else 0

    def on_mount(self) -> None:
        self.watch(self.app, "theme", self._theme_changed, init=False)

    def _theme_changed(self) -> None:
        self.forget_strips()
        self.refresh()

    def strips_key(self, size: Size) -> object:
        return (size, self.app.theme, id(self.rows), self.axis_width)

    def build_strips(self, size: Size) -> list[Strip]:
        strips = [self._row_strip(row, size.width) for row in self.rows]
        if self.rows:
            strips.append(self._key_strip(size.width))
        return strips

    def _phase_style(self, kind: str) -> Style:
        variables = self.app.theme_variables
        bg = variables.get(f"gw-phase-{kind}", "#808080")
        return self.rich_style + Style(bgcolor=bg, color=_contrast(bg, variables))

    def _key_strip(self, width: int) -> Strip:
        """``phases`` and each name in view in its colour, then what ◆ and ✖ mean."""
        variables = self.app.theme_variables
        base = self.rich_style
        muted = base + Style(color=variables.get("gw-axis"))
        t0, t1 = self.window
        names: dict[str, str] = {}
        levels: set[str] = set()
        for row in self.rows:
            for span in sorted(row.spans, key=lambda sp: sp.t0):
                if span.t1 >= t0 and span.t0 <= t1 and span.name not in names:
                    names[span.name] = phase_kind(span.name)
            levels |= {m.level for m in row.markers if t0 <= m.t <= t1}
        segments = [Segment("phases".ljust(self.axis_width), muted)]
        used = self.axis_width
        items = [(f" {printable(name)} ", self._phase_style(kind)) for name, kind in names.items()]
        tail = []
        if levels - {"oom"}:
            tail.append(("  ◆ mark", base + Style(color=variables.get("gw-mark"), bold=True)))
        if "oom" in levels:
            tail.append(("  ✖ OOM", base + Style(color=variables.get("gw-oom"), bold=True)))
        room = width - used - sum(len(t) for t, _ in tail)
        for i, (text, style) in enumerate(items):
            gap = 1 if i else 0
            rest = len(items) - i - 1
            if len(text) + gap + (2 if rest else 0) > room:
                segments.append(Segment(" …", muted))
                room -= 2
                break
            if gap:
                segments.append(Segment(" ", base))
            segments.append(Segment(text, style))
            room -= len(text) + gap
        segments += [Segment(text, style) for text, style in tail]
        return Strip(segments).adjust_cell_length(width, base)

    def _cell_style(self, kind: str | None, marker: str | None, cursor: bool) -> Style:
        """A cell's style: its phase's colour, reversed under the cursor, a marker's on top."""
        st = self.rich_style if kind is None else self._phase_style(kind)
        if cursor:
            st = st + Style(reverse=True)
        if marker is not None:
            fg = self.app.theme_variables.get("gw-oom" if marker == "oom" else "gw-mark", "#ffff00")
            st = st + Style(color=fg, bold=True)
        return st

    def _row_strip(self, row: BandRow, width: int) -> Strip:
        variables = self.app.theme_variables
        base = self.rich_style
        axis_w = self.axis_width
        plot_w = width - axis_w
        if plot_w <= 0:
            return Strip.blank(width, base)
        t0, t1 = self.window
        scale = plot_w / max(t1 - t0, 1)
        kinds, owner, placed = _place(row.spans, t0, scale, plot_w)
        marker_cols: dict[int, str] = {}
        for m in row.markers:
            if t0 <= m.t <= t1:
                c = min(plot_w - 1, int((m.t - t0) * scale))
                if marker_cols.get(c) != "oom":
                    marker_cols[c] = m.level
        chars = _names(placed, owner, marker_cols)
        cursor_col = None
        if self.cursor is not None and t0 <= self.cursor <= t1:
            cursor_col = min(plot_w - 1, int((self.cursor - t0) * scale))
        styles: dict[tuple[str | None, str | None, bool], Style] = {}

        def style_for(kind: str | None, marker: str | None, cursor: bool) -> Style:
            key = (kind, marker, cursor)
            st = styles.get(key)
            if st is None:
                st = styles[key] = self._cell_style(kind, marker, cursor)
            return st

        segments = [
            Segment(
                printable(row.label)[: axis_w - 1].ljust(axis_w - 1) + " ",
                base + Style(color=variables.get("gw-axis")),
            )
        ]
        run_text: list[str] = []
        run_key: tuple[str | None, str | None, bool] | None = None
        for c in range(plot_w):
            marker = marker_cols.get(c)
            ch = ("✖" if marker == "oom" else "◆") if marker else chars[c]
            key = (kinds[c], marker, c == cursor_col)
            if key != run_key and run_text:
                segments.append(Segment("".join(run_text), style_for(*run_key)))  # type: ignore[misc]
                run_text = []
            run_key = key
            run_text.append(ch)
        if run_text and run_key is not None:
            segments.append(Segment("".join(run_text), style_for(*run_key)))
        return Strip(segments, width)


def _place(
    spans: Iterable[BandSpan], t0: int, scale: float, plot_w: int
) -> tuple[list[str | None], list[int], list[tuple[int, int, str]]]:
    """Each cell's phase kind and owner (an index into the placed phases, -1: none), and
    the placed phases' first and last cells and names."""
    kinds: list[str | None] = [None] * plot_w
    owner = [-1] * plot_w
    placed: list[tuple[int, int, str]] = []
    # Inner phases over outer ones; among equals, longer ones last, so a cell that
    # holds several short phases shows the one that filled most of it.
    for span in sorted(spans, key=lambda s: (s.depth, s.t1 - s.t0)):
        cells = span_cells(span.t0, span.t1, t0, scale, plot_w)
        if cells is None:
            continue
        c0, c1 = cells
        kind = phase_kind(span.name)
        index = len(placed)
        placed.append((c0, c1, span.name))
        for c in range(c0, c1 + 1):
            kinds[c] = kind
            owner[c] = index
    return kinds, owner, placed


def _names(
    placed: list[tuple[int, int, str]], owner: list[int], marker_cols: Mapping[int, str]
) -> list[str]:
    """The row's characters: each phase's name where it still shows, after every phase
    has taken its cells, in its longest stretch of cells free of markers."""
    plot_w = len(owner)
    chars = [" "] * plot_w
    for index, (c0, c1, name) in enumerate(placed):
        start, room = _longest_stretch(owner, index, c0, c1, marker_cols)
        after = start + room
        if after < plot_w and owner[after] not in (-1, index):
            room -= 1  # a cell between this name and the next phase's: never `backwardopt`
        for j, ch in enumerate(_label(name, room)):
            chars[start + j] = ch
    return chars


def _longest_stretch(
    owner: list[int], index: int, c0: int, c1: int, marker_cols: Mapping[int, str]
) -> tuple[int, int]:
    """The first cell and length of the longest run in ``c0..c1`` that phase ``index``
    owns and no marker takes ((0, 0): none)."""
    best = (0, 0)
    c = c0
    while c <= c1:
        if owner[c] != index or c in marker_cols:
            c += 1
            continue
        end = c
        while end + 1 <= c1 and owner[end + 1] == index and end + 1 not in marker_cols:
            end += 1
        if end - c + 1 > best[1]:
            best = (c, end - c + 1)
        c = end + 1
    return best


SHORT_NAMES = {
    "forward": "fwd",
    "backward": "bwd",
    "optimizer.step": "opt",
    "zero_grad": "zg",
    "data": "dat",
    "eval": "ev",
}


def _label(name: str, room: int) -> str:
    """The phase's name if it fits in ``room`` cells, else a short form, else nothing."""
    name = printable(name)  # a name is the script's word: no escape reaches the terminal
    if len(name) <= room:
        return name
    short = SHORT_NAMES.get(name)
    if short and len(short) <= room:
        return short
    return name[: room - 1] + "…" if room >= 4 else ""


def _contrast(color: str, variables: dict[str, str]) -> str:
    """The theme's background or foreground colour, whichever reads better on ``color``."""
    fg, bg = variables.get("foreground", "#ffffff"), variables.get("background", "#000000")
    try:
        dark_text, light_text = sorted((fg, bg), key=lambda c: Color.parse(c).brightness)
        return dark_text if Color.parse(color).brightness > 0.55 else light_text
    except ColorParseError:  # a theme's colour that Textual cannot read
        return fg
