"""The child's output, tailed from its log file (``gpuwatch run``)."""

from __future__ import annotations

import re
from pathlib import Path

from textual.widgets import Log

from ..fmt import printable

MAX_LINES = 10_000

# Escape sequences a program writes for a terminal (colours, cursor moves, titles): the
# log shows their text without them, and anything else unprintable as a visible escape.
_SEQUENCE = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])")


def clean_line(line: str) -> str:
    """One line of the child's output as it may be shown: no terminal escapes survive."""
    return printable(_SEQUENCE.sub("", line))


MAX_PARTIAL = 64 * 1024
"""Characters of an unfinished line kept (a program writing megabytes without a newline)."""


def current_line(partial: str) -> str:
    """What an unfinished line reads now: the text after its last carriage return (a
    progress bar rewrites its line with ``\r``), at most :data:`MAX_PARTIAL` characters.

    A trailing ``\r`` is kept: the ``\n`` of a CRLF may come in the next read.
    """
    cut = partial.rfind("\r", 0, len(partial) - 1)
    if cut >= 0:
        partial = partial[cut + 1 :]
    return partial[-MAX_PARTIAL:]


class LogView(Log):
    """Follows a growing log file; carriage-return updates (progress bars) keep only the
    last state of the line, so tqdm does not flood the view, and the line being written
    is shown as it stands, replaced at each poll until its newline comes."""

    def __init__(self, path: str | Path, *, id: str | None = None) -> None:
        super().__init__(id=id, max_lines=MAX_LINES, highlight=False)
        self.path = Path(path)
        self._offset = 0
        self._partial = ""
        self._current = False  # the last line shown is the unfinished one

    def on_mount(self) -> None:
        self.set_interval(0.25, self.poll)
        self.poll()

    def poll(self) -> None:
        """Append whatever the child wrote since the last poll."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read(1 << 20)
        except OSError:
            return
        if not data:
            return
        self._offset += len(data)
        text = (self._partial + data.decode(errors="replace")).replace("\r\n", "\n")
        lines = text.split("\n")
        self._partial = current_line(lines.pop())  # an unfinished line waits for its newline
        out = [clean_line(line.rsplit("\r", 1)[-1]) for line in lines]
        now = clean_line(self._partial.rstrip("\r"))
        if now:
            out.append(now)
        replaced = self._current and bool(self._lines)
        if replaced:
            # Log has no call to replace a line: the unfinished one shown at the last poll
            # is taken off its list and written again as it reads now.
            del self._lines[-1]
        self._current = bool(now)
        if out or replaced:
            self.write_lines(out)
