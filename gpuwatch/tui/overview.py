"""Every GPU at a glance: one row per GPU (and per MIG instance), then the host.

The first screen when the device panels do not all fit (8 GPUs, or 2 on an 80x24
terminal). Each row reads the device at one moment (the cursor, else the newest time):
a memory bar (NVML used of the total, with torch's reserved and allocated of the
instrumented processes inside it), utilisation, temperature, power and the process
holding the most memory with its phase. The host row says CPU, load, memory and swap.

Pull-based like the panels: the app calls :meth:`GpuOverview.update_view` from its frame
timer, and the rows are read and drawn again only when the moment, the data or the width
changed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from rich.segment import Segment
from rich.style import Style as RichStyle
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip
from textual.style import Style

from ..analysis.moment import moment
from ..analysis.predicted import PredictedLine
from ..fmt import ellipsis, printable
from ..session import Device, Session
from ._strips import CachedStrips
from .thresholds import DEFAULT, Thresholds, marked
from .thresholds import of as thresholds_of

CSS_PATH = Path(__file__).with_name("overview.tcss")
"""The overview's styles (the app loads them: a widget has no CSS_PATH of its own)."""

GIB = 1 << 30


@dataclass(frozen=True)
class GpuRow:
    """One GPU (or MIG instance) at one moment; None where unknown.

    Attributes:
        key: The device's key.
        label: Where it is: ``0``, or ``1.2`` for slot 2 of GPU 1's MIG instances.
        name: Its product (or MIG profile) name.
        used: NVML's used bytes.
        total: Its memory.
        reserved: torch's reserved bytes, summed over its instrumented processes.
        allocated: torch's allocated bytes, the same way.
        util: GPU utilisation, %.
        temp: °C.
        power: Watts.
        top: The process holding the most memory on it (NVML's list, else torch's).
        phase: That process's phase at the moment, when it is instrumented.
        state: The device's state (``ok``, ``lost``, ``error``).
    """

    key: str
    label: str
    name: str
    used: float | None
    total: float | None
    reserved: float | None
    allocated: float | None
    util: float | None
    temp: float | None
    power: float | None
    top: str | None
    phase: str | None
    state: str = "ok"


@dataclass(frozen=True)
class HostRow:
    """The host at one moment: CPU busy %, load, RAM and swap (None: unknown)."""

    name: str
    cpu: float | None
    load1: float | None
    used: float | None
    total: float | None
    swap_used: float | None
    swap_total: float | None


def gpu_devices(session: Session) -> list[Device]:
    """The GPUs in display order: NVML's index, each MIG instance after its GPU."""

    def order(dev: Device) -> tuple[str, int, int, str]:
        mig = dev.mig
        index = dev.index if dev.index is not None else 1 << 30
        return (dev.origin, index, mig[1] if mig else -1, dev.key)

    return sorted((d for d in list(session.devices.values()) if d.kind == "gpu"), key=order)


def gpu_row(
    session: Session, dev: Device, t: int, predicted: Mapping[int, PredictedLine] | None = None
) -> GpuRow:
    """What the overview says of ``dev`` at ``t``: the sample at or before it."""
    now = moment(session, dev.key, t, predicted, explain=False)  # the figures only
    row = now.row or {}
    mig = dev.mig
    index = "?" if dev.index is None else str(dev.index)
    label = f"{index}.{mig[1]}" if mig else index
    if dev.origin:
        label = f"{dev.origin}/{label}"
    top, phase = _top_process(session, dev.key, t, now.readings)
    total = _known(row.get("total")) or dev.total
    return GpuRow(
        key=dev.key,
        label=label,
        name=_short_name(dev, session),
        used=now.values.get("nvml"),
        total=float(total) if total else None,
        reserved=now.values.get("reserved"),
        allocated=now.values.get("allocated"),
        util=_known(row.get("util_gpu")),
        temp=_known(row.get("temp")),
        power=_known(row.get("power")),
        top=top,
        phase=phase,
        state=dev.state,
    )


def host_row(session: Session, t: int) -> HostRow | None:
    """What the overview says of the host at ``t``; None without a host device."""
    dev = next((d for d in list(session.devices.values()) if d.kind == "host"), None)
    if dev is None:
        return None
    table = session.host_table(dev.key)
    row = (table.at(t) if len(table) else None) or {}
    return HostRow(
        name=dev.name,
        cpu=_known(row.get("cpu")),
        load1=_known(row.get("load1")),
        used=_known(row.get("used")),
        total=_known(row.get("total")) or dev.total,
        swap_used=_known(row.get("swap_used")),
        swap_total=_known(row.get("swap_total")),
    )


