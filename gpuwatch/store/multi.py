"""Several recordings opened as one session (``replay``, ``info`` and ``export`` of FILE...).

Each file is validated and opened windowed (its tables read what a view asks from the file:
nothing is loaded whole), then :func:`gpuwatch.session.merge.merge` puts them on one clock
(each file's wall-clock offset) with devices named by host. One file is opened as itself,
unchanged.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..session import Session
from ..session.merge import Part, merge, origins
from ._schema import SUFFIX
from .loader import Loader, open_session
from .recording import Recording, RecordingError, open_recording

Progress = Callable[[int, int, Path], None]
"""``progress(i, n, path)``: about to load file ``i`` (0-based) of ``n``."""

Checked = Callable[[Path, int, int], None]
"""``checked(path, chunks checked, chunks in the file)``, now and then while validating."""


@dataclass
class Opened:
    """Open recordings and the session they make.

    Attributes:
        recordings: The files, in the order given.
        parts: One per file: its origin name, time shift and pid renumbering.
        session: The merged session (a single file's own session when there is one).
        loaders: Loaders still summarising a file written before summaries, in the
            background; stopped before the files close.
    """

    recordings: list[Recording]
    parts: list[Part]
    session: Session
    loaders: list[Loader] = field(default_factory=list)

    @property
    def merged(self) -> bool:
        return len(self.recordings) > 1

    def close(self) -> None:
        # A loader's thread reads its file: closed under it, it would fail mid-chunk.
        for loader in self.loaders:
            loader.stop()
        for rec in self.recordings:
            rec.close()


def load_many(
    paths: Sequence[str | os.PathLike[str]],
    *,
    align: str = "wall",
    strict: bool = True,
    progress: Progress | None = None,
    checked: Checked | None = None,
) -> Opened:
    """Open and validate every file, windowed; merge them when there are several.

    The sessions read their rows from the files through connections of their own, so
    :meth:`Opened.close` may come before the session is used up.

    Args:
        paths: One or more recordings.
        align: ``"wall"`` or ``"start"`` (see :func:`~gpuwatch.session.merge.merge`).
        strict: A damaged chunk is an error, found here by decoding every chunk once
            (else a view notes it and shows the rest).
        progress: Called before each file is read.
        checked: Called now and then while a file is validated.

    Raises:
        RecordingError: A file is not a readable recording, or a file is given twice.
    """
    resolved = [Path(p).resolve() for p in paths]
    for i, where in enumerate(resolved):
        if where in resolved[:i]:
            raise RecordingError(f"{paths[i]} is given twice")
    recordings: list[Recording] = []
    sessions: list[Session] = []
    loaders: list[Loader] = []
    try:
        for i, path in enumerate(paths):
            if progress is not None:
                progress(i, len(paths), Path(path))
            rec = open_recording(path)
            recordings.append(rec)
            if strict:
                rec.validate(None if checked is None else functools.partial(checked, Path(path)))
            session, loader = open_session(rec, windowed=True)
            if not loader.done:  # a file written before summaries: make them meanwhile
                loader.start(follow=False)
                loaders.append(loader)
            sessions.append(session)
    except BaseException:
        Opened(recordings, [], Session(), loaders).close()
        raise
    if len(sessions) == 1:
        return Opened(recordings, [Part(sessions[0], "")], sessions[0], loaders)
    names = origins(
        [rec.meta.get("host", "") for rec in recordings],
        [rec.path.name.removesuffix(SUFFIX) for rec in recordings],
    )
    parts = [Part(s, name) for s, name in zip(sessions, names, strict=True)]
    return Opened(recordings, parts, merge(parts, align), loaders)
