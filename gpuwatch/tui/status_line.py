"""The dashboard's status line and notes line: what the dashboard says about itself."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from textual.notifications import SeverityLevel
from textual.widgets import Static

from ..fmt import ellipsis, fmt_clock, fmt_duration
from ..session import Session
from ..session.frame import FrameState
from . import marks
from ._text import Fitted, Part, markup_safe, plain_lines
from .ranks import RanksView
from .time_window import TimeWindow
from .transport import Transport

MARK_CELLS = 48
"""The most of a mark's text the status line shows at the cursor (the Peaks tab lists it
whole)."""
MARK_FLOOR = 24
"""Where room is short, the mark's text is cut down to this many cells before anything
else in the status line gives way (its first 20 or so characters stay readable at 80
columns); the rest of it goes only after the subtitle, window and count."""
SUBTITLE_FLOOR = 24
"""The status line's subtitle (the file replayed, the recording and socket) is cut down to
this many cells, like the mark, before the window and the count give way: its start says
what is shown (a list of merged files would otherwise push them out)."""

PartSource = Callable[[tuple[int, int]], Iterable[Part]]
"""Gives the parts one source adds to the status line, for the window shown."""


class StatusLine(Fitted):
    """One line of :class:`Part` s, fitted to the width, each from a named source.

    :attr:`sources` maps a name to a function of the window shown that returns the parts
    it adds (none, one or several), in the order the line shows them. The dashboard's own
    (:class:`DashboardParts`) are ``mode``, ``warnings``, ``cursor``, ``window``, ``count``,
    ``command`` and ``subtitle``. Another part is one more source, placed by name::

        screen.status_bar.add_source("forecast", forecast_parts, before="cursor")

    A part's ``keep`` says when it gives way where room is short (lower first; None:
    never, as a safety warning must show) and ``floor`` how far it is cut before anything
    goes (see :class:`~gpuwatch.tui._text.Part`). :meth:`show` asks every source at each
    frame, so a source reads the state it shows then (cheaply: 2 a second live, 20 in a
    replay).
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.sources: dict[str, PartSource] = {}

    def add_source(self, name: str, source: PartSource, *, before: str | None = None) -> None:
        """Add (or replace) the source ``name``, before the source ``before`` (None: last)."""
        items = [(k, v) for k, v in self.sources.items() if k != name]
        at = next((i for i, (k, _) in enumerate(items) if k == before), len(items))
        items.insert(at, (name, source))
        self.sources = dict(items)

    def show(self, window: tuple[int, int]) -> None:
        """Ask every source for its parts for ``window``, and show them."""
        self.set([part for source in self.sources.values() for part in source(window)])


