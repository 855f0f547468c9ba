"""The key bar at the bottom: the most useful keys that fit, ``?`` and ``q`` always.

Textual's ``Footer`` lays its keys out in binding order and loses the last ones at the
terminal's edge: at 80 columns that was help and quit. This bar fills the width in order
of importance, keeps help and quit (at the end, where htop and nvtop users look for them)
and runs a key's action when it is clicked.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.style import Style
from rich.text import Text
from textual import events
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
                await self.app.run_action(action)
                return


def _cells(key: Key) -> int:
    return len(key.key) + len(key.label) + 3
