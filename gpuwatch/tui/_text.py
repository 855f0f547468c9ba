"""A one-line text widget that redraws only when its text changes, without a layout pass."""

from __future__ import annotations

from rich.markup import escape
from rich.text import Text
from textual.widgets import Static

from ..fmt import printable


def markup_safe(text: object) -> str:
    """Untrusted text (names, labels, paths, notes) for a widget that reads Rich markup.

    Control characters become visible escapes (:func:`gpuwatch.fmt.printable`) and square
    brackets are escaped, so ``[red]fwd[/red]`` in a phase name shows as typed.
    """
    return escape(printable(text))


def plain(text: object, **kwargs: object) -> Text:
    """Untrusted text as a :class:`~rich.text.Text` (never parsed as markup), made printable."""
    return Text(printable(text), **kwargs)  # type: ignore[arg-type]


class Line(Static):
    """A fixed-height line of (markup) text.

    ``Static.update`` re-lays-out the screen by default; on a dashboard that rewrites its
    headers twenty times a second that pass dominated the CPU time, and a fixed-height line
    never changes the layout.
    """

    DEFAULT_CSS = """
    Line {
        height: 1;
    }
    """

    def __init__(
        self,
        text: str = "",
        *,
        markup: bool = True,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(text, markup=markup, id=id, classes=classes)
        self.text = text

    def set(self, text: str) -> None:
        """Show ``text``; does nothing if it is already shown."""
        if text != self.text:
            self.text = text
            self.update(text, layout=False)