class NotesLine(Static):
    """What the session has to say (no driver, not recording...), one note a line; on a
    short screen one line for them all, cut with an ellipsis (app.tcss)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.display = False
        self._shown: tuple[str, bool] = ("", False)  # the notes shown, and on a short screen

    def show(self, notes: str, short: bool) -> None:
        """Show ``notes`` (lines), on a short screen or not."""
        if (notes, short) == self._shown:
            return  # height auto: a new note needs a layout pass
        self._shown = (notes, short)
        lines = notes.split("\n") if notes else []
        self.update(plain_lines([" · ".join(lines)] if short else lines))
        self.display = bool(notes)


class Described(Protocol):
    """What :class:`DashboardParts` reads of the dashboard (its main screen): of the
    session, the frame's :attr:`state` only (``session`` is told a command's exit)."""

    session: Session
    state: FrameState
    transport: Transport
    view: TimeWindow
    child: Any  # main_screen.ChildLike, or None
    ranks_view: RanksView
    marks_table: marks.MarksTable

    def keys_now(self) -> dict[str, list[str]]:
        """Each action and the keys that run it now, as shown."""

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        """A toast."""


class DashboardParts:
    """The dashboard's own status-line sources, in this order: ``gpuwatch`` and the mode,
    the warnings (rank faults, rejected or dropped messages, a recording that stopped),
    the cursor's time and the mark or OOM nearest it, the window, the instrumented count,
    the command, and the subtitle (the file replayed, or the recording and socket).

    Where the room is short they give way in another order: the mark's text is cut first,
    down to :data:`MARK_FLOOR` cells, and the subtitle to :data:`SUBTITLE_FLOOR`; then the
    count goes, then the window, the rest of the subtitle, the command, the rest of the
    mark and the cursor. So what the cursor reads stays readable at 80 columns, and the
    file's name before the counts. The mode and the warnings never give way.
    """

    def __init__(self, screen: Described) -> None:
        self.screen = screen
        self._child_status: int | None = None

    def _key(self, action: str, what: str) -> str:
        """`` (KEY{what})`` for the first key that runs ``action`` now; "" where none does
        (the keymap decides: the status line never names a key by hand)."""
        keys = self.screen.keys_now().get(action)
        return f" ({keys[0]}{what})" if keys else ""

    def install(self, line: StatusLine) -> None:
        """Give ``line`` these sources."""
        for name, source in (
            ("mode", self.mode),
            ("warnings", self.warnings),
            ("cursor", self.cursor),
            ("window", self.window),
            ("count", self.count),
            ("command", self.command),
            ("subtitle", self.subtitle),
        ):
            line.add_source(name, source)

    def mode(self, window: tuple[int, int]) -> list[Part]:
        return [Part(f"[b]gpuwatch[/b] · {self.screen.transport.mode_text()}")]

    def warnings(self, window: tuple[int, int]) -> list[Part]:
        s = self.screen
        parts = []
        faults = s.ranks_view.faults
        if faults:  # the job's ranks disagree: the Ranks tab says how
            key = self._key("show_ranks", "")
            text = f"! {faults} rank fault{'s' * (faults != 1)}{key}"
            parts.append(Part(f"[$warning]{markup_safe(text)}[/]"))
        rejects, dropped = s.state.rejects, s.state.dropped
        if rejects:
            parts.append(Part(f"[$warning]{rejects} rejected[/]"))
        if dropped:
            parts.append(Part(f"[$warning]{dropped} dropped[/]"))
        warning = s.transport.warning()
        if warning:
            parts.append(Part(f"[$warning]{markup_safe(warning)}[/]"))
        return parts

    def cursor(self, window: tuple[int, int]) -> list[Part]:
        """What the cursor reads: the time, and the mark or OOM nearest to it in the window
        with what it says."""
        s = self.screen
        cursor, origin = s.view.cursor, s.state.t_origin
        if cursor is None:
            return []
        parts = [Part(f"cursor {fmt_clock(cursor - origin)}", keep=6)]
        near = s.state.nearest(cursor)
        if near is not None:
            at = f"{marks.symbol(near)} {fmt_clock(near.t - origin)} "
            said = ellipsis(s.marks_table.describe(near, short=True), MARK_CELLS)
            parts.append(Part(markup_safe(at + said), keep=5, floor=len(at) + MARK_FLOOR))
        return parts

    def window(self, window: tuple[int, int]) -> list[Part]:
        return [Part(f"window {fmt_duration(self.screen.view.span)}", keep=2)]

    def count(self, window: tuple[int, int]) -> list[Part]:
        # The processes the bands show: those alive in the window.
        return [Part(f"{self.screen.state.instrumented} instrumented", keep=1)]

    def subtitle(self, window: tuple[int, int]) -> list[Part]:
        subtitle = self.screen.transport.subtitle()
        return [Part(markup_safe(subtitle), keep=3, floor=SUBTITLE_FLOOR)] if subtitle else []

    def command(self, window: tuple[int, int]) -> list[Part]:
        """The state of the command ``gpuwatch run`` started; its exit is said once."""
        child = self.screen.child
        if child is None:
            return []
        code = child.poll()
        if code is None:
            log = self._key("show_tab('log')", ": log")
            return [Part(markup_safe(f"running pid {child.pid}{log}"), keep=4)]
        status = child.exit_status
        if self._child_status is None:
            self._child_status = status
            self.screen.session.child_exited(child.pid, status)
            torch = child.torch_hint()
            hint = f"\n{torch}" if torch else ""
            self.screen.notify(
                f"the command exited with status {status}{hint}",
                severity="information" if status == 0 else "error",
                timeout=10 if hint else 6,
                markup=False,  # "gpuwatch[torch]" is not a style
            )
        colour = "$success" if status == 0 else "$error"
        return [Part(f"[{colour}]command exited {status}[/]", keep=4)]