def _known(v: float | int | None) -> float | None:
    """A table's figure, or None for unknown (NaN, or the missing integer)."""
    if v is None or (isinstance(v, float) and math.isnan(v)) or v < 0:
        return None
    return float(v)


def _short_name(dev: Device, session: Session) -> str:
    name = printable(dev.name or "GPU").removeprefix("NVIDIA ")
    mig = dev.mig
    parent = session.devices.get(mig[0]) if mig else None
    if parent is not None:  # "A100 MIG 2g.20gb" under its A100: the profile says it
        name = name.removeprefix(printable(parent.name).removeprefix("NVIDIA ")).strip()
    return name


def _top_process(
    session: Session, key: str, t: int, readings: list
) -> tuple[str | None, str | None]:
    """The process using the most memory of GPU ``key`` at ``t``, and its phase."""
    best: tuple[float, int] | None = None
    table = session.gpu_procs.get(key)
    snap = table.group_at(t) if table is not None and len(table) else None
    if snap is not None:
        for pid, used in zip(snap["pid"].tolist(), snap["used"].tolist(), strict=True):
            if pid > 0 and (best is None or used > best[0]):
                best = (used, pid)
    if best is None:  # no list from NVML (a MIG instance, no permission): torch's figures
        for r in readings:
            v = r.torch.get("reserved") if r.running and r.torch is not None else None
            if v is not None and v >= 0 and (best is None or v > best[0]):
                best = (v, r.proc.pid)
    if best is None:
        return None, None
    pid = best[1]
    proc = session.processes.get(pid)
    info = session.proc_info.get(pid, {})
    argv = (proc.hello.get("argv") if proc is not None else None) or []
    name = info.get("name") or (str(argv[0]).rsplit("/", 1)[-1] if argv else "")
    shown = info.get("os_pid", pid)
    text = printable(f"{shown} {name}".strip())
    phase = session.phase_at(proc, t) if proc is not None and session.runs_at(proc, t) else None
    return text, printable(phase) if phase else None


# ---------------------------------------------------------------------- drawing


def _gib(v: float | None, digits: int = 1) -> str:
    return "?" if v is None else f"{v / GIB:.{digits}f}"


def _num(v: float | None, unit: str, width: int) -> str:
    text = "–" if v is None else f"{v:.0f}{unit}"
    return text.rjust(width)


def bar_cells(row: GpuRow | HostRow, width: int) -> tuple[int, int, int] | None:
    """Cells of the memory bar up to allocated, reserved and NVML's used; None: unknown.

    A part too small for a cell still takes one when it is known and nonzero.
    """
    total, used = row.total, row.used
    if not total or used is None or width <= 0:
        return None

    def cells(v: float | None, floor: int = 0) -> int:
        if v is None or v <= 0:
            return floor
        return max(floor, min(width, max(1, round(v / total * width))))

    a = cells(getattr(row, "allocated", None))
    r = cells(getattr(row, "reserved", None), a)
    return a, r, cells(used, r)


Run = tuple[str, "str | Style | None"]
"""A piece of a line: its text, and its own style under the line's (None: the line's)."""


def memory_bar(
    cells: tuple[int, int, int] | None, width: int, colors: Mapping[str, str]
) -> list[Run]:
    """``width`` cells: allocated, then reserved, then the rest of NVML's used, then free,
    each in its line's colour and with its own character (it reads without colour)."""
    if cells is None:
        return [("·" * max(0, width), "dim")]
    a, r, u = cells
    parts = [
        ("█" * a, colors.get("gw-allocated", "")),
        ("▓" * (r - a), colors.get("gw-reserved", "")),
        ("▒" * (u - r), colors.get("gw-nvml", "")),
        ("░" * (width - u), colors.get("gw-ceiling", "")),
    ]
    return [(text, style or None) for text, style in parts if text]


def joined(runs: Iterable[Run]) -> list[Run]:
    """The runs as a line's segments: each styled run its own, the unstyled ones between
    them one (where :meth:`Content.render` splits a line: at each span's ends)."""
    out: list[Run] = []
    plain = ""
    for text, style in runs:
        if style is None:
            plain += text
            continue
        if plain:
            out.append((plain, None))
            plain = ""
        if text:
            out.append((text, style))
    if plain or not out:
        out.append((plain, None))
    return out


