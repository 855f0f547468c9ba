"""The dashboard's actions, live and replayed: keys, ids a keymap names, help and palette text.

Each mode has its own table (what its transport can do); the app binds the keys of both, the
replay's first, and :meth:`GpuwatchApp.check_action` turns off what the mode's transport
cannot do, so a key that means two things (``space``: follow live, play a replay) finds the
one its mode has. Every binding on a key carries that key's id (:data:`~.keymap.KEY_IDS`): a keymap
moves the key with all it does, in both modes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from textual.binding import Binding, BindingType

from .keymap import KEY_IDS


@dataclass(frozen=True)
class Action:
    """One user action: its keys, its action string, and how to describe it."""

    keys: str
    action: str
    title: str
    help: str
    footer: bool = False


# Shared by both modes: the same keys, the same text.
_ZOOM = (
    Action("plus,equals_sign", "zoom(0.5)", "Zoom in", "Halve the time window", True),
    Action("minus", "zoom(2.0)", "Zoom out", "Double the time window", True),
)


def _cursor(what: str) -> tuple[Action, ...]:
    """Both modes' arrows; ``what`` says what moves (live the cursor, paused replay also
    the playback position)."""
    return (
        Action("left", "cursor(-1)", "Cursor left", f"{what} one column back"),
        Action("right", "cursor(1)", "Cursor right", f"{what} one column on"),
        Action(
            "ctrl+left",
            "cursor_window(-0.1)",
            "Cursor far left",
            f"{what} a tenth of the window back",
        ),
        Action(
            "ctrl+right",
            "cursor_window(0.1)",
            "Cursor far right",
            f"{what} a tenth of the window on",
        ),
    )


def _pan(back: str, forward: str) -> tuple[Action, Action]:
    """Both modes' pan, on the keys ``back`` and ``forward`` (a replay's ``<`` and ``>``
    set its speed)."""
    return (
        Action(back, "pan(-0.25)", "Pan back", "Move the window a quarter back in time"),
        Action(forward, "pan(0.25)", "Pan forward", "Move the window a quarter forward in time"),
    )


def _boundaries(verb: str) -> tuple[Action, Action]:
    """Both modes' ``[`` and ``]``; ``verb`` says what goes there (the cursor, a seek)."""
    return (
        Action(
            "left_square_bracket",
            "transport('jump_boundary', -1)",
            "Previous phase boundary",
            f"{verb} the previous phase start or end",
            False,
        ),
        Action(
            "right_square_bracket",
            "transport('jump_boundary', 1)",
            "Next phase boundary",
            f"{verb} the next phase start or end",
            False,
        ),
    )


_TABS = (
    Action("1", "show_tab('timelines')", "Timelines", "Show the timelines"),
    Action("2", "show_tab('peaks')", "Peaks", "Show per-phase peaks", True),
    Action("3", "show_tab('processes')", "Processes", "Show the process table", True),
    Action("4", "show_tab('log')", "Log", "Show the command's output (gpuwatch run)"),
    Action("5", "show_ranks", "Ranks", "Show the ranks of a multi-GPU job side by side"),
)
_PANELS = (
    Action(
        "tab",
        "next_panel(1)",
        "Next panel",
        "Focus the next device (a short terminal shows one panel at a time); "
        "on the overview, open the selected GPU's panel (as enter does)",
    ),
    Action("shift+tab", "next_panel(-1)", "Previous panel", "Focus the previous device"),
    Action(
        "g,backspace",
        "overview",
        "Overview",
        "Back to the overview, every GPU at a glance (up / down select, enter or tab "
        "opens); the first screen when the panels do not all fit",
        False,
    ),
)
_HELP = Action("question_mark", "help", "Help", "Show keys and what the lines mean", True)
_QUIT = Action("q", "quit", "Quit", "Quit gpuwatch", True)
_CLEAR = Action("escape", "clear_cursor", "Clear cursor", "Remove the cursor")

