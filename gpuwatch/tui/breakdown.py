"""The breakdown bar: one GPU's memory at the cursor, from other processes to free."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from ..analysis.breakdown import Breakdown
from ..fmt import OOM_SIZES, fmt_short, printable

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
    "blas_workspaces": "blas",
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
    "blas_workspaces": "gw-context",
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
    "blas_workspaces": "w",
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

PRIORITY = ("oom", "free", "above", "over_predicted", "unsplit", "fragmented", "unexplained")
"""What the legend keeps first where it does not fit, in this order (README's rule): the
OOM that broke the phase, free memory, what the phase reached above the figure
(``▲phase peak``), an over-prediction, what is not split, fragmentation, unexplained;
then the other segments, largest first. Only a segment that does not fit is dropped, and
never one larger than a segment kept."""

MINOR = 0.02
"""An unexplained part under this share of what is allocated is not a finding."""

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
        bar = _bar(parts, width / data.total, width, variables, mono)
        labels = Text()
        for swatch, style, text in fit_legend(_items(data, parts, variables, mono), width):
            labels.append(swatch, style)
            labels.append(text + " ")
        labels.truncate(width, overflow="ellipsis")
        return Text("\n").join([bar, labels])


def _bar(
    parts: list[tuple[str, float]],
    scale: float,
    width: int,
    variables: dict[str, str],
    mono: bool,
) -> Text:
    """The bar's row: each segment in its colour (or pattern, or monochrome fill), the
    rest of the device's memory as ``░``."""
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
    bar = Text()
    for ch, style in cells:
        bar.append(ch, style)
    if len(cells) < width:
        bar.append("░" * (width - len(cells)), Style(color=variables.get("gw-grid")))
    return bar


def _items(
    data: Breakdown, parts: list[tuple[str, float]], variables: dict[str, str], mono: bool
) -> list[Item]:
    """The legend's items in the bar's order: the OOM, the segments, then what is not on
    the bar (the phase's peak above the cursor, an over-prediction, the free memory)."""
    items: list[Item] = []
    oom = data.oom
    if oom is not None:  # the error's story, as the OOM toast tells it
        oom_style = Style(color=variables.get("gw-oom"), bold=True)
        short = oom_text(oom, short=True)
        items.append(Item("✖", oom_style, oom_text(oom), "oom", math.inf, short))
    for name, value in parts:
        swatch = MONO_FILL[name] if mono else PATTERN.get(name, "■")
        style = Style(color=variables.get(THEME_VAR[name]))
        text = f"{LABELS[name]} {fmt_short(value)}"
        why = f"{text} ({data.why})" if name == "unsplit" and data.why else ""
        # What the prediction misses ranks as a finding only where it matters: 65M
        # beside 53G is a segment like any other (and goes before weights do).
        minor = name == "unexplained" and value < MINOR * (data.allocated or 0.0)
        rank = "segment" if minor else name
        items.append(Item(swatch, style, why or text, rank, value, text))
    above = data.above()
    if above:  # not on the bar: the phase reached it, but not at the cursor
        style = Style(color=variables.get(THEME_VAR[above[0][0]]))
        cut = " ".join(f"{LABELS[name]} {fmt_short(v)}" for name, v in above)
        text = f"phase peak +{fmt_short(data.headroom)}: {cut}"
        items.append(Item("▲", style, text, "above", data.headroom, f"+{cut}"))
    over = data.over_predicted
    if over > 0:  # not on the bar: it is no memory the device holds
        over_style = Style(color=variables.get("gw-unexplained"))
        text = f"over-predicted {fmt_short(over)}"
        items.append(Item(OVER, over_style, text, "over_predicted", over))
    if data.free is not None:  # the ░ of the bar above, named
        free_style = Style(color=variables.get("gw-grid"))
        items.append(Item("░", free_style, f"free {fmt_short(data.free)}", "free", data.free))
    return items


def oom_text(body: dict, short: bool = False) -> str:
    """``OOM in forward (step 5): requested 192.0G, free 73.8G``: the toast's figures
    (short: ``OOM in forward: requested 192.0G``, the free memory being the legend's)."""
    phase = printable(body.get("phase") or "?")
    step = body.get("step")
    numbered = isinstance(step, int) and not isinstance(step, bool)
    where = f"{phase} (step {step})" if numbered else phase
    sizes = [
        f"{word} {fmt_short(body[key])}"
        for key, word in OOM_SIZES[:2]
        if isinstance(body.get(key), int) and not isinstance(body.get(key), bool) and body[key] >= 0
    ]
    if short:
        where, sizes = phase, sizes[:1]
    return f"OOM in {where}" + (": " + ", ".join(sizes) if sizes else "")


@dataclass
class Item:
    """One legend item: its swatch, text, what it names (a bar segment or one of
    :data:`PRIORITY`), its size, and a shorter text for a narrow screen."""

    swatch: str
    style: Style
    text: str
    name: str
    size: float
    short: str = ""

    @property
    def rank(self) -> tuple[int, float]:
        tier = PRIORITY.index(self.name) if self.name in PRIORITY else len(PRIORITY)
        return (tier, -self.size)


def fit_legend(items: list[Item], width: int) -> list[tuple[str, Style, str]]:
    """The legend's items that fit ``width``, by :data:`PRIORITY`, shown in bar order.

    An item that does not fit whole may show its short text. Once a segment that is not
    in :data:`PRIORITY` does not fit, no smaller one is kept in its place: at 80 columns
    weights and grads stay and ``tmp 65M`` goes. Dropped items leave a ``…`` at the end:
    the legend never stops mid-number.
    """
    cells = [len(it.swatch) + len(it.text) + 1 for it in items]
    if sum(cells) - 1 <= width:  # no space after the last
        return [(it.swatch, it.style, it.text) for it in items]
    room = width - 1  # the closing …
    kept: dict[int, str] = {}
    order = sorted(range(len(items)), key=lambda i: items[i].rank)
    for i in order:  # short texts first: a note never costs a segment its place
        it = items[i]
        text = it.short or it.text
        if len(it.swatch) + len(text) + 1 <= room:
            kept[i] = text
            room -= len(it.swatch) + len(text) + 1
        elif it.name not in PRIORITY:
            break
    for i in order:  # then the notes, where there is room left
        it = items[i]
        if i in kept and kept[i] != it.text and len(it.text) - len(kept[i]) <= room:
            room -= len(it.text) - len(kept[i])
            kept[i] = it.text
    shown = [(it.swatch, it.style, kept[i]) for i, it in enumerate(items) if i in kept]
    return [*shown, ("…", Style(), "")]
