"""The user's TOML files in gpuwatch's config directory (``config.toml``, ``keymap.toml``):
where one is, and reading it with one line that says why it cannot be used.

Nothing here imports textual: the command line reads these files before it has a terminal.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from ..fmt import printable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def config_file(env: str, name: str) -> Path:
    """``$env`` where it is set, else ``name`` in ``$XDG_CONFIG_HOME/gpuwatch`` (else
    ``~/.config/gpuwatch``); the file need not exist."""
    if os.environ.get(env):
        return Path(os.environ[env])
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "gpuwatch" / name


def read_toml(path: Path, what: str, error: type[ValueError]) -> dict[str, Any] | None:
    """The TOML document in ``path``; None where there is no such file.

    Args:
        path: The file.
        what: What the file is, for the message (``config``, ``keymap``).
        error: The error to raise.

    Raises:
        error: The file cannot be read or is not TOML (one line, naming the file).
    """
    shown = printable(str(path))
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read the {what} {shown}: {exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"the {what} {shown} is not TOML: {exc}") from None
