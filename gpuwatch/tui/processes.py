"""The Processes tab: every process on each GPU, sortable, filterable, as a tree, and
signals to the selected one; ``enter`` opens its own timelines (:mod:`.process_screen`).

The rows are :mod:`gpuwatch.analysis.processes`'; this module draws them and handles the
keys. A signal goes only to a process of the user running gpuwatch (root: any), never from
a replay or a served page, and only after a confirmation that names the process.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import psutil
from rich.segment import Segment
from rich.style import Style
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.geometry import Size
from textual.strip import Strip
from textual.widgets import Input, Static

from ..analysis import processes as pr
from ..fmt import ellipsis, fmt_bytes, fmt_duration, printable
from ..session import Session
from ._strips import ROW_KEYS, CachedStrips
from ._text import plain_lines
from .confirm import Confirm
from .keymap import PROCESS_IDS
from .thresholds import Thresholds, marked
from .thresholds import of as thresholds_of

SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM, "KILL": signal.SIGKILL}

KEYS: tuple[tuple[str, str, str], ...] = (
    ("o", "sort_next", "Sort by the next column"),
    ("O", "sort_reverse", "Reverse the sort order"),
    ("slash", "filter", "Filter the rows by text (enter keeps it, escape clears it)"),
    ("t", "toggle_tree", "Tree view: each process under its launcher (parent pid)"),
    ("I", "signal('INT')", "Send SIGINT to the selected process (after a confirmation)"),
    ("T", "signal('TERM')", "Send SIGTERM to the selected process (after a confirmation)"),
    ("K", "signal('KILL')", "Send SIGKILL to the selected process (after a confirmation)"),
    ("enter", "open", "Open the selected process's timelines"),
)
"""The Processes tab's own keys: (key, action, help), bound while its table has focus."""


WIDTHS = {
    "pid": 14,
    "user": 12,
    "device": 12,
    "gpu_mem": 10,
    "sm": 5,
    "cpu": 6,
    "rss": 10,
    "elapsed": 9,
    "rank": 5,
    "phase": 16,
    "command": 0,  # the rest of the line
}
"""The most cells of each column: a column is as wide as its widest cell (or heading)
up to this, and never narrower than it once was (nothing moves as figures change)."""
RIGHT = {"pid", "gpu_mem", "sm", "cpu", "rss", "elapsed", "rank"}
NARROW = ((120, {"rss", "elapsed", "rank"}), (100, {"phase"}))
"""Below each width (cells), these columns give way so the command keeps some room."""
OPTIONAL = {"rank", "phase"}
"""Columns shown only while a row has something in them (an instrumented process)."""
LARGEST_FIRST = {"gpu_mem", "sm", "cpu", "rss", "elapsed"}
"""Columns whose sort starts with the largest (the biggest user first, as nvitop's)."""
HSCROLL = 8
"""Cells the command moves by at each ←/→."""


def shown_columns(width: int) -> list[str]:
    """The column keys shown at ``width`` cells."""
    hidden: set[str] = set()
    for below, keys in NARROW:
        if width < below:
            hidden |= keys
    return [k for k, _ in pr.COLUMNS if k not in hidden]


def column_widths(
    cells: list[tuple[str, ...]], before: dict[str, int] | None = None, sort_key: str = ""
) -> dict[str, int]:
    """Each column's cells: its widest cell or its heading (the sorted one's with room for
    its arrow), at most :data:`WIDTHS`, never below ``before``; 0 for an optional column
    with nothing in it (not shown). The command's is 0: it takes the rest of the line."""
    out: dict[str, int] = {}
    for i, (key, label) in enumerate(pr.COLUMNS):
        if key == "command":
            out[key] = 0
            continue
        widest = max((len(c[i]) for c in cells), default=0)
        if key in OPTIONAL and widest == 0:
            out[key] = 0
            continue
        w = min(WIDTHS[key], max(widest, len(label) + (key == sort_key)))
        out[key] = max(w, (before or {}).get(key, 0))
    return out


