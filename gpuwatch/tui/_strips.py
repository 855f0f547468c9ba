"""The strip cache of a line-drawn widget: all its lines built at once, once per key; the
styles its lines are drawn in, read from the CSS once per theme and focus; and the keys
that move a line-drawn table's cursor."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from textual.binding import Binding
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

T = TypeVar("T")

ROW_KEYS = (
    Binding("up", "move(-1)", "Up", show=False),
    Binding("down", "move(1)", "Down", show=False),
    Binding("pageup", "page(-1)", "Page up", show=False),
    Binding("pagedown", "page(1)", "Page down", show=False),
)
"""A line-drawn table's cursor keys (the Processes tab's, the cluster grid's): a row, a
page; the widget has ``move`` and ``page`` actions."""


class StyleCache(Generic[T]):
    """What a widget reads from its CSS (a lookup walks the styles), read once per theme
    and focus and kept until the CSS changes (:meth:`CachedStrips.notify_style_update`
    clears it: a theme's CSS is applied after ``app.theme`` names it, and a line drawn in
    between must not keep the old colours).

    Args:
        widget: The widget whose theme and focus key the values.
        read: Reads the values (called on the widget's current styles).
    """

    def __init__(self, widget: Widget, read: Callable[[], T]) -> None:
        self._widget = widget
        self._read = read
        self._found: dict[tuple[str, bool], T] = {}

    def get(self) -> T:
        """The values for the widget's theme and focus."""
        key = (self._widget.app.theme, self._widget.has_focus)
        found = self._found.get(key)
        if found is None:
            found = self._found[key] = self._read()
        return found

    def clear(self) -> None:
        """Read again at the next :meth:`get`."""
        self._found.clear()


class CachedStrips(Widget):
    """A widget whose lines are built together and kept until what they show changes.

    Subclasses say what the lines depend on (:meth:`strips_key`) and build them
    (:meth:`build_strips`); :meth:`forget_strips` drops them when something outside the
    key changed. A line past the built ones is blank. The styles they are drawn in come
    from :meth:`style_cache`; a change of CSS drops both.
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._key: object = None
        self._strips: list[Strip] = []
        self._style_clears: list[Callable[[], None]] = []

    def style_cache(self, read: Callable[[], T]) -> StyleCache[T]:
        """A :class:`StyleCache` of ``read``'s values, cleared when the CSS changes."""
        cache = StyleCache(self, read)
        self._style_clears.append(cache.clear)
        return cache

    def strips_key(self, size: Size) -> object:
        """What the lines depend on: they are rebuilt when it changes."""
        raise NotImplementedError

    def build_strips(self, size: Size) -> list[Strip]:
        """Every line of the widget, top to bottom."""
        raise NotImplementedError

    def forget_strips(self) -> None:
        """Rebuild at the next draw (a setting that is not part of the key changed)."""
        self._key = None

    def notify_style_update(self) -> None:
        super().notify_style_update()
        for clear in self._style_clears:
            clear()
        self.forget_strips()  # drawn in the styles just replaced

    def render_line(self, y: int) -> Strip:
        size = self.size
        key = self.strips_key(size)
        if key != self._key:
            self._strips = self.build_strips(size)
            self._key = key
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(size.width, self.rich_style)
