"""The user's keymap: ``$XDG_CONFIG_HOME/gpuwatch/keymap.toml`` (else ``~/.config/...``).

Each line gives a binding id (:data:`KEY_IDS`; the Processes tab's :data:`PROCESS_IDS`, the
cluster view's :data:`CLUSTER_IDS`) its keys, over the defaults, in live and replay alike::

    play = "p"                 # space no longer plays or follows; p does
    zoom-in = ["plus", "i"]    # several keys: a list, or "plus,i"

Keys are Textual's names (``ctrl+left``, ``question_mark`` or ``?``). A key the keymap gives
to a new id loses what it did. Nothing here imports textual: the command line reads the
file before it knows it has a terminal.
"""

from __future__ import annotations

from pathlib import Path

from ..fmt import ellipsis, printable
from ._config_file import config_file, read_toml

KEYMAP_ENV = "GPUWATCH_KEYMAP"
"""A keymap file to read instead of the one in the config directory."""
MAX_KEY = 40
"""The longest key name taken (Textual's longest are ``ctrl+shift+...`` forms)."""


KEY_IDS: dict[str, str] = {
    "f": "follow",
    "space": "play",
    "plus": "zoom-in",
    "equals_sign": "zoom-in",
    "minus": "zoom-out",
    "left": "cursor-left",
    "right": "cursor-right",
    "ctrl+left": "cursor-far-left",
    "ctrl+right": "cursor-far-right",
    "shift+left": "pan-back",
    "shift+right": "pan-forward",
    "less_than_sign": "slower",
    "greater_than_sign": "faster",
    "left_square_bracket": "previous-boundary",
    "right_square_bracket": "next-boundary",
    "m": "next-mark",
    "M": "previous-mark",
    "o": "next-oom",
    "O": "previous-oom",
    "s": "spike",
    "w": "whole",
    "home": "start",
    "end": "end",
    "escape": "clear-cursor",
    "y": "fit",
    "1": "timelines",
    "2": "peaks",
    "3": "processes",
    "4": "log",
    "5": "ranks",
    "tab": "next-panel",
    "shift+tab": "previous-panel",
    "g": "overview",
    "backspace": "overview",
    "question_mark": "help",
    "q": "quit",
}
"""The id of each key's bindings: what a keymap (``keymap.toml``) names to move the key.
Live, ``space`` follows and ``<`` / ``>`` pan (their ids name what they do in a replay)."""

PROCESS_IDS: dict[str, str] = {
    "sort_next": "sort-next",
    "sort_reverse": "sort-reverse",
    "filter": "filter",
    "toggle_tree": "tree",
    "signal('INT')": "sigint",
    "signal('TERM')": "sigterm",
    "signal('KILL')": "sigkill",
    "open": "open",
}
"""The id of each of the Processes tab's own bindings, by action (``tui/processes.py``)."""

CLUSTER_IDS: dict[str, str] = {
    "quit": "quit",
    "help": "help",
    "sort": "sort",
    "filter": "filter",
    "clear_filter": "clear-filter",
    "refresh_now": "refresh",
    "show_tab('gpus')": "gpus",
    "show_tab('ranks')": "ranks",
    "open": "open",
    "back": "back",
    "window(1)": "longer",
    "window(-1)": "shorter",
}
"""The id of each of the cluster view's bindings, by action (``tui/cluster/``): where it
does what a dashboard key does (quit, help, filter, open) the id is that key's."""

IDS = frozenset(KEY_IDS.values()) | set(PROCESS_IDS.values()) | set(CLUSTER_IDS.values())
"""Every id a keymap may name."""


class KeymapError(ValueError):
    """The keymap file cannot be used; ``str()`` is one line that says why."""


def keymap_path() -> Path:
    """Where the keymap is read from (it need not exist)."""
    return config_file(KEYMAP_ENV, "keymap.toml")


def load_keymap(path: Path | None = None) -> dict[str, str]:
    """The keymap in ``path`` (default :func:`keymap_path`); none there: an empty one.

    Raises:
        KeymapError: The file cannot be read, is not TOML, names an id gpuwatch does not
            have, or gives one something other than keys.
    """
    path = path or keymap_path()
    shown = printable(str(path))
    data = read_toml(path, "keymap", KeymapError)
    if data is None:
        return {}
    keymap: dict[str, str] = {}
    for binding_id, value in data.items():
        if binding_id not in IDS:
            known = ", ".join(sorted(IDS))
            name = ellipsis(printable(binding_id), 40)
            raise KeymapError(f"the keymap {shown} names {name!r}: gpuwatch has {known}")
        keys = value.split(",") if isinstance(value, str) else value
        if not isinstance(keys, list) or not keys or not all(_is_key(k) for k in keys):
            raise KeymapError(
                f"the keymap {shown} gives {binding_id!r} something other than keys "
                '(a key name like "p" or "ctrl+left", or a list of them)'
            )
        keymap[binding_id] = ",".join(k.strip() for k in keys)
    return keymap


def _is_key(key: object) -> bool:
    return (
        isinstance(key, str)
        and 0 < len(key.strip()) <= MAX_KEY
        and key.strip().isprintable()
        and " " not in key.strip()
    )
