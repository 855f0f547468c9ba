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


class BreakdownBar(Widget):
    """Two rows: the device's memory as coloured segments, then each segment's size."""

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
        parts = data.parts()
        scale = width / data.total
        bar = Text()
        used_cells = 0
        acc = 0.0
        for name, value in parts:
            acc += value
            cells = min(width, round(acc * scale)) - used_cells
            if cells <= 0:
                continue
            bar.append(" " * cells, Style(bgcolor=variables.get(THEME_VAR[name])))
            used_cells += cells
        if used_cells < width:
            bar.append("░" * (width - used_cells), Style(color=variables.get("gw-grid")))
        labels = Text()
        for name, value in parts:
            swatch = Style(color=variables.get(THEME_VAR[name]))
            labels.append("■", swatch)
            labels.append(f"{LABELS[name]} {fmt_short(value)} ")
        if data.unexplained is not None and data.unexplained < 0:
            labels.append("■", Style(color=variables.get("gw-unexplained")))
            labels.append(f"unexplained {fmt_short(data.unexplained)} ")
        if data.free is not None:  # the ░ of the bar above, named
            labels.append("░", Style(color=variables.get("gw-grid")))
            labels.append(f"free {fmt_short(data.free)}")
        labels.truncate(width, overflow="ellipsis")
        return Text("\n").join([bar, labels])
