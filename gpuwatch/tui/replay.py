"""Replay: the same dashboard over a recording, with transport controls.

The playback position is the dashboard's clock: while playing, the window follows it as it
follows "now" when live. Paused, the whole recording can be browsed (zoomed, panned,
jumped through) and playing again resumes from the position.
"""

from __future__ import annotations

import gc

from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.message import Message
from textual.widget import Widget

from ..fmt import fmt_clock
from ..store.player import Player
from .app import ACTIONS, Action, GpuwatchApp, bindings, kept_actions
from .time_window import MIN_SPAN

REPLAY_ACTIONS: tuple[Action, ...] = (
    Action("space", "toggle_play", "Play / pause", "Play or pause the recording", True, "space"),
    # The arrows mean what they mean live (the cursor: one column, ctrl a tenth of the
    # window); paused, the playback position goes with the cursor, playing it seeks.
    Action("right", "cursor(1)", "Cursor right", "Cursor and position one column on"),
    Action("left", "cursor(-1)", "Cursor left", "Cursor and position one column back"),
    Action(
        "ctrl+right",
        "cursor_window(0.1)",
        "Cursor far right",
        "Cursor and position a tenth of the window on",
    ),
    Action(
        "ctrl+left",
        "cursor_window(-0.1)",
        "Cursor far left",
        "Cursor and position a tenth of the window back",
    ),
    Action("home", "seek_home", "Start", "Seek to the start of the recording"),
    Action("end", "seek_end", "End", "Seek to the end (a growing file: follow its tail)"),
    Action(
        "right_square_bracket",
        "replay_jump('next_phase')",
        "Next phase boundary",
        "Seek to the next phase start or end",
        False,
        "]",
    ),
    Action(
        "left_square_bracket",
        "replay_jump('prev_phase')",
        "Previous phase boundary",
        "Seek to the previous phase start or end",
        False,
        "[",
    ),
    Action("m", "replay_jump('next_mark')", "Next mark", "Seek to the next mark"),
    Action("M", "replay_jump('prev_mark')", "Previous mark", "Seek to the previous mark"),
    Action("o", "replay_jump('next_oom')", "Next OOM", "Seek to the next out-of-memory error"),
    Action(
        "O", "replay_jump('prev_oom')", "Previous OOM", "Seek to the previous out-of-memory error"
    ),
    Action(
        "s",
        "replay_jump('jump_to_spike')",
        "Largest spike",
        "Seek to the highest exact phase peak (else nvidia-smi's highest reading)",
        True,
    ),
    Action("w", "whole", "Whole session", "Show the whole recording at once", True),
    Action(
        "greater_than_sign", "speed(1)", "Faster", "Double the playback speed (to x64)", True, ">"
    ),
    Action(
        "less_than_sign", "speed(-1)", "Slower", "Halve the playback speed (to x0.25)", True, "<"
    ),
    # Live keys kept, but out of the footer: replay's own keys need the room.
    Action("f", "toggle_follow", "Follow position", "Let the window follow the playback position"),
    Action("y", "toggle_fit", "Fit / total", "Scale the y axis to the data or to the total"),
)

_KEPT = kept_actions(ACTIONS, REPLAY_ACTIONS)
"""The live keys replay keeps: those its own table does not bind."""


class Scrubber(Widget):
    """Where the playback is in the recording, and how much is loaded; click to seek."""

    DEFAULT_CSS = """
    Scrubber {
        height: 1;
        padding: 0 1;
        background: $panel;
    }
    """

    class Seek(Message):
        """Seek to ``fraction`` of the recording."""

        def __init__(self, fraction: float) -> None:
            super().__init__()
            self.fraction = fraction

    def __init__(self, player: Player) -> None:
        super().__init__()
        self.player = player
        self._bar = (0, 0)  # (first cell, cells) of the bar within the widget

    def render(self) -> Text:
        p = self.player
        first, last = p.bounds()
        pos = p.position()
        span = max(1, last - first)
        variables = self.app.theme_variables
        state = "▶" if p.playing else "paused"
        left = f"{state} x{p.speed:g}  "
        # On the axis's clock (the session's origin), as the cursor and the legend.
        origin = p.session.t_origin
        right = f"  {fmt_clock(pos - origin)} / {fmt_clock(last - origin)}"
        loader = p.loader
        if loader is not None and not loader.done and not p.growing:
            loaded = (loader.loaded_until - first) / span
            right += f"  loading {min(100, max(0, int(loaded * 100)))}%"
        elif p.growing:
            right += "  following a growing file"
        # The content's width (padding excluded): the clock on the right is what a user
        # reads, so the bar gives way, never the total.
        width = max(10, self.content_size.width - len(left) - len(right))
        self._bar = (len(left), width)
        # The knob takes a cell of its own: at the very end (or a position past the last
        # sample) it sits in the bar's last cell instead of pushing the clock off the line.
        played = min(width - 1, max(0, int(width * (pos - first) / span)))
        loaded_cells = width
        if loader is not None and not loader.done:
            loaded_cells = int(width * (loader.loaded_until - first) / span)
        bar = Text()
        bar.append("━" * played, Style(color=variables.get("gw-allocated")))
        bar.append("●", Style(color=variables.get("gw-allocated"), bold=True))
        rest = max(0, width - played - 1)
        loaded_rest = max(0, min(rest, loaded_cells - played - 1))
        bar.append("─" * loaded_rest, Style(color=variables.get("gw-axis")))
        bar.append("┄" * (rest - loaded_rest), Style(color=variables.get("gw-grid")))
        return Text(left) + bar + Text(right)

    def on_click(self, event: events.Click) -> None:
        start, cells = self._bar
        x = event.x - 1  # padding
        if cells and start <= x < start + cells:
            self.post_message(self.Seek((x - start) / cells))


