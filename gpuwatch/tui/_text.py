"""Text widgets that redraw only when their text changes, and fitting text to a width."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.content import Content
from textual.geometry import Size
from textual.widget import Widget
from textual.widgets import Static

from ..fmt import printable


def markup_safe(text: object) -> str:
    """Untrusted text (names, labels, paths, notes) for a widget that reads Rich markup.

    Control characters become visible escapes (:func:`gpuwatch.fmt.printable`) and every
    opening square bracket is escaped, so ``[red]fwd[/red]`` or ``[$warning]`` in a phase
    name shows as typed (Rich's ``escape`` leaves ``[$variable]``, which Textual's markup
    reads as a style).
    """
    return printable(text).replace("[", r"\[")


def plain(text: object, **kwargs: object) -> Text:
    """Untrusted text as a :class:`~rich.text.Text` (never parsed as markup), made printable."""
    return Text(printable(text), **kwargs)  # type: ignore[arg-type]


def plain_lines(lines: Sequence[object], **kwargs: object) -> Text:
    """Lines of untrusted text as one :class:`~rich.text.Text`, one line each.

    Our own line breaks stay breaks; each line is made printable on its own, so a newline
    inside a name still shows as ``\\n`` instead of moving the rest of the text.
    """
    return Text("\n".join(printable(line) for line in lines), **kwargs)  # type: ignore[arg-type]


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


def _same(a: Sequence[str | Content], b: Sequence[str | Content]) -> bool:
    """The same parts, styles included (Content's ``==`` compares only the text)."""

    def key(part: str | Content) -> object:
        return (part.plain, tuple(part.spans)) if isinstance(part, Content) else part

    return len(a) == len(b) and all(key(x) == key(y) for x, y in zip(a, b, strict=True))


class Fitted(Widget):
    """Parts (markup text or Content) fitted to the widget's width at render time (see
    :func:`fit`).

    Fitting when drawing, not when the text is set, keeps it right across resizes; a
    layout pass happens only when the number of lines changes.

    Args:
        sep: Between two parts on a line.
        max_lines: At most this many lines (the height follows, up to it).
    """

    DEFAULT_CSS = """
    Fitted {
        height: auto;
    }
    """

    def __init__(
        self, *, sep: str = " · ", max_lines: int = 1, id: str | None = None, classes: str = ""
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.parts: list[str | Content] = []
        self.sep = sep
        self.max_lines = max_lines
        self._lines = 1
        # The parts fitted to one width: set, measured and drawn, parsed once.
        self._fit: tuple[int, Content] | None = None

    @property
    def text(self) -> str:
        """The text as drawn now."""
        return self._fitted(self.size.width or 80).plain

    def _fitted(self, width: int) -> Content:
        if self._fit is None or self._fit[0] != width:
            self._fit = (width, fit(self.parts, width, self.sep, self.max_lines))
        return self._fit[1]

    def set(self, parts: Sequence[str | Content]) -> None:
        """Show ``parts``; does nothing if they are already shown."""
        if _same(parts, self.parts):
            return
        self.parts = list(parts)
        self._fit = None
        if self.max_lines == 1:  # one line whatever the parts: no layout to redo
            self.refresh()
            return
        lines = self.text.count("\n") + 1
        self.refresh(layout=lines != self._lines)
        self._lines = lines

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        self._lines = self._fitted(width).plain.count("\n") + 1
        return self._lines

    def render(self) -> Content:
        return self._fitted(self.size.width)


def fit(
    parts: Sequence[str | Content], width: int, sep: str = " · ", max_lines: int = 1
) -> Content:
    """Parts (Textual markup, or Content as it is) joined by ``sep`` into at most
    ``max_lines`` lines of ``width``.

    Parts are in order of importance: they fill the lines in turn, a part never breaks
    across lines, and where the room runs out the part there is cut with an ellipsis (if
    a few cells are left for it) and the rest are dropped. So the first parts always show
    whole, and nothing is silently cut mid-word at the terminal's edge.
    """
    width = max(1, width)
    gap = Content(sep)
    lines: list[Content] = []
    line: Content | None = None
    for markup in parts:
        part = Content.from_markup(markup)
        if line is None:
            line = part.truncate(width, ellipsis=True)
            if part.cell_length > width:
                break
            continue
        if line.cell_length + gap.cell_length + part.cell_length <= width:
            line = line + gap + part
            continue
        if len(lines) + 1 < max_lines:  # a new line for it
            lines.append(line)
            line = part.truncate(width, ellipsis=True)
            if part.cell_length > width:
                break
            continue
        room = width - line.cell_length - gap.cell_length
        if room >= 8:
            line = line + gap + part.truncate(room, ellipsis=True)
        break
    if line is not None:
        lines.append(line)
    return Content("\n").join(lines)
