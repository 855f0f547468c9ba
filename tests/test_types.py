"""The package type-checks: mypy under pyproject.toml's ``[tool.mypy]``, 0 errors.

CI installs the mypy that .ci/constraints.txt pins and runs this with the rest of the
suite, so README's test command is still the one CI runs. Elsewhere it is skipped: without
mypy, or under another version, whose verdict would be about the version (a new release adds
checks), not about the code.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT


def _pinned_mypy() -> str:
    for line in (ROOT / ".ci" / "constraints.txt").read_text().splitlines():
        name, _, version = line.partition("==")
        if name.strip() == "mypy":
            return version.strip()
    raise AssertionError("mypy is not pinned in .ci/constraints.txt")


def test_the_package_type_checks() -> None:
    version = pytest.importorskip("mypy.version").__version__
    if version != _pinned_mypy():
        pytest.skip(f"mypy {version} is not the {_pinned_mypy()} CI pins")
    # No arguments: the files, flags and overrides are pyproject.toml's, as in .ci/run.
    out = subprocess.run(
        [sys.executable, "-m", "mypy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, (out.stdout[-6000:] + out.stderr[-2000:]).strip()
