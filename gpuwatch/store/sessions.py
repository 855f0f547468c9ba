"""The sessions directory: where live sessions record by default, and its size cap.

Every live ``gpuwatch`` (and ``gpuwatch run``) records into the user data directory unless
told otherwise, so without a cap the directory grows for ever. Before a new default
recording starts, the oldest finished session recordings are removed until the directory
holds at most the cap (``--sessions-max`` / ``$GPUWATCH_SESSIONS_MAX``, default
:data:`DEFAULT_CAP`).

What may be removed is narrow on purpose: a file directly in the directory, named as
gpuwatch names its sessions, that opens as a gpuwatch recording and is not being written
(complete, or unfinished with a writer on this host that is gone). Anything else — another
program's file, a recording someone copied there under another name, a file still being
written here or possibly on another host sharing the directory — is never touched.
"""

from __future__ import annotations

import datetime
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SUFFIX = ".gpuwatch"
SESSIONS_MAX_ENV = "GPUWATCH_SESSIONS_MAX"
DEFAULT_CAP = 1 << 30
"""1 GiB: days of an 8-GPU machine at the default rate (README's ``--interval`` row gives
the size of a day)."""

NAME = re.compile(r"^\d{8}-\d{6}-[A-Za-z0-9._-]+\.gpuwatch$")
"""How :func:`default_recording_path` names a session (``20261123-060331-host[-2].gpuwatch``)."""

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def sessions_dir() -> Path:
    """``<user data dir>/sessions`` (platformdirs: ``~/.local/share/gpuwatch/sessions``)."""
    from platformdirs import user_data_dir

    return Path(user_data_dir("gpuwatch")) / "sessions"


def default_recording_path(now: datetime.datetime | None = None) -> Path:
    """``<sessions dir>/<start time>-<host>.gpuwatch``."""
    now = now or datetime.datetime.now()
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in socket.gethostname())
    return sessions_dir() / f"{now:%Y%m%d-%H%M%S}-{host or 'host'}{SUFFIX}"


def parse_cap(text: str) -> int | None:
    """``500M``, ``2G``, ``1.5GiB``, ``0`` -> bytes; ``none`` / ``off`` -> None (no cap).

    Raises:
        ValueError: Not a size.
    """
    t = text.strip().lower()
    if t in ("none", "off", "unlimited"):
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", t)
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 500M, 2G, or none)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def cap_from_env() -> int | None:
    """The cap from ``$GPUWATCH_SESSIONS_MAX``, else :data:`DEFAULT_CAP`.

    Raises:
        ValueError: The variable is set to something that is not a size.
    """
    value = os.environ.get(SESSIONS_MAX_ENV, "").strip()
    if not value:
        return DEFAULT_CAP
    try:
        return parse_cap(value)
    except ValueError as exc:
        raise ValueError(f"${SESSIONS_MAX_ENV}: {exc}")


@dataclass
class Pruned:
    """What :func:`prune` did."""

    removed: list[Path]
    freed: int
    total: int  # bytes of session recordings left
    kept_busy: int  # recordings over the cap that could not be removed (in use, foreign)


def _size(path: Path) -> int:
    total = 0
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        try:
            total += p.stat().st_size
        except OSError:
            pass
    return total


def removable(path: Path) -> bool:
    """True when ``path`` is a gpuwatch recording that nothing writes any more."""
    from . import RecordingError, open_recording  # the package face: internal modules move

    if not path.is_file() or path.is_symlink():
        return False
    try:
        rec = open_recording(path)
    except RecordingError:
        return False  # not ours, damaged or from a newer gpuwatch: not for us to delete
    try:
        if rec.complete:
            return True
        if rec.meta.get("host") != socket.gethostname():
            return False  # unfinished, written elsewhere (a shared home): maybe still live
        return not rec.writer_alive()
    finally:
        rec.close()


def prune(
    directory: Path,
    cap: int,
    *,
    keep: Path | None = None,
    check: Callable[[Path], bool] = removable,
) -> Pruned:
    """Remove the oldest finished session recordings until ``directory`` holds ``cap``.

    Args:
        directory: The sessions directory.
        cap: Bytes the session recordings may take together.
        keep: A recording never to remove (the one about to be written).
        check: Decides whether a file may go (default :func:`removable`).
    """
    entries: list[tuple[float, str, Path, int]] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return Pruned([], 0, 0, 0)
    for name in names:
        if not NAME.match(name):
            continue
        path = directory / name
        try:
            mtime = path.lstat().st_mtime
        except OSError:
            continue
        entries.append((mtime, name, path, _size(path)))
    entries.sort()  # oldest first; the name (start time) breaks ties
    total = sum(e[3] for e in entries)
    removed: list[Path] = []
    freed = busy = 0
    for _, _, path, size in entries:
        if total <= cap:
            break
        if keep is not None and path == keep:
            continue
        if not check(path):
            busy += 1
            continue
        try:
            path.unlink()
        except OSError:
            busy += 1
            continue
        for extra in (Path(f"{path}-wal"), Path(f"{path}-shm")):
            try:
                extra.unlink()
            except OSError:
                pass
        removed.append(path)
        freed += size
        total -= size
    return Pruned(removed, freed, total, busy)
