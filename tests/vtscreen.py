"""The text a terminal shows after a stream of output: what a browser test reads.

xterm.js draws the served dashboard on a canvas, so the page has no text to search; the
test reads the same bytes the page got (the websocket's frames) through this model of a
terminal screen. It keeps characters only: cursor moves (``CSI row;col H``, ``CR``,
``LF``, ``BS``), erasing (``CSI K``, ``CSI 2J``), wide characters; colours, modes and
OSC strings are skipped, as they change no character.
"""

from __future__ import annotations

import codecs
import re
import unicodedata

_SEQUENCE = re.compile(
    r"\x1b\[([0-9;?<=>]*)[ -/]*([@-~])"  # CSI
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC
    r"|\x1bP[^\x1b]*\x1b\\"  # DCS
    r"|\x1b[ -/]*[0-OQ-Z\\^-~]"  # other escapes (not the CSI, OSC, DCS introducers)
)


class Screen:
    """A ``width`` x ``height`` grid of characters fed with terminal output."""

    def __init__(self, width: int = 500, height: int = 200) -> None:
        self.width, self.height = width, height
        self.rows = [[" "] * width for _ in range(height)]
        self.row = self.col = 0
        # A frame may end inside a UTF-8 character or an escape sequence: both wait.
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending = ""

    def feed(self, data: bytes) -> None:
        """Apply more output."""
        text = self._pending + self._decoder.decode(data)
        cut = _unfinished(text)
        self._pending = text[cut:]
        self._apply(text[:cut])

    def _apply(self, text: str) -> None:
        pos = 0
        for match in _SEQUENCE.finditer(text):
            self._write(text[pos : match.start()])
            pos = match.end()
            if match.group(2):
                self._csi(match.group(1), match.group(2))
        self._write(text[pos:])

    def _csi(self, params: str, final: str) -> None:
        numbers = [int(p) if p.isdigit() else 0 for p in params.split(";")] if params else []
        if final in "Hf" and not params.startswith("?"):
            row = numbers[0] if numbers else 1
            col = numbers[1] if len(numbers) > 1 else 1
            self.row = min(max(row, 1), self.height) - 1
            self.col = min(max(col, 1), self.width) - 1
        elif final == "K":
            mode = numbers[0] if numbers else 0
            line = self.rows[self.row]
            if mode == 0:
                line[self.col :] = [" "] * (self.width - self.col)
            else:
                line[:] = [" "] * self.width
        elif final == "J" and numbers[:1] in ([2], [3]):
            self.rows = [[" "] * self.width for _ in range(self.height)]

    def _write(self, text: str) -> None:
        for ch in text:
            if ch == "\r":
                self.col = 0
            elif ch == "\n":
                self.row = min(self.row + 1, self.height - 1)
            elif ch == "\b":
                self.col = max(self.col - 1, 0)
            elif ch >= " " and ch != "\x7f":
                if self.col < self.width:
                    self.rows[self.row][self.col] = ch
                wide = unicodedata.east_asian_width(ch) in ("W", "F")
                self.col = min(self.col + (2 if wide else 1), self.width)

    def lines(self) -> list[str]:
        """The screen's lines, trailing spaces removed."""
        return ["".join(r).rstrip() for r in self.rows]

    def find(self, text: str) -> tuple[int, int] | None:
        """``(row, col)`` of the first occurrence of ``text``, 0-based, or None."""
        for y, line in enumerate(self.lines()):
            x = line.find(text)
            if x >= 0:
                return y, x
        return None


def _unfinished(text: str) -> int:
    """Where an escape sequence cut off at the end of ``text`` starts (or its length)."""
    start = text.rfind("\x1b", max(0, len(text) - 64))
    if start < 0:
        return len(text)
    match = _SEQUENCE.match(text, start)
    return len(text) if match is not None else start