@dataclass(frozen=True)
class Layout:
    """Column widths of the overview at one terminal width."""

    label: int
    name: int
    bar: int
    rest: int

    @classmethod
    def of(cls, width: int, rows: list[GpuRow], bar_share: float) -> Layout:
        label = max([len(r.label) for r in rows] + [4]) + 3
        name = max(9, min(22, width // 8 if width < 100 else width // 6))
        bar = max(10, min(40, int(width * bar_share)))
        # used/total, util, temp, power and the spaces between: 9 + 5 + 5 + 5 + 2.
        return cls(label, name, bar, max(0, width - (label + name + bar + 26)))


def gpu_texts(
    row: GpuRow, lay: Layout, levels: Thresholds = DEFAULT, no_color: bool = False
) -> tuple[str, ...]:
    """A GPU row's text, column by column (the bar as its cells): what a frame draws.

    Without colour a memory or utilisation figure at its high level carries a sign."""
    top = row.state.upper() if row.state != "ok" else top_text(row.top, row.phase, lay.rest)
    mem, util = row_levels(row, levels)
    used = marked(f"{_gib(row.used)}/{_gib(row.total, 0)}G", mem, no_color)
    busy = _num(row.util, "%", 0)
    return (
        f"{row.label:<{lay.label - 2}}",
        ellipsis(row.name, lay.name - 1).ljust(lay.name),
        repr(bar_cells(row, lay.bar)),
        used.rjust(9),
        f"{marked(busy, util, no_color).rjust(5)}{_num(row.temp, '°', 5)}{_num(row.power, 'W', 5)}",
        ellipsis(top, lay.rest),
    )


def row_levels(row: GpuRow | HostRow, levels: Thresholds) -> tuple[str | None, str | None]:
    """The load levels of a row's memory used and of its utilisation (the host's CPU)."""
    busy = row.util if isinstance(row, GpuRow) else row.cpu
    return levels.memory_level(row.used, row.total), levels.util_level(busy)


def top_text(top: str | None, phase: str | None, width: int) -> str:
    """``pid command · phase`` in ``width`` cells; too long, the command is cut, not the
    phase (what the process does now says more than its name, at 80 columns too)."""
    text = " · ".join(x for x in (top, phase) if x)
    if len(text) <= width or not top or not phase:
        return ellipsis(text, width)
    room = width - len(" · ") - len(phase)
    return f"{ellipsis(top, room)} · {phase}" if room > 0 else ellipsis(phase, width)


def host_texts(
    host: HostRow, lay: Layout, width: int, levels: Thresholds = DEFAULT, no_color: bool = False
) -> tuple[str, ...]:
    """The host row's text, column by column."""
    mem, busy = row_levels(host, levels)
    cpu = "CPU –" if host.cpu is None else marked(f"CPU {host.cpu:.0f}%", busy, no_color)
    load = "" if host.load1 is None else f" load {host.load1:.2f}"
    if host.swap_total:
        swap = f" swap {_gib(host.swap_used)}/{_gib(host.swap_total, 0)}G"
    elif host.swap_total == 0:
        swap = " no swap"
    else:
        swap = ""
    return (
        f"{'host':<{lay.label - 2}}",
        ellipsis(printable(host.name), lay.name - 1).ljust(lay.name),
        repr(bar_cells(host, lay.bar)),
        marked(f"{_gib(host.used)}/{_gib(host.total, 0)}G", mem, no_color).rjust(9),
        ellipsis(f"{cpu}{load}{swap}", max(0, width - lay.label - lay.name - lay.bar - 11)),
    )


class GpuOverview(CachedStrips, can_focus=True):
    """Every GPU on one screen, a row each, and the host; ``enter`` opens a GPU's panel.

    Drawn line by line from a strip cache (as the band and the chart are): a frame whose
    text is the frame before's (the figures change below what is shown) draws nothing.

    Args:
        session: What to show.
        predicted: The app's predicted lines by pid (shared, kept up to date by the app).
    """

    BINDINGS = [
        Binding("up,k", "select(-1)", "Previous GPU", show=False),
        Binding("down,j", "select(1)", "Next GPU", show=False),
        Binding("pageup", "select(-10)", "Ten GPUs up", show=False),
        Binding("pagedown", "select(10)", "Ten GPUs down", show=False),
        Binding("enter,tab", "open", "Open GPU", show=False),
    ]

    COMPONENT_CLASSES = {
        "gpu-overview--head",
        "gpu-overview--selected",
        "gpu-overview--host",
        "gpu-overview--muted",
    }

    selected: reactive[int] = reactive(0)
    """The row under the selection (a GPU's, in :func:`gpu_devices` order)."""
    bar_share: reactive[float] = reactive(0.2)
    """The memory bar's share of the width (between 10 and 40 cells)."""
    show_host: reactive[bool] = reactive(True)
    """Whether the host's row follows the GPUs'."""

    class Opened(Message):
        """``enter`` on a GPU's row: show its panel."""

        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key

    def __init__(
        self,
        session: Session,
        predicted: Mapping[int, PredictedLine] | None = None,
        *,
        id: str | None = None,
    ) -> None:
        super().__init__(id=id)
        self.session = session
        self.predicted = predicted if predicted is not None else {}
        self.rows: list[GpuRow] = []
        self.host: HostRow | None = None
        self.at: int | None = None
        self._read_key: object = None
        self._texts: tuple[object, ...] = ()  # what the lines say: they are built from it
        self._row_texts: tuple[tuple[str, ...], ...] = ()
        # Styles resolved once, not at each frame (parsing and combining them was most of
        # drawing a line): the component classes' and the pad's per theme and focus, and
        # each run's final style by its base and layers. All go when the CSS changes.
        self._components = self.style_cache(self._read_components)
        # A widget's rich style is made anew at each read: kept as the classes' are.
        self._pad_style = self.style_cache(lambda: self.rich_style)
        self._combined: dict[tuple[object, ...], RichStyle | None] = {}

    # ------------------------------------------------------------------ data

    @property
    def selected_key(self) -> str | None:
        """The device key of the selected row, or None without GPUs."""
        if not self.rows:
            return None
        return self.rows[min(self.selected, len(self.rows) - 1)].key

    def select_key(self, key: str) -> None:
        """Put the selection on device ``key`` (the panel one comes back from)."""
        for i, row in enumerate(self.rows):
            if row.key == key:
                self.selected = i
                return

    def update_view(self, at: int, version: object) -> None:
        """Read every device at ``at`` (once per moment and data version, in one read
        under the session's lock) and redraw where what is shown changed."""
        taken = self.session.read(lambda: self._read(at, version))
        if taken and self.selected >= len(self.rows) and self.rows:
            self.selected = len(self.rows) - 1
        self._draw()

    def _read(self, at: int, version: object) -> bool:
        """Take each GPU's row and the host's at ``at`` (frozen: drawn without the session)
        unless those of this moment and version are held; True when taken."""
        key = (at, version, len(self.session.devices))
        if key == self._read_key:
            return False
        self._read_key = key
        self.at = at
        devices = gpu_devices(self.session)
        self.rows = [gpu_row(self.session, d, at, self.predicted) for d in devices]
        self.host = host_row(self.session, at)
        return True

    # ------------------------------------------------------------------ drawing

    def _width(self) -> int:
        return self.size.width or 80

    def _draw(self) -> None:
        """Refresh when the text, the selection or the settings changed (the strips are
        made in :meth:`build_strips`, once styles are known)."""
        width = self._width()
        lay = Layout.of(width, self.rows, self.bar_share)
        levels, mono = thresholds_of(self.app), self.app.no_color
        rows = tuple(gpu_texts(r, lay, levels, mono) for r in self.rows)
        host = self.host if self.show_host else None
        texts = (
            width,
            self.selected,
            self.show_host,
            rows,
            host_texts(host, lay, width, levels, mono) if host else None,
            # A level's colour may change where the text does not (a figure at 80.0 %).
            tuple(row_levels(r, levels) for r in self.rows),
            row_levels(host, levels) if host else None,
        )
        if texts == self._texts:
            return
        self._texts = texts
        self._row_texts = rows  # the lines are made of them (at this width)
        height = 1 + len(self.rows) + (self.show_host and self.host is not None)
        if self.styles.height is None or self.styles.height.value != height:
            self.styles.height = height
        self.refresh()

    def strips_key(self, size: Size) -> object:
        return (self._texts, size.width, self.app.theme, self.has_focus)

    def build_strips(self, size: Size) -> list[Strip]:
        base = self.visual_style
        rich = self._pad_style.get()
        strips = []
        for runs, line_style in self._lines(size.width, self.app.theme_variables):
            segments = [
                Segment(text, self._combine(base, style, line_style)) for text, style in runs
            ]
            strips.append(Strip(segments).adjust_cell_length(size.width, rich))
        return strips

    def _combine(
        self, base: Style, style: str | Style | None, line: Style | None
    ) -> RichStyle | None:
        """The rich style of a run: the base, its own style, the line's (as a Content
        with the line's style over its spans renders it)."""
        key = (base, style, line)
        if key in self._combined:
            return self._combined[key]
        layers = [base]
        if style is not None:
            layers.append(style if isinstance(style, Style) else _parse(style))
        if line:
            layers.append(line)
        combined = Style.combine(layers) if len(layers) > 1 else base
        if len(self._combined) > 512:  # colours per theme and focus: a few dozen
            self._combined.clear()
        self._combined[key] = rich = combined.rich_style if combined else None
        return rich

    def _read_components(self) -> dict[str, Style]:
        """The component classes' styles (kept per theme and focus by :attr:`_components`)."""
        return {
            name: _style(self.get_component_rich_style(f"gpu-overview--{name}", partial=True))
            for name in ("head", "muted", "selected", "host")
        }

    def notify_style_update(self) -> None:
        super().notify_style_update()  # the component classes' and the pad's styles too
        self._combined.clear()

    def _lines(self, width: int, colors: Mapping[str, str]) -> list[tuple[list[Run], Style]]:
        """Each line: its runs (:func:`joined`) and the style over all of it."""
        lay = Layout.of(width, self.rows, self.bar_share)
        styles = self._components.get()
        head = (
            f"{'GPU':<{lay.label}}{'name':<{lay.name}}{'memory':<{lay.bar}} {'used/tot':>9}"
            f"{'util':>5}{'temp':>5}{'W':>5} {'top process · phase'}"
        )
        lines = [(joined([(ellipsis(head, width), None)]), styles["head"])]
        drawn = self._row_texts if self._texts and self._texts[0] == width else None
        levels, mono = thresholds_of(self.app), self.app.no_color
        for i, row in enumerate(self.rows):
            chosen = i == self.selected
            texts = drawn[i] if drawn else gpu_texts(row, lay, levels, mono)
            label, name, _, memory, figures, top = texts
            mem, util = (_level_color(lv, colors) for lv in row_levels(row, levels))
            runs: list[Run] = [("▸ " if chosen else "  ", None), (label, None), (name, None)]
            runs += memory_bar(bar_cells(row, lay.bar), lay.bar, colors)
            runs += [(" ", None), (memory, mem)]
            if row.util is None:
                runs.append((figures, styles["muted"]))
            else:  # the utilisation in its level's colour, temperature and power as they are
                runs += [(figures[:5], util), (figures[5:], None)]
            runs += [(" ", None), (top, None)]
            lines.append((joined(runs), styles["selected"] if chosen else Style()))
        if self.show_host and self.host is not None:
            label, name, _, memory, rest = host_texts(self.host, lay, width, levels, mono)
            mem, busy = (_level_color(lv, colors) for lv in row_levels(self.host, levels))
            runs = [("  ", None), (label, None), (name, None)]
            runs += memory_bar(bar_cells(self.host, lay.bar), lay.bar, colors)
            runs += [(" ", None), (memory, mem), (" ", None), (rest, busy)]
            lines.append((joined(runs), styles["host"]))
        return lines

    def render_plain(self) -> list[str]:
        """The lines as the screen shows them, without styles (tests, the help)."""
        return ["".join(t for t, _ in runs) for runs, _ in self._lines(self._width(), {})]

    # ------------------------------------------------------------------ keys

    def watch_selected(self) -> None:
        self._draw()

    def watch_bar_share(self) -> None:
        self._draw()

    def watch_show_host(self) -> None:
        self._draw()

    def on_resize(self) -> None:
        self._draw()

    def action_select(self, step: int) -> None:
        """Move the selection ``step`` rows (it stops at the first and last)."""
        if self.rows:
            self.selected = max(0, min(len(self.rows) - 1, self.selected + step))
            self.scroll_visible_row()

    def scroll_visible_row(self) -> None:
        """Keep the selected row in view when the overview scrolls (many GPUs, MIG)."""
        parent = self.parent
        if parent is not None and hasattr(parent, "scroll_to_region"):
            region = Region(0, self.virtual_region.y + 1 + self.selected, 1, 1)
            parent.scroll_to_region(region, animate=False, immediate=True)

    def action_open(self) -> None:
        """Open the selected GPU's panel."""
        key = self.selected_key
        if key is not None:
            self.post_message(self.Opened(key))


def _level_color(level: str | None, colors: Mapping[str, str]) -> str | None:
    """The theme's colour of a load level (None: the line's own)."""
    return colors.get(f"gw-level-{level}") or None if level else None


def _style(rich_style: RichStyle) -> Style:
    return Style.from_rich_style(rich_style)


def _parse(style: str) -> Style:
    """A style named in a run (a theme's colour, ``dim``), as :class:`Content` reads it."""
    try:
        return Style.parse(style)
    except Exception:  # what Content does with a style it cannot read: nothing
        return Style.null()
