"""The key bar at the bottom: the most useful keys that fit, ``?`` and ``q`` always.

Textual's ``Footer`` lays its keys out in binding order and loses the last ones at the
terminal's edge: at 80 columns that was help and quit. This bar fills the width in order
of importance, keeps help and quit (at the end, where htop and nvtop users look for them)
and runs a key's action when it is clicked.

The keys it and the help screen show are those bound now, as Textual's ``Footer`` and
``KeyPanel`` read them: a screen's active bindings (a user's keymap applied) and
``App.get_key_display`` (:func:`bound_keys`); no key is written down twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rich.style import Style
from rich.text import Text
from textual import events
from textual.actions import parse
from textual.app import App
from textual.binding import Binding, BindingsMap
from textual.dom import DOMNode
from textual.screen import Screen
from textual.widget import Widget

ALWAYS = ("help", "quit")
"""Actions the bar never drops."""


@dataclass(frozen=True)
class Key:
    """One entry: the key as shown, what it does, and the action it runs."""

    key: str
    label: str
    action: str


class KeyBar(Widget):
    """One line of keys, fitted to the width."""

    DEFAULT_CSS = """
    KeyBar {
        dock: bottom;
        height: 1;
        background: $footer-background;
        color: $footer-description-foreground;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.keys: list[Key] = []
        self._spans: list[tuple[int, int, str]] = []  # (first cell, end cell, action)

    def set_keys(self, keys: list[Key]) -> None:
        """Show ``keys`` (in order of importance; see :data:`ALWAYS`)."""
        if keys != self.keys:
            self.keys = keys
            self.refresh()

    def shown(self, width: int) -> list[Key]:
        """The keys that fit in ``width`` cells, help and quit among them, in bar order."""
        always = [k for k in self.keys if k.action in ALWAYS]
        rest = [k for k in self.keys if k.action not in ALWAYS]
        room = width - sum(_cells(k) for k in always)
        chosen = []
        for key in rest:
            if _cells(key) <= room:
                chosen.append(key)
                room -= _cells(key)
            else:
                break  # keep the order of importance: no later key jumps a dropped one
        return chosen + always

    def render(self) -> Text:
        variables = self.app.theme_variables
        key_style = Style(color=variables.get("footer-key-foreground"), bold=True)
        text = Text(no_wrap=True, overflow="crop")
        self._spans = []
        for key in self.shown(self.size.width):
            start = text.cell_len
            text.append(f" {key.key} ", key_style)
            text.append(f"{key.label} ")
            self._spans.append((start, text.cell_len, key.action))
        return text

    async def on_click(self, event: events.Click) -> None:
        for start, end, action in self._spans:
            if start <= event.x < end:
                # The screen's own action (the dashboard's), else the app's (the cluster's).
                _, name, _ = parse(action)
                own = hasattr(self.screen, f"action_{name}")
                await self.app.run_action(action, self.screen if own else self.app)
                return


def _cells(key: Key) -> int:
    return len(key.key) + len(key.label) + 3


KEY_WORDS = {"enter": "enter", "backspace": "backspace"}
"""Keys shown as a word, not Textual's glyph (⏎ and ⌫ are easy to miss in a key bar)."""


def key_display(binding: Binding) -> str | None:
    """The word :data:`KEY_WORDS` has for ``binding``'s key (an ``App.get_key_display``
    override asks it first), or None."""
    return None if binding.key_display else KEY_WORDS.get(binding.key)


def bound_keys(screen: Screen) -> dict[str, list[str]]:
    """Each action ``screen``'s keys run now, with those keys as shown, in binding order.

    From the screen's active bindings (the focused widget's, the screen's and the app's,
    the keymap applied; an action its ``check_action`` turns off runs on no key).
    """
    app = screen.app
    # A keymap moves a key to the end of its map: an action's keys are kept in the order
    # of the screen's bindings (by id), so its first stays first wherever the user put it.
    defaults = [b for b in screen.BINDINGS if isinstance(b, Binding)]
    order = {(b.id, b.action): i for i, b in reversed(list(enumerate(defaults)))}
    found = [
        (b.action, order.get((b.id, b.action), len(order)), app.get_key_display(b))
        for b in (active.binding for active in screen.active_bindings.values())
    ]
    keys: dict[str, list[str]] = {}
    for action, _, key in sorted(found, key=lambda f: f[1]):
        shown = keys.setdefault(action, [])
        if key not in shown:
            shown.append(key)
    return keys


def node_keys(node: DOMNode) -> dict[str, list[str]]:
    """Each action of ``node``'s own bindings, with the keys that run it while it has the
    focus (the keymap applied as its screen applies it), as shown."""
    return bindings_keys(node.app, node._bindings.copy())


def bindings_keys(app: App, bindings: BindingsMap) -> dict[str, list[str]]:
    """Each action of ``bindings`` (a copy: changed here), with its keys under ``app``'s
    keymap, as shown (``App.get_key_display``)."""
    if app._keymap:  # as Screen._binding_chain does: Textual has no public way
        bindings.apply_keymap(app._keymap)
    keys: dict[str, list[str]] = {}
    for _, binding in bindings:
        shown = keys.setdefault(binding.action, [])
        key = app.get_key_display(binding)
        if key not in shown:
            shown.append(key)
    return keys


def help_rows(
    bound: dict[str, list[str]], actions: Iterable[tuple[str, str]]
) -> list[tuple[str, str]]:
    """(keys, description) of each (action, description) of ``actions`` that a key of
    ``bound`` (:func:`bound_keys`) runs, in the order of ``actions``."""
    rows = []
    for action, text in actions:
        if bound.get(action):
            rows.append((" / ".join(bound[action]), text))
    return rows


def bar_keys(bound: dict[str, list[str]], entries: Iterable[tuple[str, str]]) -> list[Key]:
    """The key bar's :class:`Key` of each (action, label) of ``entries`` that a key of
    ``bound`` runs (its first key), in the order of ``entries``."""
    return [Key(bound[action][0], label, action) for action, label in entries if bound.get(action)]
