"""The breakdown bar: one GPU's memory at the cursor, from other processes to free."""

from __future__ import annotations

import math

from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from ..analysis.breakdown import Breakdown
from ..fmt import fmt_short

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
    "zero_master": "master",
    "zero_buckets": "zbucket",
    "zero_gathered": "zgather",
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
    "zero_master": "gw-optimizer-state",
    "zero_buckets": "gw-gradients",
    "zero_gathered": "gw-weights",
    "unexplained": "gw-unexplained",
    "allocated": "gw-allocated",
}
PATTERN = {"unclaimed": "▓", "unsplit": "╱", "fragmented": "▒"}
"""Segments drawn as a pattern in their colour (the rest are solid blocks): used memory no
process claims, used memory the figures at the cursor cannot split, and cache that
fragmentation makes unusable."""

MONO_FILL = {
    "other": "o",
    "context": "x",
    "unclaimed": "▓",
    "unsplit": "╱",
    "fragmented": "▒",
    "cache": "c",
    "weights": "W",
    "amp_copies": "m",
    "gradients": "G",
    "optimizer_state": "O",
    "activations": "A",
    "temporaries": "T",
    "ddp_buckets": "D",
    "fsdp_unsharded": "U",
    "fsdp_reduce": "R",
    "zero_master": "M",
    "zero_buckets": "Z",
    "zero_gathered": "g",
    "unexplained": "?",
    "allocated": "a",
}
"""Without colour (``NO_COLOR``) each segment is filled with its own character, the legend's
swatch: greys alone would merge weights with grads."""

FINDINGS = frozenset(("fragmented", "unexplained", "unsplit"))
"""Segments the legend keeps whatever their size, as it keeps free and over-predicted."""

OVER = "╳"
"""The legend's mark for a prediction above what can have been allocated (not on the bar:
it is no memory the device holds)."""


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
        mono = self.app.no_color
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
            if mono:
                cells += [(MONO_FILL[name], Style(color=color, bold=True))] * n
            elif name in PATTERN:
                cells += [(PATTERN[name], Style(color=color))] * n
            else:
                cells += [(" ", Style(bgcolor=color))] * n
        over = data.over_predicted
        bar = Text()
        for ch, style in cells:
            bar.append(ch, style)
        if len(cells) < width:
            bar.append("░" * (width - len(cells)), Style(color=variables.get("gw-grid")))
        # (swatch, its style, text, size): in the bar's order.
        items: list[tuple[str, Style, str, float]] = []
        for name, value in parts:
            swatch = MONO_FILL[name] if mono else PATTERN.get(name, "■")
            style = Style(color=variables.get(THEME_VAR[name]))
            why = f" ({data.why})" if name == "unsplit" and data.why else ""
            # Findings (fragmentation, what the prediction misses) rank with free.
            rank = math.inf if name in FINDINGS else value
            items.append((swatch, style, f"{LABELS[name]} {fmt_short(value)}{why}", rank))
        above = data.above()
        if above:  # not on the bar: the phase reached it, but not at the cursor
            style = Style(color=variables.get(THEME_VAR[above[0][0]]))
            cut = " ".join(f"{LABELS[name]} {fmt_short(v)}" for name, v in above)
            text = f"phase peak +{fmt_short(data.headroom)}: {cut}"
            items.append(("▲", style, text, math.inf))  # the spike's cause: kept at 80x24
        if over > 0:  # not on the bar: it is no memory the device holds
            over_style = Style(color=variables.get("gw-unexplained"))
            items.append((OVER, over_style, f"over-predicted {fmt_short(over)}", math.inf))
        if data.free is not None:  # the ░ of the bar above, named
            free_style = Style(color=variables.get("gw-grid"))
            items.append(("░", free_style, f"free {fmt_short(data.free)}", math.inf))
        labels = Text()
        for swatch, style, text in _fit_legend(items, width):
            labels.append(swatch, style)
            labels.append(text + " ")
        labels.truncate(width, overflow="ellipsis")
        return Text("\n").join([bar, labels])


def _fit_legend(
    items: list[tuple[str, Style, str, float]], width: int
) -> list[tuple[str, Style, str]]:
    """The legend's items that fit ``width``, most important first, shown in bar order.

    Free memory, an over-prediction and the findings (:data:`FINDINGS`) first; then the
    largest segments (at 80 columns the spike's temporaries, not 9 MiB of unclaimed
    memory). Dropped ones leave a ``…`` at the end: the legend never stops mid-number.
    """
    cells = [len(swatch) + len(text) + 1 for swatch, _, text, _ in items]
    if sum(cells) - 1 <= width:  # no space after the last
        return [(swatch, style, text) for swatch, style, text, _ in items]
    order = sorted(range(len(items)), key=lambda i: -items[i][3])
    room = width - 1  # the closing …
    kept: set[int] = set()
    for i in order:
        if cells[i] <= room:
            kept.add(i)
            room -= cells[i]
    shown = [(swatch, style, text) for i, (swatch, style, text, _) in enumerate(items) if i in kept]
    return [*shown, ("…", Style(), "")]