LIVE_ACTIONS: tuple[Action, ...] = (
    Action(
        "f,space",
        "toggle_follow",
        "Follow / pause",
        "Follow the newest data, or freeze the window where it is",
        True,
    ),
    *_ZOOM,
    *_cursor("Move the cursor"),
    *_pan("shift+left,less_than_sign", "shift+right,greater_than_sign"),
    *_boundaries("Cursor to"),
    Action("m", "transport('jump_event', 1)", "Next mark", "Cursor to the next mark or OOM"),
    Action(
        "M", "transport('jump_event', -1)", "Previous mark", "Cursor to the previous mark or OOM"
    ),
    Action(
        "s",
        "transport('jump_spike')",
        "Largest spike",
        "Cursor to the highest exact phase peak of the focused device (else nvidia-smi's)",
        True,
    ),
    Action("home", "transport('home')", "Start", "Show the start of the session"),
    Action("end", "transport('end')", "Newest", "Follow the newest data"),
    _CLEAR,
    Action(
        "y",
        "toggle_fit",
        "Fit / total",
        "Scale the y axis to the data or to the device's total memory",
    ),
    *_TABS,
    *_PANELS,
    _HELP,
    _QUIT,
)
"""Live: the window follows the newest data; the keys move it and the cursor."""

REPLAY_ACTIONS: tuple[Action, ...] = (
    Action(
        "space",
        "transport('toggle_play')",
        "Play / pause",
        "Play or pause the recording",
        True,
    ),
    # The arrows mean what they mean live (the cursor: one column, ctrl a tenth of the
    # window); paused, the playback position goes with the cursor, playing it seeks.
    *_cursor("Cursor and position"),
    Action("home", "transport('home')", "Start", "Seek to the start of the recording"),
    Action("end", "transport('end')", "End", "Seek to the end (a growing file: follow its tail)"),
    *_boundaries("Seek to"),
    Action("m", "transport('jump_event', 1)", "Next mark", "Seek to the next mark"),
    Action("M", "transport('jump_event', -1)", "Previous mark", "Seek to the previous mark"),
    Action("o", "transport('jump_oom', 1)", "Next OOM", "Seek to the next out-of-memory error"),
    Action(
        "O",
        "transport('jump_oom', -1)",
        "Previous OOM",
        "Seek to the previous out-of-memory error",
    ),
    Action(
        "s",
        "transport('jump_spike')",
        "Largest spike",
        "Seek to the highest exact phase peak (else nvidia-smi's highest reading)",
        True,
    ),
    Action("w", "transport('whole')", "Whole session", "Show the whole recording at once", True),
    Action(
        "greater_than_sign",
        "transport('speed', 1)",
        "Faster",
        "Double the playback speed (to x64)",
        True,
    ),
    Action(
        "less_than_sign",
        "transport('speed', -1)",
        "Slower",
        "Halve the playback speed (to x0.25)",
        True,
    ),
    # Live keys kept, but out of the footer: replay's own keys need the room.
    Action("f", "toggle_follow", "Follow position", "Let the window follow the playback position"),
    Action("y", "toggle_fit", "Fit / total", "Scale the y axis to the data or to the total"),
    *_ZOOM,
    _CLEAR,
    *_TABS,
    *_PANELS,
    _HELP,
    _QUIT,
    *_pan("shift+left", "shift+right"),
)
"""Replay: a player's position is the clock; the keys play, seek and browse the recording."""


def bindings(*tables: Iterable[Action]) -> list[BindingType]:
    """One binding per key and action of ``tables``, the first table's first, each with
    its key's id (:data:`KEY_IDS`)."""
    out: list[BindingType] = []
    seen: set[tuple[str, str]] = set()
    for table in tables:
        for a in table:
            for key in a.keys.split(","):
                if (key, a.action) in seen:
                    continue
                seen.add((key, a.action))
                out.append(
                    Binding(key, a.action, a.title, show=a.footer, id=KEY_IDS[key], tooltip=a.help)
                )
    return out
