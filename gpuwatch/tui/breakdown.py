"""The breakdown bar: one GPU's memory at the cursor, from other processes to free."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from ..fmt import fmt_short
from ..session.breakdown import Breakdown

LABELS = {
    "other": "other procs",
    "context": "context",
    "unclaimed": "unclaimed",
    "fragmented": "fragmented",
    "cache": "cache",
    "weights": "weights",
    "amp_copies": "amp",
    "gradients": "grads",
    "optimizer_state": "optim",
    "activations": "act",
    "temporaries": "tmp",
    "unexplained": "unexplained",
    "allocated": "allocated",
    "free": "free",
}
THEME_VAR = {
    "other": "gw-other-procs",
    "context": "gw-context",
    "unclaimed": "gw-other-procs",
    "fragmented": "gw-cache",
    "cache": "gw-cache",
    "weights": "gw-weights",
    "amp_copies": "gw-weights",
    "gradients": "gw-gradients",
    "optimizer_state": "gw-optimizer-state",
    "activations": "gw-activations",
    "temporaries": "gw-temporaries",
    "unexplained": "gw-unexplained",
    "allocated": "gw-allocated",
}
PATTERN = {"unclaimed": "▓", "fragmented": "▒"}
"""Segments drawn as a pattern in their colour (the rest are solid blocks): used memory no
process claims, and cache that fragmentation makes unusable."""

MONO_FILL = {
    "other": "o",
    "context": "x",
    "unclaimed": "▓",
    "fragmented": "▒",
    "cache": "c",
    "weights": "W",
    "amp_copies": "m",
    "gradients": "G",
    "optimizer_state": "O",
    "activations": "A",
    "temporaries": "T",
    "unexplained": "?",
    "allocated": "a",
}
"""Without colour (``NO_COLOR``) each segment is filled with its own character, the legend's
swatch: greys alone would merge weights with grads."""

OVER = "╳"
"""Drawn over the tail of the predicted categories that overruns what is allocated."""

_PREDICTED = frozenset(("weights", "amp_copies", "gradients", "optimizer_state"))
_PREDICTED |= {"activations", "temporaries"}


class BreakdownBar(Widget):
    """Two rows: the device's memory as coloured segments, then each segment's size.

    Nothing is scaled to fit: each segment is its own size; a prediction above what is
    allocated overruns it, drawn hatched (``╳``) and named "over-predicted".
    """

    DEFAULT_CSS = """
    BreakdownBar {
        height: 2;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.data: Breakdown | None = None

    def show(self, data: Breakdown | None) -> None:
        """Draw ``data`` (None hides the contents); nothing to do when it is unchanged."""
        if data != self.data:
            self.data = data
            self.refresh()

    def render(self) -> Text:
        data = self.data
        width = self.size.width
        if data is None or not data.total or width <= 0:
            return Text("")
        variables = self.app.theme_variables
        mono = self.app.no_color
        parts = data.parts()
        scale = width / data.total
        cells: list[tuple[str, Style]] = []
        acc = 0.0
        predicted_at = None  # where the predicted categories begin (bytes)
        for name, value in parts:
            if name in _PREDICTED and predicted_at is None:
                predicted_at = acc
            acc += value
            n = min(width, round(acc * scale)) - len(cells)
            if n <= 0:
                continue
            color = variables.get(THEME_VAR[name])
            if mono:
                cells += [(MONO_FILL[name], Style(color=color, bold=True))] * n
            elif name in PATTERN:
                cells += [(PATTERN[name], Style(color=color))] * n
            else:
                cells += [(" ", Style(bgcolor=color))] * n
        over = data.over_predicted
        if over > 0 and predicted_at is not None and data.allocated is not None:
            lo = round((predicted_at + data.allocated) * scale)
            hi = min(len(cells), round((predicted_at + data.allocated + over) * scale))
            mark = variables.get("gw-unexplained")
            for i in range(max(0, lo), hi):
                cells[i] = (OVER, cells[i][1] + Style(color=mark))
        bar = Text()
        for ch, style in cells:
            bar.append(ch, style)
        if len(cells) < width:
            bar.append("░" * (width - len(cells)), Style(color=variables.get("gw-grid")))
        labels = Text()
        for name, value in parts:
            swatch = Style(color=variables.get(THEME_VAR[name]))
            labels.append(MONO_FILL[name] if mono else PATTERN.get(name, "■"), swatch)
            labels.append(f"{LABELS[name]} {fmt_short(value)} ")
        if over > 0:
            labels.append(OVER, Style(color=variables.get("gw-unexplained")))
            labels.append(f"over-predicted {fmt_short(over)} ")
        if data.free is not None:  # the ░ of the bar above, named
            labels.append("░", Style(color=variables.get("gw-grid")))
            labels.append(f"free {fmt_short(data.free)}")
        labels.truncate(width, overflow="ellipsis")
        return Text("\n").join([bar, labels])
