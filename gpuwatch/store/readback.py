"""What a recording being written gives back to its session: the rows and marks that the
session let go of because the file holds them.

:class:`FileReadback` is the recording's side of the session's
:class:`~gpuwatch.session.ports.RecordingPort`; the writer attaches it to the session's
retention (:meth:`~gpuwatch.session.retention.Retention.attach`).
"""

from __future__ import annotations

from collections.abc import Callable

from ._schema import SERIES, layout_dtypes
from .archive import ChunkSource, SeriesArchive
from .marks import FileMarks


class FileReadback:
    """Reads a settled process's series and the marks let go of back from the file.

    Args:
        source: The file's reading connection.
        woken: Called with the pid of each settled process whose series is read back
            (the writer settles it again after its next commit).
    """

    def __init__(self, source: ChunkSource, woken: Callable[[int], None]) -> None:
        self._source = source
        self._woken = woken
        self._marks = FileMarks(source)

    @property
    def marks(self) -> FileMarks:
        """The marks the file holds, read on demand."""
        return self._marks

    def reopen(
        self, kind: str, key: str, rows: int, span: tuple[int, int] | None
    ) -> SeriesArchive | None:
        """The archive of a settled process's series (``kind``, its pid as text ``key``),
        or None where the file has none; called from any thread."""
        self._woken(int(key))
        if not rows or span is None:
            return None
        found = self._source.query("SELECT id FROM series WHERE kind = ? AND key = ?", (kind, key))
        if not found:
            return None
        layout = layout_dtypes(SERIES[kind][0])
        table_dtypes = dict(layout)
        return SeriesArchive.dormant(
            self._source, int(found[0][0]), kind, layout, table_dtypes, rows, span
        )