class ProcessTable(CachedStrips, can_focus=True):
    """Every process on every GPU (NVML) plus every instrumented process.

    Only the rows in view are formatted and drawn: a refresh of hundreds of processes
    costs the rows' gathering and one screenful, not a table widget's rebuild.

    Attributes:
        at: The figures' time (the cursor); None: the newest.
        sort_key: The column sorted on (a key of :data:`~gpuwatch.analysis.processes.COLUMNS`).
        reverse: Sorted high to low.
        filter_text: The filter's text ("" shows all).
        as_tree: Shown as a tree by parent pid.
        uid: The user whose processes may be signalled; None: this process's effective
            uid (root may signal any). Tests set it to check a refusal as a non-root user.
        cursor_row: The selected row.
    """

    DEFAULT_CSS = """
    ProcessTable {
        height: 1fr;
        background: $surface;
    }
    ProcessTable > .process-table--header {
        background: $panel;
        color: $text;
        text-style: bold;
    }
    ProcessTable > .process-table--odd {
        background: $surface-lighten-1;
    }
    ProcessTable > .process-table--cursor {
        background: $panel-lighten-2;
        color: $text;
    }
    ProcessTable:focus > .process-table--cursor {
        background: $primary;
        color: $text;
        text-style: bold;
    }
    """

    COMPONENT_CLASSES = {
        "process-table--header",
        "process-table--odd",
        "process-table--cursor",
    }

    BINDINGS = [
        *ROW_KEYS,
        Binding("left", "scroll_command(-1)", "Command left", show=False),
        Binding("right", "scroll_command(1)", "Command right", show=False),
        *(
            Binding(k, a, h.split(" (")[0], show=False, id=PROCESS_IDS[a], tooltip=h)
            for k, a, h in KEYS
        ),
    ]

    def __init__(self, session: Session, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.session = session
        self.at: int | None = None
        self.sort_key = "device"
        self.reverse = False
        self.filter_text = ""
        self.as_tree = False
        self.uid: int | None = None
        self.shown: list[pr.ProcRow] = []
        self.cursor_row = 0
        self.top = 0  # the first row in view
        self.hscroll = 0  # cells of the command scrolled off to the left (←/→)
        self.widths: dict[str, int] = {}  # each column's cells (see column_widths)
        self.opener: Callable[[pr.ProcRow], None] | None = None  # enter: the app's
        self._last: object = None
        self._version = 0
        self._cache = pr.RowCache()  # the rows of the last refresh, reused where unchanged
        self._totals: dict[str, int | None] = {}  # device key -> its total, at the refresh
        # (cells, width, style, layout) -> the row's line, drawn once while they are equal
        self._lines: dict[tuple[object, ...], Strip] = {}
        self._styles = self.style_cache(self._read_styles)

    # ------------------------------------------------------------------ rows

    def refresh_rows(self) -> None:
        """Rebuild from the session at :attr:`at` (sorted, filtered, as a tree), read in one
        :meth:`~gpuwatch.session.Session.read`."""
        items, rest = self.session.read(self._read_rows)
        parent = self.parent
        if isinstance(parent, ProcessesView):
            parent.show_note(self._note(items, rest))
        signature = (self.sort_key, self.reverse, [_figures(r) for r in items])
        if signature == self._last:
            return
        self._last = signature
        selected = self.selected()
        self.shown = items
        if selected is not None:  # the cursor stays on its process when the order changes
            same = [i for i, r in enumerate(items) if r.pid == selected.pid]
            if same:
                self.cursor_row = same[0]
        self._place(self.cursor_row)

    def _read_rows(
        self,
    ) -> tuple[list[pr.ProcRow], list[tuple[str, int]]]:
        """The rows shown at :attr:`at` (sorted, filtered, as a tree) and what NVML
        attributes to no listed process; the GPUs' totals kept for the rows' levels."""
        session = self.session
        listed = pr.rows(session, self.at, self._cache)
        items = pr.sort(listed, self.sort_key, self.reverse)
        if self.filter_text:
            items = pr.matching(items, self.filter_text)
        if self.as_tree:
            items = pr.tree(session, items)
        self._totals = {key: dev.total for key, dev in session.devices.items()}
        return items, pr.unattributed(session, self.at, listed)

    @property
    def row_count(self) -> int:
        """Rows shown."""
        return len(self.shown)

    def get_row_at(self, index: int) -> list[str]:
        """The cells of row ``index`` as shown (untrimmed)."""
        return list(self._cells(self.shown[index]))

    def move_cursor(self, *, row: int, animate: bool = False) -> None:
        """Select row ``row`` (scrolled into view)."""
        self._place(row)

    def _place(self, row: int) -> None:
        n = len(self.shown)
        self.cursor_row = max(0, min(row, n - 1))
        rows = max(1, self.size.height - 1)
        if self.cursor_row < self.top:
            self.top = self.cursor_row
        elif self.cursor_row >= self.top + rows:
            self.top = self.cursor_row - rows + 1
        self.top = max(0, min(self.top, max(0, n - rows)))
        self._version += 1
        self.refresh()

    def action_move(self, step: int) -> None:
        """Cursor one row up or down."""
        self._place(self.cursor_row + step)

    def action_page(self, step: int) -> None:
        """Cursor a screenful up or down."""
        self._place(self.cursor_row + step * max(1, self.size.height - 2))

    def on_click(self, event: events.Click) -> None:
        if event.y >= 1:
            self._place(self.top + event.y - 1)

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        event.stop()
        self._place(self.cursor_row + 3)

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        event.stop()
        self._place(self.cursor_row - 3)

    def on_resize(self) -> None:
        self._place(self.cursor_row)

    # ------------------------------------------------------------------ drawing

    def columns(self, width: int) -> list[tuple[str, int]]:
        """The columns shown at ``width`` cells and their cells (the command's: 0, the
        rest of the line)."""
        widths = self.widths
        out = []
        for key in shown_columns(width):
            w = widths.get(key, 0 if key in OPTIONAL else len(dict(pr.COLUMNS)[key]) + 1)
            if key == self.sort_key and w:  # room for the arrow (before a refresh measured)
                w = min(WIDTHS[key], max(w, len(dict(pr.COLUMNS)[key]) + 1))
            if w or key == "command":
                out.append((key, w))
        return out

    def command_room(self, width: int | None = None) -> int:
        """Cells the command has at ``width`` (default the table's)."""
        width = self._width() if width is None else width
        cols = self.columns(width)
        return max(0, width - 1 - sum(w + 1 for _, w in cols if w))

    def strips_key(self, size: Size) -> object:
        return (
            self._version,
            self.top,
            self.cursor_row,
            size,
            self.has_focus,
            self.app.theme,
            self.hscroll,
        )

    def build_strips(self, size: Size) -> list[Strip]:
        width = size.width
        header, base, odd, cursor = self._styles.get()
        heads = []
        # The columns are measured on the rows drawn (a refresh formats no other row);
        # they only widen, so nothing moves as figures change.
        view = range(self.top, min(len(self.shown), self.top + size.height - 1))
        drawn = [self._cells(self.shown[i]) for i in view]
        self.widths = column_widths(drawn, self.widths, self.sort_key)
        cols = self.columns(width)
        for key, label in pr.COLUMNS:
            arrow = ("▼" if self.reverse else "▲") if key == self.sort_key else ""
            if key == "command" and self.hscroll:
                arrow = f" ◂ {self.hscroll}"  # scrolled: by how much, and that ← goes back
            heads.append(label + arrow)
        strips = [Strip([Segment(_line(heads, width, cols), header)], width)]
        lines = self._lines
        if len(lines) > 4 * max(64, size.height):  # those of rows no longer in view go
            lines.clear()
        layout = (tuple(cols), self.hscroll)
        levels, mono = thresholds_of(self.app), self.app.no_color
        colors = self.app.theme_variables
        for i, cells in zip(view, drawn, strict=True):
            style = cursor if i == self.cursor_row else odd if i % 2 else base
            # The levels follow the figures the cells show: read on a miss only.
            strip = lines.get((cells, width, style, layout))
            if strip is None:
                marks = self._levels(self.shown[i], levels)
                strip = self._strip(cells, width, style, cols, marks, mono, colors)
                lines[cells, width, style, layout] = strip
            strips.append(strip)
        return strips

    def _strip(
        self,
        cells: tuple[str, ...],
        width: int,
        style: Style,
        cols: list[tuple[str, int]],
        marks: tuple[str | None, str | None],
        mono: bool,
        colors: dict[str, str],
    ) -> Strip:
        """One row's line: its GPU memory and SM % in their load level's colour (with a
        sign when there is no colour)."""
        shown = list(cells)
        if mono:
            shown[3] = marked(shown[3], marks[0], True)
            shown[4] = marked(shown[4], marks[1], True)
        text = _line(shown, width, cols, self.hscroll)
        spans = []
        for (start, end), lvl in zip(_cell_spans(cols, ("gpu_mem", "sm")), marks, strict=True):
            color = colors.get(f"gw-level-{lvl}") if lvl and not mono else None
            if color and start < end:
                spans.append((start, end, style + Style(color=color)))
        if not spans:
            return Strip([Segment(text, style)], width)
        segments = []
        at = 0
        for start, end, colored in spans:
            segments += [Segment(text[at:start], style), Segment(text[start:end], colored)]
            at = end
        segments.append(Segment(text[at:], style))
        return Strip([s for s in segments if s.text], width)

    def _levels(self, row: pr.ProcRow, levels: Thresholds) -> tuple[str | None, str | None]:
        """The load levels of a row's GPU memory (of its GPU's total) and SM %."""
        total = self._totals.get(row.device_key or "") if row.listed else None
        sm = row.sm if row.listed else None
        return levels.memory_level(row.gpu_mem, total), levels.util_level(sm)

    def _read_styles(self) -> tuple[Style, Style, Style, Style]:
        """The header's, a row's, an odd row's and the cursor's styles (kept per theme and
        focus by :attr:`_styles`: a lookup walks the CSS)."""
        base = self.rich_style
        return (
            base + self.get_component_rich_style("process-table--header"),
            base,
            base + self.get_component_rich_style("process-table--odd"),
            base + self.get_component_rich_style("process-table--cursor"),
        )

    def _note(self, items: list[pr.ProcRow], rest: list[tuple[str, int]]) -> str:
        """One line (the table's heading never moves): how many rows and how they are
        shown, the memory NVML attributes to no listed process, what a wider screen adds."""
        n = len(items)
        how = [f"{n} process{'es' if n != 1 else ''} by {dict(pr.COLUMNS)[self.sort_key]}"]
        how[0] += " ▼" if self.reverse else " ▲"
        if rest:
            how.append(
                f"{fmt_bytes(sum(b for _, b in rest))} on {pr.gpu_list([w for w, _ in rest])} "
                "used by no listed process (another container's, or not ours to list)"
            )
        if self.filter_text:
            how.append(f"filter “{self.filter_text}”")
        if self.as_tree:
            how.append("tree")
        shown = shown_columns(self._width())
        hidden = [label for k, label in pr.COLUMNS if k not in shown and self.widths.get(k, 1)]
        if hidden:
            how.append("wider: " + ", ".join(hidden))
        how.append("o/O sort · / filter · t tree · ←/→ command · I/T/K signal · enter timelines")
        return ellipsis(" · ".join(how), max(1, self._width() - 2))

    def _width(self) -> int:
        """The table's width; before its first layout, the screen's."""
        return self.size.width or self.app.size.width

    def _cells(self, r: pr.ProcRow) -> tuple[str, ...]:
        pid = str(r.shown_pid) + (f" ({r.container_pid})" if r.container_pid else "")
        command = r.command or r.name or ""
        if not r.visible:
            command = f"{command} (not visible from here)".strip()
        return (
            pid,
            r.user or "",
            r.device,
            _bytes(r.gpu_mem, r.listed and r.device_key != "host"),  # host: on no GPU
            # A launcher in the tree was not sampled; a process on the host has no SM %.
            _pct(r.sm) if r.listed and r.device_key != "host" else "",
            _pct(r.cpu) if r.listed else "",
            _bytes(r.rss, r.listed),
            fmt_duration(int(r.elapsed * 1e9)) if r.elapsed is not None else "",
            "" if r.rank is None else str(r.rank),
            r.phase or "",
            r.branch + command[:300],
        )

    def selected(self) -> pr.ProcRow | None:
        """The row under the cursor, if any."""
        if not self.shown or not 0 <= self.cursor_row < len(self.shown):
            return None
        return self.shown[self.cursor_row]

    # ------------------------------------------------------------------ keys

    def action_sort_next(self) -> None:
        """Sort by the next column (a figure's largest first)."""
        keys = [k for k, _ in pr.COLUMNS]
        self.sort_key = keys[(keys.index(self.sort_key) + 1) % len(keys)]
        self.reverse = self.sort_key in LARGEST_FIRST
        self.refresh_rows()

    def action_scroll_command(self, step: int) -> None:
        """Scroll the command column ``step`` times :data:`HSCROLL` cells (nvitop's ←/→)."""
        longest = max((len(self._cells(r)[-1]) for r in self.shown), default=0)
        most = max(0, longest - self.command_room())
        self.hscroll = max(0, min(most, self.hscroll + step * HSCROLL))
        self.refresh()

    def action_sort_reverse(self) -> None:
        """Reverse the order."""
        self.reverse = not self.reverse
        self.refresh_rows()

    def action_toggle_tree(self) -> None:
        """Show / leave the tree by parent pid."""
        self.as_tree = not self.as_tree
        self.refresh_rows()

    def action_filter(self) -> None:
        """Open the filter line."""
        parent = self.parent
        if isinstance(parent, ProcessesView):
            parent.open_filter()

    def action_open(self) -> None:
        """Open the selected process's timelines."""
        row = self.selected()
        if row is not None and row.listed and self.opener is not None:
            self.opener(row)

    def action_signal(self, name: str) -> None:
        """Ask, then send SIG``name`` to the selected process (or say in one line why not)."""
        row = self.selected()
        sig = SIGNALS[name]
        why = self.refusal(row)
        if why is not None or row is None:
            self.app.notify(why or "no process selected", severity="warning", timeout=4)
            return
        what = f"pid {row.shown_pid} ({row.user or '?'}): {row.command or row.name}"

        def answered(yes: bool | None) -> None:
            if yes:
                self._send(row, sig)

        self.app.push_screen(
            Confirm(what[:200], f"Send SIG{name} to pid {row.shown_pid}?"), answered
        )

    def refusal(self, row: pr.ProcRow | None) -> str | None:
        """Why a signal may not go to ``row``, in one line; None when it may."""
        if not self.session.live:
            return "this is a replay: its processes are a recording's, no signal is sent"
        if self.app.is_web:
            return "a served page sends no signal: use the dashboard on the machine"
        if getattr(self.app, "readonly", False):
            return "gpuwatch --readonly: no signal is sent"
        if row is None:
            return "no process selected"
        if not row.visible or row.shown_pid != row.pid:
            return f"pid {row.shown_pid} is not visible from here (another PID namespace)"
        me = os.geteuid() if self.uid is None else self.uid
        owner = _owner(row.pid)
        if owner is None:
            return f"pid {row.pid} has ended"
        if me != 0 and owner != me:
            who = row.user or f"uid {owner}"
            return f"pid {row.pid} belongs to {who}: only your own processes (root: any)"
        return None

    def _send(self, row: pr.ProcRow, sig: int) -> None:
        name = signal.Signals(sig).name
        why = self.refusal(row)  # asked again: the answer took a while
        if why is None and row.started is not None and not _same_process(row.pid, row.started):
            why = f"pid {row.pid} is now another process: not sent"
        if why is not None:
            self.app.notify(why, severity="warning", timeout=4)
            return
        try:
            os.kill(row.pid, sig)
        except OSError as exc:
            self.app.notify(f"{name} to pid {row.pid} failed: {exc.strerror}", severity="error")
            return
        self.app.notify(f"sent {name} to pid {row.pid}", timeout=3)


class ProcessesView(Vertical):
    """The tab: what NVML cannot attribute and how the rows are shown, the table, and the
    filter line (``/``)."""

    DEFAULT_CSS = """
    ProcessesView #process-note {
        height: 1;
        color: $text-muted;
        padding: 0 1;
    }
    ProcessesView #process-filter {
        display: none;
        height: 1;
        border: none;
        padding: 0 1;
    }
    ProcessesView #process-filter.-open {
        display: block;
    }
    ProcessesView ProcessTable {
        height: 1fr;
    }
    """

    BINDINGS = [Binding("escape", "escape", "Close the filter", show=False)]

    def __init__(self, table: ProcessTable, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.table = table
        self.note = Static("", id="process-note")
        self.filter = Input(
            placeholder="filter: words of pid, user, GPU, command, phase", id="process-filter"
        )
        self._note = ""

    def compose(self) -> ComposeResult:
        yield self.note
        yield self.table
        yield self.filter

    def show_note(self, text: str) -> None:
        if text != self._note:
            self._note = text
            self.note.update(plain_lines(text.split("\n")))

    def open_filter(self) -> None:
        self.filter.value = self.table.filter_text
        self.filter.add_class("-open")
        self.filter.focus()

    @on(Input.Changed, "#process-filter")
    def _typed(self, event: Input.Changed) -> None:
        self.table.filter_text = event.value.strip()
        self.table.refresh_rows()

    @on(Input.Submitted, "#process-filter")
    def _kept(self) -> None:
        self.filter.remove_class("-open")
        self.table.focus()

    async def action_escape(self) -> None:
        """Clear and close the filter line when it is open; else the dashboard's escape."""
        if not self.filter.has_class("-open"):
            await self.app.run_action("clear_cursor")
            return
        self.filter.value = ""
        self.table.filter_text = ""
        self.filter.remove_class("-open")
        self.table.focus()
        self.table.refresh_rows()


def _figures(r: pr.ProcRow) -> tuple[object, ...]:
    """What a row shows, to tell whether a refresh changed anything."""
    return (r.pid, r.device, r.gpu_mem, r.sm, r.cpu, r.rss, r.phase, r.rank, r.depth)


def _line(
    cells: list[str] | tuple[str, ...], width: int, cols: list[tuple[str, int]], hscroll: int = 0
) -> str:
    """One row's cells of the columns ``cols`` (key, cells), cut or padded to ``width``
    (printable); the command's cell starts ``hscroll`` cells in."""
    parts = []
    raw = "".join(cells)
    safe = printable(raw) is raw  # one look at the whole row: escapes are rare
    index = COLUMN_INDEX
    for key, w in cols:
        text = cells[index[key]]
        if not safe:
            text = printable(text)
        if w:
            text = text[:w].rjust(w) if key in RIGHT else text[:w].ljust(w)
        elif hscroll:
            text = text[hscroll:]
        parts.append(text)
    return " " + " ".join(parts)[: max(0, width - 1)].ljust(max(0, width - 1))


COLUMN_INDEX = {key: i for i, (key, _) in enumerate(pr.COLUMNS)}


def _cell_spans(cols: list[tuple[str, int]], keys: tuple[str, ...]) -> list[tuple[int, int]]:
    """Where the cells of columns ``keys`` lie on a line of :func:`_line` ((0, 0): not
    shown)."""
    at = 1
    where = {}
    for key, w in cols:
        where[key] = (at, at + w)
        at += w + 1
    return [where.get(k, (0, 0)) for k in keys]


def _bytes(v: int | None, listed: bool) -> str:
    return fmt_bytes(v) if v is not None else "n/a" if listed else ""


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f}%"


def _owner(pid: int) -> int | None:
    """The real uid owning ``pid`` now; None when it has ended."""
    try:
        return psutil.Process(pid).uids().real
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return -1  # not ours to read: not ours to signal either


def _same_process(pid: int, started: float) -> bool:
    """``pid`` is still the process that started at ``started`` (not a reused pid)."""
    try:
        return abs(psutil.Process(pid).create_time() - started) < 0.5
    except psutil.Error:
        return False