_NOTHING = {
    "next_oom": "no OOM after the cursor (O goes back)",
    "prev_oom": "no OOM before the cursor (o goes on)",
    "next_mark": "no mark after the cursor (M goes back)",
    "prev_mark": "no mark before the cursor (m goes on)",
}
"""What a jump that finds nothing says: a replay opens on its spike, so the one OOM of a
recording can lie behind the cursor."""


class ReplayApp(GpuwatchApp):
    """The dashboard over a recording, driven by a :class:`Player`."""

    ACTION_TABLE = REPLAY_ACTIONS + _KEPT
    # Textual merges these over the live bindings: the keys named here change meaning,
    # the rest (zoom, tabs, f, shift+arrows, help, quit) stay.
    BINDINGS = bindings(REPLAY_ACTIONS)
    TAB_AFTER = "replay_jump('jump_to_spike')"

    def __init__(
        self, player: Player, *, theme_name: str | None = None, subtitle: str = ""
    ) -> None:
        # Modules, the file's index and the session opened so far live as long as the
        # app: out of the collector's view, its full passes while the screen is built
        # see only what is new (a 7-day recording's first frame: 100 ms of collection
        # before, measured with gc.callbacks).
        gc.freeze()
        super().__init__(
            player.session, theme_name=theme_name, subtitle=subtitle, clock=self._replay_now
        )
        self.player = player
        self.scrubber = Scrubber(player)
        # Notes in the file are the recording's (its machine had no driver, say), not ours;
        # the loader's own (a damaged chunk) come later and are this replay's.
        self._recorded_notes = set(player.session.notes)
        loader = player.loader
        self._recorded_on = loader.recording.meta.get("host", "") if loader is not None else ""

    def compose(self) -> ComposeResult:
        for widget in super().compose():
            yield widget
            if widget is self.notes_bar:
                yield self.scrubber

    def on_mount(self) -> None:
        self._open_on_the_data()
        super().on_mount()
        self.set_interval(0.25, self._transport_tick)
        self._frozen = False

    def _open_on_the_data(self) -> None:
        """Start paused on the recording's data, the cursor on its highest exact peak.

        A file still being written keeps following its tail instead.
        """
        if self.player.growing:
            return
        opening = self.player.opening()
        self.player.pause()
        self.player.seek(opening.position)
        t0, t1 = opening.window
        self.view.span = max(t1 - t0, MIN_SPAN)  # a recording of one sample still has a width
        self.view.end = t1
        self.view.cursor = opening.cursor

    def figures_time(self, window: tuple[int, int]) -> int:
        """The cursor, else the playback position."""
        if self.view.cursor is not None:
            return self.view.cursor
        return self.player.position()

    def notes_text(self) -> str:
        """The session's notes, those from the file marked as the recording's."""
        where = f"recorded on {self._recorded_on}" if self._recorded_on else "in the recording"
        return "\n".join(
            f"{where}: {note}" if note in self._recorded_notes else note
            for note in self.session.notes
        )

    def _transport_tick(self) -> None:
        self.scrubber.refresh()
        loader = self.player.loader
        if not self._frozen and (loader is None or loader.done):
            # Loading is over: what exists now lives as long as the app. Taking it out of
            # the collector's view keeps a full collection from stalling a seek (measured:
            # worst seek 340 ms -> 36 ms on a 24 h x 8 GPU recording).
            self._frozen = True
            gc.collect()
            gc.freeze()

    def _replay_now(self) -> int:
        # Following: the playback position. Paused to browse: the whole recording is open.
        if self.view.following or self.player.playing:
            return self.player.position()
        return self.player.bounds()[1]

    def follow_text(self) -> str:
        if self.view.following:
            return "the window follows the playback position"
        return "the window stays"

    def mode_text(self) -> str:
        return "REPLAY " + ("▶" if self.player.playing else "paused")

    def frame_key(self, now: int) -> tuple[object, int]:
        # Playing and following: like live. Otherwise the position stands still and the
        # frame changes with the data (the loader filling in) or a key.
        if self.player.playing and self.view.following:
            return super().frame_key(now)
        return ("replay", self.session.version, now), now

    # ------------------------------------------------------------------ actions

    def _follow_position(self) -> None:
        self.view.follow()
        self.redraw()
        self.scrubber.refresh()

    def action_toggle_play(self) -> None:
        """Play / pause; playing again makes the window follow the position."""
        if self.player.playing:
            self.player.pause()
            self.view.pause(self.player.position())
            self.redraw()
            self.scrubber.refresh()
        else:
            self.player.play()
            self._follow_position()

    def action_cursor(self, cells: int) -> None:
        """Move by chart columns: the cursor and the position together (paused), the
        position (playing)."""
        # A column's time as the live cursor steps it (TimeWindow.move_cursor).
        self._seek_by(cells * max(1, self.view.span // max(self._plot_width(), 1)))

    def action_seek(self, fraction: float) -> None:
        """Seek by a fraction of the window (see :meth:`_seek_by`)."""
        self._seek_by(int(fraction * self.view.span))

    def _seek_by(self, delta: int) -> None:
        """Seek by ``delta`` ns: playing, the window follows; paused, the cursor moves
        from where it is (else from the position) and the window scrolls only as far as
        keeps it in view, so the chart never jumps back."""
        if self.player.playing:
            self.player.seek_by(delta)
            self._follow_position()
            return
        base = self.view.cursor if self.view.cursor is not None else self.player.position()
        pos = self.player.seek(base + delta)
        now = self._replay_now()
        self.view.set_cursor(pos, now)
        self.view.reveal(pos, now)
        self.redraw()

    def redraw(self) -> None:
        """Redraw; paused, the playback position is where the cursor is (the scrubber
        and the cursor tell one time, and play resumes from what is being read)."""
        cursor = self.view.cursor
        if cursor is not None and not self.player.playing and self.player.position() != cursor:
            self.player.seek(cursor)
        super().redraw()
        self.scrubber.refresh()

    def action_seek_home(self) -> None:
        """Seek to the start."""
        self.player.home()
        self._follow_position()

    def action_seek_end(self) -> None:
        """Seek to the end (and keep following a growing file)."""
        self.player.end()
        self._follow_position()

    def action_speed(self, direction: int) -> None:
        """Double or halve the speed."""
        speed = self.player.faster() if direction > 0 else self.player.slower()
        self.notify(f"speed x{speed:g}", timeout=1.5)
        self.scrubber.refresh()

    def action_replay_jump(self, method: str) -> None:
        """Seek to a phase boundary, mark, OOM or the largest spike; pause there."""
        target = getattr(self.player, method)()
        if target is None:
            self.notify(_NOTHING.get(method, "nothing there"), severity="warning", timeout=2)
            return
        if method == "jump_to_spike":
            spike = self.player.spike()
            if spike is not None:
                self.tell_spike(spike)
        elif method in ("next_oom", "prev_oom", "next_mark", "prev_mark"):
            self.tell_events(target)
        self.player.pause()
        self.view.jump(target, self._replay_now())
        self.redraw()
        self.scrubber.refresh()

    def action_show_tab(self, tab: str) -> None:
        """As live; a replay has no Log tab, and says why."""
        if tab == "log":
            self.notify(
                "a replay has no Log tab: only gpuwatch run shows its command's output",
                timeout=3,
            )
            return
        super().action_show_tab(tab)

    def action_whole(self) -> None:
        """Zoom out to the whole recording."""
        first, last = self.player.bounds()
        self.player.pause()
        self.view.span = max(last - first, 10**8)
        self.view.end = first + self.view.span
        self.view.cursor = None
        self.redraw()
        self.scrubber.refresh()

    def on_scrubber_seek(self, event: Scrubber.Seek) -> None:
        first, last = self.player.bounds()
        self.player.seek(first + int(event.fraction * (last - first)))
        self._follow_position()
