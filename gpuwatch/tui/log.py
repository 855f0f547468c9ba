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


class LogView(Log):
    """Follows a growing log file; carriage-return updates (progress bars) keep only the
    last state of the line, so tqdm does not flood the view."""

    def __init__(self, path: str | Path, *, id: str | None = None) -> None:
        super().__init__(id=id, max_lines=MAX_LINES, highlight=False)
        self.path = Path(path)
        self._offset = 0
        self._partial = ""

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
        text = self._partial + data.decode(errors="replace")
        lines = text.split("\n")
        self._partial = lines.pop()  # an unfinished line waits for its newline
        if lines:
            self.write_lines([clean_line(line.rsplit("\r", 1)[-1]) for line in lines])
