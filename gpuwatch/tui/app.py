"""The gpuwatch Textual app: small, its main screen in charge.

The app holds what the whole program shares: the session, the transport that drives it
(live or a replay), the theme, the keymap, the load thresholds and the command started
by ``gpuwatch run``; it quits (asking first while that command runs) and lists every
action in the command palette. The dashboard itself, its widgets, keys, actions and
frames, is its screen (:class:`~gpuwatch.tui.main_screen.MainScreen`), as toolong and
posting do it.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import signal
from collections.abc import Callable, Iterable

from textual.app import App, SystemCommand
from textual.binding import Binding, Keymap
from textual.screen import Screen

from ..fmt import ellipsis
from ..session import Session
from .confirm import Confirm
from .frame_clock import REDRAW_HZ
from .keys import key_display
from .main_screen import ChildLike, MainScreen
from .overview import CSS_PATH as OVERVIEW_CSS
from .parsed_css import SharedStylesheet
from .theme import DEFAULT_THEME, VARIABLE_DEFAULTS, builtin_themes
from .thresholds import Thresholds
from .time_window import TimeWindow
from .transport import Transport

SHORT_BELOW = 36
"""Terminal rows below which panels are shown one at a time (80x24 gets ~12 chart rows)."""
NARROW_BELOW = 100
"""Terminal columns below which the status line and keys are fitted more tightly."""


class GpuwatchApp(App[int]):
    """The dashboard over a :class:`~gpuwatch.session.Session` (live or replayed).

    Args:
        session: What to show.
        theme_name: A theme from ``themes/`` (default ``gpuwatch-dark``).
        subtitle: Shown in the status line (socket path, file name...), or a function that
            says it anew at each refresh (the live sources: recording, or why not).
        warning: A warning the status line always shows (a recording that stopped), or None.
        clock: Returns the newest time to show (default :meth:`Session.now`).
        transport: What drives the dashboard (default: live, from ``clock``, ``subtitle``
            and ``warning``); :class:`~gpuwatch.tui.replay.ReplayTransport` replays.
        keymap: Binding ids to keys (see :data:`~gpuwatch.tui.keymap.KEY_IDS`), over the
            defaults.
        child: The command started by ``gpuwatch run``: its output gets a tab, its state
            the status line, and quitting while it runs asks first.
        quit_if: Asked once the app has mounted: True quits at once (a SIGTERM that came
            before the app took the signal over).
        thresholds: Where memory and utilisation turn from low to mid to high (default
            nvitop's: see :mod:`~gpuwatch.tui.thresholds`).
    """

    TITLE = "gpuwatch"
    readonly = False
    """``--readonly``: no signal goes to a process from this dashboard (as nvitop's)."""
    # A short terminal (80x24) shows one device panel at a time (tab steps through them),
    # a one-line tab strip and notes; a narrow one fits the status line and keys to its width.
    VERTICAL_BREAKPOINTS = [(0, "-short"), (SHORT_BELOW, "-tall")]
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (NARROW_BELOW, "-wide")]
    CSS_PATH = [OVERVIEW_CSS, "app.tcss"]

    def __init__(
        self,
        session: Session,
        *,
        theme_name: str | None = None,
        subtitle: str | Callable[[], str] = "",
        warning: Callable[[], str | None] | None = None,
        clock: Callable[[], int] | None = None,
        transport: Transport | None = None,
        keymap: Keymap | None = None,
        child: ChildLike | None = None,
        quit_if: Callable[[], bool] | None = None,
        thresholds: Thresholds | None = None,
    ) -> None:
        self.thresholds = thresholds or Thresholds()  # the load levels' (flags, config)
        self.transport = transport or Transport(clock or session.now, subtitle, warning)
        super().__init__()
        # What another app of this process parsed is not parsed again (a served visitor's
        # process finds what its fork server parsed drawing the dashboard once).
        self.stylesheet = SharedStylesheet(variables=self.get_css_variables())
        if keymap:
            self.set_keymap(keymap)
        self.session = session
        self.child = child
        self._quit_if = quit_if
        self._theme_name = theme_name or DEFAULT_THEME
        # Set before the first styling pass, which then reads our theme's variables: set
        # in on_mount, every widget was restyled (and all CSS parsed again) before the
        # first frame, which a browser visitor waits for.
        for theme in builtin_themes():
            self.register_theme(theme)
        self.theme = self._theme_name
        self.dashboard = MainScreen(session, self.transport, child)
        """The main screen: the dashboard's widgets, keys, actions and frames."""

    def get_theme_variable_defaults(self) -> dict[str, str]:
        # Every gw-* variable exists from the first frame, whatever theme is current
        # (one of Textual's own themes, picked from the palette, defines none of them).
        return {**super().get_theme_variable_defaults(), **VARIABLE_DEFAULTS}

    def get_default_screen(self) -> Screen:
        return self.dashboard

    def get_key_display(self, binding: Binding) -> str:
        return key_display(binding) or super().get_key_display(binding)

    @property
    def view(self) -> TimeWindow:
        """The time window the dashboard shows (its screen's ``view``)."""
        return self.dashboard.view

    @view.setter
    def view(self, window: TimeWindow) -> None:
        self.dashboard.view = window

    def now(self) -> int:
        """The newest time: the clock when live, the playback position when replaying."""
        return self.transport.now()

    def on_mount(self) -> None:
        # A closed terminal (SIGHUP) or a kill (SIGTERM) quits cleanly: the recording is
        # flushed, the socket removed, and `gpuwatch run` stops its command.
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGHUP, signal.SIGTERM):
                loop.add_signal_handler(sig, self.exit)
        # A SIGTERM that came before those handlers, and whose exception was swallowed
        # where it landed, still quits (checked after them: none falls between).
        if self._quit_if is not None and self._quit_if():
            self.exit()

    def on_resize(self) -> None:
        # A new size is a new frame: looked for at once (the screen takes its breakpoint
        # classes, -short, a moment after the app its size), not at the next due frame.
        self.dashboard.frames.look_in(1 / REDRAW_HZ)

    async def action_quit(self) -> None:
        """Quit; while a command started by ``gpuwatch run`` still runs, ask first."""
        child = self.child
        if child is None or child.poll() is not None:
            self.exit()
            return

        def answered(stop: bool | None) -> None:
            if stop:
                child.signal(signal.SIGTERM)  # gpuwatch run escalates after the app closes
                self.exit()

        self.push_screen(
            Confirm(
                ellipsis(shlex.join(child.command), 70),
                f"pid {child.pid} is still running. Stop it and quit?",
            ),
            answered,
        )

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Every gpuwatch action in the command palette, beside Textual's own."""
        yield from super().get_system_commands(screen)
        for a in self.transport.actions:
            if a.action == "quit":
                continue
            yield SystemCommand(a.title, a.help, _bind(self, a.action))


def _bind(app: GpuwatchApp, action: str) -> Callable[[], object]:
    async def run() -> None:
        await app.run_action(action, app.dashboard)

    return run
