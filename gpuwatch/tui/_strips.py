"""The strip cache of a line-drawn widget: all its lines built at once, once per key."""

from __future__ import annotations

from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget


class CachedStrips(Widget):
    """A widget whose lines are built together and kept until what they show changes.

    Subclasses say what the lines depend on (:meth:`strips_key`) and build them
    (:meth:`build_strips`); :meth:`forget_strips` drops them when something outside the
    key changed. A line past the built ones is blank.
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._key: object = None
        self._strips: list[Strip] = []

    def strips_key(self, size: Size) -> object:
        """What the lines depend on: they are rebuilt when it changes."""
        raise NotImplementedError

    def build_strips(self, size: Size) -> list[Strip]:
        """Every line of the widget, top to bottom."""
        raise NotImplementedError

    def forget_strips(self) -> None:
        """Rebuild at the next draw (a setting that is not part of the key changed)."""
        self._key = None

    def render_line(self, y: int) -> Strip:
        size = self.size
        key = self.strips_key(size)
        if key != self._key:
            self._strips = self.build_strips(size)
            self._key = key
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(size.width, self.rich_style)
