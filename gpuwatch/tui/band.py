"""The phase band: one row per instrumented process under the chart, on the same time axis.

Each phase is a coloured run of cells named where there is room; nested phases draw over
their parents, so the innermost phase shows. Marks and OOMs are markers on the row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich.segment import Segment
from rich.style import Style
from textual.color import Color
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

from ..fmt import printable
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


BandFetch = Callable[[int, int], list[BandRow]]


class PhaseBand(Widget):
    """Phases of each instrumented process on a device, aligned with the chart above."""

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
        self._key: tuple[object, ...] | None = None
        self._strips: list[Strip] = []

    def update_view(self, window: tuple[int, int], cursor: int | None, data_version: int) -> None:
        """Set what to show; re-fetches rows and redraws only if something changed."""
        if (window, cursor, data_version) == (self.window, self.cursor, self.data_version):
            return
        self.window, self.cursor, self.data_version = window, cursor, data_version
        rows = self.fetch(*window)
        if len(rows) != len(self.rows):
            self.rows = rows
            self.refresh(layout=True)
        else:
            self.rows = rows
            self.refresh()
        self._key = None

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self.rows)

    def on_mount(self) -> None:
        self.watch(self.app, "theme", self._theme_changed, init=False)

    def _theme_changed(self) -> None:
        self._key = None
        self.refresh()

    def render_line(self, y: int) -> Strip:
        size = self.size
        key = (size, self.app.theme, id(self.rows))
        if key != self._key:
            self._strips = [self._row_strip(row, size.width) for row in self.rows]
            self._key = key
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(size.width, self.rich_style)

    def _row_strip(self, row: BandRow, width: int) -> Strip:
        variables = self.app.theme_variables
        base = self.rich_style
        plot_w = width - AXIS_WIDTH
        if plot_w <= 0:
            return Strip.blank(width, base)
        t0, t1 = self.window
        scale = plot_w / max(t1 - t0, 1)
        chars = [" "] * plot_w
        kinds: list[str | None] = [None] * plot_w
        owner = [-1] * plot_w
        placed: list[tuple[int, int, str]] = []
        # Inner phases over outer ones; among equals, longer ones last, so a cell that
        # holds several short phases shows the one that filled most of it.
        for span in sorted(row.spans, key=lambda s: (s.depth, s.t1 - s.t0)):
            c0 = max(0, int((span.t0 - t0) * scale))
            c1 = min(plot_w - 1, int((span.t1 - t0) * scale))
            if c1 < 0 or c0 > plot_w - 1 or c1 < c0:
                continue
            kind = phase_kind(span.name)
            index = len(placed)
            placed.append((c0, c1, span.name))
            for c in range(c0, c1 + 1):
                kinds[c] = kind
                owner[c] = index
        # Names go where their phase still shows, after every phase has taken its cells.
        for index, (c0, c1, name) in enumerate(placed):
            start = next((c for c in range(c0, c1 + 1) if owner[c] == index), None)
            if start is None:
                continue
            end = start
            while end + 1 <= c1 and owner[end + 1] == index:
                end += 1
            for j, ch in enumerate(_label(name, end - start + 1)):
                chars[start + j] = ch
        marker_cols: dict[int, str] = {}
        for m in row.markers:
            if t0 <= m.t <= t1:
                c = min(plot_w - 1, int((m.t - t0) * scale))
                if marker_cols.get(c) != "oom":
                    marker_cols[c] = m.level
        cursor_col = None
        if self.cursor is not None and t0 <= self.cursor <= t1:
            cursor_col = min(plot_w - 1, int((self.cursor - t0) * scale))
        styles: dict[tuple[str | None, str | None, bool], Style] = {}

        def style_for(kind: str | None, marker: str | None, cursor: bool) -> Style:
            key = (kind, marker, cursor)
            st = styles.get(key)
            if st is None:
                st = base
                if kind is not None:
                    bg = variables.get(f"gw-phase-{kind}", "#808080")
                    st = st + Style(bgcolor=bg, color=_contrast(bg, variables))
                if cursor:
                    st = st + Style(reverse=True)
                if marker is not None:
                    fg = variables.get("gw-oom" if marker == "oom" else "gw-mark", "#ffff00")
                    st = st + Style(color=fg, bold=True)
                styles[key] = st
            return st

        segments = [
            Segment(
                printable(row.label)[: AXIS_WIDTH - 1].ljust(AXIS_WIDTH - 1) + " ",
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
    except Exception:
        return fg
