"""Recordings: one SQLite file per session, written live and replayed anywhere.

``docs/recording.md`` describes the file. Names are imported on first use, so that the
command line (``gpuwatch.cli``) can name these without loading numpy and
sqlite3 for ``gpuwatch --help``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._schema import FORMAT, SCHEMA_VERSION, SUFFIX
    from .loader import Loader, load, open_session
    from .player import Player
    from .recorder import Recorder
    from .recording import Recording, RecordingError, open_recording
    from .writer import SessionWriter, save_session

_WHERE = {
    "FORMAT": "._schema",
    "SCHEMA_VERSION": "._schema",
    "SUFFIX": "._schema",
    "Loader": ".loader",
    "Player": ".player",
    "Recorder": ".recorder",
    "Recording": ".recording",
    "RecordingError": ".recording",
    "SessionWriter": ".writer",
    "load": ".loader",
    "open_recording": ".recording",
    "open_session": ".loader",
    "save_session": ".writer",
}

__all__ = [
    "FORMAT",
    "SCHEMA_VERSION",
    "SUFFIX",
    "Loader",
    "Player",
    "Recorder",
    "Recording",
    "RecordingError",
    "SessionWriter",
    "load",
    "open_recording",
    "open_session",
    "save_session",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
