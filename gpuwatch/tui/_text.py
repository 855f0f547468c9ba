"""Text widgets that redraw only when their text changes, and fitting text to a width."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Part:
    """A part of a :class:`Fitted` line that gives way in its own order, not the order it
    is shown in (see :func:`fit_ranked`).

    Attributes:
        text: Textual markup, or Content as it is.
        keep: Parts with a lower ``keep`` give way first; None: never (only the line's
            end is cut, when the never-parts alone are wider than the line).
        floor: Before anything gives way, the part is cut (with an ellipsis) down to
            this many cells, no fewer; it gets its cells back as room allows.
    """

    text: str | Content
    keep: int | None = None
    floor: int | None = None


FittedPart = str | Content | Part


def _same(a: Sequence[FittedPart], b: Sequence[FittedPart]) -> bool:
    """The same parts, styles included (Content's ``==`` compares only the text)."""

    def key(part: FittedPart) -> object:
        if isinstance(part, Part):
            return (key(part.text), part.keep, part.floor)
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
        self.parts: list[FittedPart] = []
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
            if any(isinstance(p, Part) for p in self.parts):
                fitted = fit_ranked(self.parts, width, self.sep)
            else:
                fitted = fit(self.parts, width, self.sep, self.max_lines)  # type: ignore[arg-type]
            self._fit = (width, fitted)
        return self._fit[1]

    def set(self, parts: Sequence[FittedPart]) -> None:
        """Show ``parts``; does nothing if they are already shown. Any :class:`Part`
        among them: fitted on one line by :func:`fit_ranked`, else by :func:`fit`."""
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


#: A part cut to fit keeps at least this many cells, else it is dropped (see :func:`fit`).
MIN_CUT = 8


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
        if room >= MIN_CUT:
            line = line + gap + part.truncate(room, ellipsis=True)
        break
    if line is not None:
        lines.append(line)
    return Content("\n").join(lines)


def fit_ranked(parts: Sequence[FittedPart], width: int, sep: str = " · ") -> Content:
    """Parts joined by ``sep`` on one line of ``width``, shown in the order given but
    giving way in their own (:class:`Part`; a plain str or Content never gives way).

    Where the room is short: first the parts with a ``floor`` are cut down towards it;
    then parts go, lowest ``keep`` first (of equal ones, the later shown first), each
    either cut with an ellipsis to the room there is (if :data:`MIN_CUT` cells are left
    for it) or dropped; what room is left over goes back to the floored parts. Only if
    the parts that never give way are wider than the line is its end cut.
    """
    width = max(1, width)
    gap = Content(sep).cell_length
    ps = [p if isinstance(p, Part) else Part(p) for p in parts]
    texts = [Content.from_markup(p.text) if isinstance(p.text, str) else p.text for p in ps]
    full = [t.cell_length for t in texts]
    cells: list[int | None] = list(full)  # None: dropped

    def total() -> int:
        shown = [c for c in cells if c is not None]
        return sum(shown) + gap * max(0, len(shown) - 1)

    floored = [i for i, p in enumerate(ps) if p.floor is not None]
    if total() > width:
        for i in floored:
            cells[i] = min(full[i], ps[i].floor or 0)
        order = sorted(
            (i for i, p in enumerate(ps) if p.keep is not None),
            key=lambda i: (ps[i].keep, -i),
        )
        for i in order:
            over = total() - width
            if over <= 0:
                break
            now = cells[i]
            assert now is not None
            if now - over >= MIN_CUT:
                cells[i] = now - over
                break
            cells[i] = None
    # Room left over: back to the floored parts, in the order shown.
    for i in floored:
        now = cells[i]
        if now is not None and now < full[i]:
            cells[i] = min(full[i], now + max(0, width - total()))
    shown = [
        t if c == full[i] else t.truncate(c, ellipsis=True)
        for i, (t, c) in enumerate(zip(texts, cells, strict=True))
        if c is not None
    ]
    line = Content(sep).join(shown)
    return line.truncate(width, ellipsis=True) if line.cell_length > width else line
