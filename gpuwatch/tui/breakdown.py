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
    "unsplit": "not split",
    "fragmented": "fragmented",
    "cache": "cache",
    "weights": "weights",
    "amp_copies": "amp",
    "gradients": "grads",
    "optimizer_state": "optim",
    "activations": "act",
    "temporaries": "tmp",
    "ddp_buckets": "ddp",
    "fsdp_unsharded": "gather",
    "fsdp_reduce": "reduce",
    "unexplained": "unexplained",
    "allocated": "allocated",
    "free": "free",
}
THEME_VAR = {
    "other": "gw-other-procs",
    "context": "gw-context",
    "unclaimed": "gw-other-procs",
    "unsplit": "gw-other-procs",
    "fragmented": "gw-cache",
    "cache": "gw-cache",
    "weights": "gw-weights",
    "amp_copies": "gw-weights",
    "gradients": "gw-gradients",
    "optimizer_state": "gw-optimizer-state",
    "activations": "gw-activations",
    "temporaries": "gw-temporaries",
    "ddp_buckets": "gw-gradients",
    "fsdp_unsharded": "gw-weights",
    "fsdp_reduce": "gw-gradients",
    "unexplained": "gw-unexplained",
    "allocated": "gw-allocated",
}
PATTERN = {"unclaimed": "▓", "unsplit": "╱", "fragmented": "▒"}
"""Segments drawn as a pattern in their colour (the rest are solid blocks): used memory no
process claims, used memory the figures at the cursor cannot split, and cache that
fragmentation makes unusable."""


class BreakdownBar(Widget):
    """Two rows: the device's memory as coloured segments, then each segment's size.

    Nothing is scaled to fit: each segment is its own size, and they never add up to more
    than the used memory (see :meth:`Breakdown.parts`); a prediction above what can have
    been allocated is named "over-predicted" after the segments.
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
        parts = data.parts()
        scale = width / data.total
        cells: list[tuple[str, Style]] = []
        acc = 0.0
        for name, value in parts:
            acc += value
            n = min(width, round(acc * scale)) - len(cells)
            if n <= 0:
                continue
            color = variables.get(THEME_VAR[name])
            if name in PATTERN:
                cells += [(PATTERN[name], Style(color=color))] * n
            else:
                cells += [(" ", Style(bgcolor=color))] * n
        over = data.over_predicted
        bar = Text()
        for ch, style in cells:
            bar.append(ch, style)
        if len(cells) < width:
            bar.append("░" * (width - len(cells)), Style(color=variables.get("gw-grid")))
        labels = Text()
        for name, value in parts:
            swatch = Style(color=variables.get(THEME_VAR[name]))
            labels.append(PATTERN.get(name, "■"), swatch)
            why = f" ({data.why})" if name == "unsplit" and data.why else ""
            labels.append(f"{LABELS[name]} {fmt_short(value)}{why} ")
        above = data.above()
        if above:  # not on the bar: the phase reached it, but not at the cursor
            labels.append("▲", Style(color=variables.get(THEME_VAR[above[0][0]])))
            cut = " ".join(f"{LABELS[name]} {fmt_short(v)}" for name, v in above)
            labels.append(f"phase peak +{fmt_short(data.headroom)}: {cut} ")
        if over > 0:  # not on the bar: it is no memory the device holds
            labels.append(f"over-predicted {fmt_short(over)} ", variables.get("gw-unexplained"))
        if data.free is not None:  # the ░ of the bar above, named
            labels.append("░", Style(color=variables.get("gw-grid")))
            labels.append(f"free {fmt_short(data.free)}")
        labels.truncate(width, overflow="ellipsis")
        return Text("\n").join([bar, labels])
