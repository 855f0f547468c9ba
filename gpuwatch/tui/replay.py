"""Replay: the dashboard over a recording, its transport a :class:`Player`.

The playback position is the dashboard's clock: while playing, the window follows it as it
follows "now" when live. Paused, the whole recording can be browsed (zoomed, panned,
jumped through) and playing again resumes from the position.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable
from dataclasses import replace

from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Keymap
from textual.widget import Widget

from ..fmt import fmt_clock
from ..store.player import Player
from .actions import REPLAY_ACTIONS
from .app import GpuwatchApp
from .time_window import MIN_SPAN
from .transport import Dashboard, Seek, Transport


class Scrubber(Widget):
    """Where the playback is in the recording, and how much is loaded; click to seek."""

    DEFAULT_CSS = """
    Scrubber {
        height: 1;
        padding: 0 1;
        background: $panel;
    }
    """

    def __init__(self, player: Player) -> None:
        super().__init__()
        self.player = player
        self._bar = (0, 0)  # (first cell, cells) of the bar within the widget
        self._drawn: tuple[object, ...] | None = None  # the state last rendered

    def state(self) -> tuple[object, ...]:
        """What :meth:`render` draws from: the bar changes only when this does."""
        p = self.player
        loader = p.loader
        loading = None if loader is None else (loader.done, loader.loaded_until)
        return (p.playing, p.speed, p.position(), p.bounds(), p.growing, loading)

    def tick(self) -> None:
        """Redraw if the playback or the loading moved: a paused replay that has loaded
        all of its file sends nothing (a browser would receive, parse and paint the same
        line four times a second)."""
        state = self.state()
        if state != self._drawn:
            self.refresh()

    def render(self) -> Text:
        self._drawn = self.state()
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
            self.post_message(Seek((x - start) / cells))


_NOTHING = {
    "next_oom": "no OOM after the cursor (O goes back)",
    "prev_oom": "no OOM before the cursor (o goes on)",
    "next_mark": "no mark after the cursor (M goes back)",
    "prev_mark": "no mark before the cursor (m goes on)",
}
"""What a jump that finds nothing says: a replay opens on its spike, so the one OOM of a
recording can lie behind the cursor."""


class ReplayTransport(Transport):
    """A :class:`Player` drives the dashboard: its position is the clock.

    Args:
        player: The recording, played.
        subtitle: Shown in the status bar (the file replayed).
    """

    actions = REPLAY_ACTIONS
    tab_after = "transport('jump_spike')"
    no_log = ("a replay has no Log tab: only gpuwatch run shows its command's output", 3.0)
    polled = True  # the position moves at the playback speed, the loader fills in

    def __init__(self, player: Player, subtitle: str = "") -> None:
        super().__init__(self._replay_now, subtitle)
        self.player = player
        self.scrubber = Scrubber(player)
        # Notes in the file are the recording's (its machine had no driver, say), not ours;
        # the loader's own (a damaged chunk) come later and are this replay's.
        self._recorded_notes = set(player.session.notes)
        loader = player.loader
        self._recorded_on = loader.recording.meta.get("host", "") if loader is not None else ""
        self._frozen = False

    def attach(self, dashboard: Dashboard) -> None:
        super().attach(dashboard)
        # Modules, the file's index and the session opened so far live as long as the
        # app: out of the collector's view, its full passes while the screen is built
        # see only what is new (a 7-day recording's first frame spent most of its
        # collection time on them, measured with gc.callbacks).
        gc.freeze()

    def widgets(self) -> list[Scrubber]:
        return [self.scrubber]

    def mount(self) -> None:
        self._open_on_the_data()
        self.dashboard.set_interval(0.25, self._transport_tick)

    def _open_on_the_data(self) -> None:
        """Start paused on the recording's data, the cursor on its highest exact peak.

        A file still being written keeps following its tail instead.
        """
        if self.player.growing:
            return
        opening = self.player.session.read(self.player.opening)
        self.player.pause()
        self.player.seek(opening.position)
        t0, t1 = opening.window
        # A recording of one sample still has a width.
        span = max(t1 - t0, MIN_SPAN)
        self.dashboard.view = replace(self.dashboard.view, span=span, end=t1, cursor=opening.cursor)

    def figures_time(self, window: tuple[int, int]) -> int:
        """The cursor, else the playback position."""
        if self.dashboard.view.cursor is not None:
            return self.dashboard.view.cursor
        return self.player.position()

    def notes_text(self, notes: Iterable[str]) -> str:
        """The session's ``notes``, those from the file marked as the recording's."""
        where = f"recorded on {self._recorded_on}" if self._recorded_on else "in the recording"
        return "\n".join(
            f"{where}: {note}" if note in self._recorded_notes else note
            for note in notes
        )

    def _transport_tick(self) -> None:
        self.scrubber.tick()
        loader = self.player.loader
        if not self._frozen and (loader is None or loader.done):
            # Loading is over: what exists now lives as long as the app. Taking it out of
            # the collector's view keeps a full collection from stalling a seek.
            self._frozen = True
            gc.collect()
            gc.freeze()

    def _replay_now(self) -> int:
        # Following: the playback position. Paused to browse: the whole recording is open.
        if self.dashboard.view.following or self.player.playing:
            return self.player.position()
        return self.player.bounds()[1]

    def follow_text(self) -> str:
        if self.dashboard.view.following:
            return "the window follows the playback position"
        return "the window stays"

    def mode_text(self) -> str:
        return "REPLAY " + ("▶" if self.player.playing else "paused")

    def frame_key(self, now: int) -> tuple[object, int] | None:
        # Playing and following: like live. Otherwise the position stands still and the
        # frame changes with the data (the loader filling in) or a key.
        if self.player.playing and self.dashboard.view.following:
            return None
        return ("replay", self.player.session.version, now), now

    def _follow_position(self) -> None:
        self.dashboard.view = self.dashboard.view.followed()

    def move_cursor(self, cells: int) -> None:
        """Move by chart columns: the cursor and the position together (paused), the
        position (playing)."""
        view = self.dashboard.view
        # A column's time as the live cursor steps it (TimeWindow.cursor_moved).
        self._seek_by(cells * max(1, view.span // max(self.dashboard.plot_width(), 1)))

    def _seek_by(self, delta: int) -> None:
        """Seek by ``delta`` ns: playing, the window follows; paused, the cursor moves
        from where it is (else from the position) and the window scrolls only as far as
        keeps it in view, so the chart never jumps back."""
        if self.player.playing:
            self.player.seek_by(delta)
            self._follow_position()
            return
        view = self.dashboard.view
        base = view.cursor if view.cursor is not None else self.player.position()
        pos = self.player.seek(base + delta)
        now = self._replay_now()
        self.dashboard.view = view.with_cursor(pos, now).revealing(pos, now)

    def redrawing(self) -> None:
        """Paused, the playback position is where the cursor is (the scrubber and the
        cursor tell one time, and play resumes from what is being read)."""
        cursor = self.dashboard.view.cursor
        if cursor is not None and not self.player.playing and self.player.position() != cursor:
            self.player.seek(cursor)
        self.scrubber.refresh()

    def seek_fraction(self, fraction: float) -> None:
        first, last = self.player.session.read(self.player.bounds)
        self.player.seek(first + int(fraction * (last - first)))
        self._follow_position()

    # ------------------------------------------------------------------ actions

    def action_toggle_play(self) -> None:
        """Play / pause; playing again makes the window follow the position."""
        if self.player.playing:
            self.player.pause()
            self.dashboard.view = self.dashboard.view.paused(self.player.position())
        else:
            self.player.play()
            self._follow_position()

    def action_home(self) -> None:
        """Seek to the start."""
        self.player.home()
        self._follow_position()

    def action_end(self) -> None:
        """Seek to the end (and keep following a growing file)."""
        self.player.end()
        self._follow_position()

    def action_speed(self, direction: int) -> None:
        """Double or halve the speed."""
        speed = self.player.faster() if direction > 0 else self.player.slower()
        self.dashboard.notify(f"speed x{speed:g}", timeout=1.5)
        self.scrubber.refresh()

    def action_jump_boundary(self, direction: int) -> None:
        """Seek to the next / previous phase start or end; pause there."""
        self._jump("next_phase" if direction > 0 else "prev_phase")

    def action_jump_event(self, direction: int) -> None:
        """Seek to the next / previous mark, and say what it says; pause there."""
        self._jump("next_mark" if direction > 0 else "prev_mark")

    def action_jump_oom(self, direction: int) -> None:
        """Seek to the next / previous out-of-memory error; pause there."""
        self._jump("next_oom" if direction > 0 else "prev_oom")

    def action_jump_spike(self) -> None:
        """Seek to the largest spike; pause there."""
        self._jump("jump_to_spike")

    def _jump(self, method: str) -> None:
        """Seek to a phase boundary, mark, OOM or the largest spike; pause there."""
        app = self.dashboard
        read = self.player.session.read
        target = read(getattr(self.player, method))
        if target is None:
            app.notify(_NOTHING.get(method, "nothing there"), severity="warning", timeout=2)
            return
        if method == "jump_to_spike":
            spike = read(self.player.spike)
            if spike is not None:
                app.tell_spike(spike)
        elif method in ("next_oom", "prev_oom", "next_mark", "prev_mark"):
            app.tell_events(target)
        self.player.pause()
        app.view = app.view.jumped(target, self._replay_now())

    def action_whole(self) -> None:
        """Zoom out to the whole recording."""
        first, last = self.player.session.read(self.player.bounds)
        self.player.pause()
        span = max(last - first, 10**8)
        self.dashboard.view = replace(self.dashboard.view, span=span, end=first + span, cursor=None)


def replay_app(
    player: Player,
    *,
    theme_name: str | None = None,
    subtitle: str = "",
    keymap: Keymap | None = None,
) -> GpuwatchApp:
    """The dashboard over ``player``'s recording."""
    return GpuwatchApp(
        player.session,
        transport=ReplayTransport(player, subtitle),
        theme_name=theme_name,
        keymap=keymap,
    )
