"""Where the files that ship with gpuwatch live: themes and samples.

In a wheel they are inside the package (``gpuwatch/_data/``); in a source checkout or an
editable install they are the repository's top-level ``themes/`` and ``samples/``.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """The directory of shipped data ``name`` (``"themes"`` or ``"samples"``).

    Raises:
        FileNotFoundError: Neither location has it (a broken install).
    """
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"gpuwatch's {name}/ directory is missing from this install")
