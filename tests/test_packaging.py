"""The wheel holds every package: a package missing from pyproject's list works from a
checkout (an editable install) and breaks only after ``pip install .``."""

from __future__ import annotations

import sys

from conftest import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10
    import tomli as tomllib


def test_every_package_is_in_the_wheel() -> None:
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "gpuwatch").rglob("__init__.py")
    }
    assert found - listed == set(), "packages missing from pyproject.toml's list"
