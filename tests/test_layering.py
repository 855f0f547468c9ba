"""DESIGN.md's layering: only gpuwatch/tui imports textual; `import gpuwatch` stays light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

PKG = ROOT / "gpuwatch"


def _imports(path: Path, top_level_only: bool = False) -> set[str]:
    """Top-level module names a file imports (all imports, or module-level ones only)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_only_tui_imports_textual() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in PKG.rglob("*.py")
        if "tui" not in p.relative_to(PKG).parts[:1] and ({"textual", "rich"} & _imports(p))
    ]
    assert offenders == [], f"textual/rich imported outside gpuwatch/tui: {offenders}"


def test_instrument_has_no_heavy_module_level_imports() -> None:
    heavy = {"textual", "rich", "numpy", "sqlite3", "torch", "psutil"}
    offenders = {
        str(p.relative_to(ROOT)): sorted(heavy & _imports(p, top_level_only=True))
        for p in (PKG / "instrument").rglob("*.py")
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert offenders == {}


def test_layering_checker_catches_a_violation(tmp_path: Path) -> None:
    # The checker itself must be able to fail.
    bad = tmp_path / "bad.py"
    bad.write_text("import numpy as np\nfrom textual.app import App\n")
    assert {"numpy", "textual"} <= _imports(bad, top_level_only=True)


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    return set(out.split())


def test_import_gpuwatch_is_light() -> None:
    loaded = _modules_after("import gpuwatch\nwith gpuwatch.phase('x'): gpuwatch.mark('m')")
    assert not {"textual", "numpy", "sqlite3", "torch", "rich", "psutil"} & loaded


def test_session_and_sources_do_not_pull_textual() -> None:
    loaded = _modules_after(
        "import gpuwatch.session, gpuwatch.sources.annotations, gpuwatch.sources.host, gpuwatch.cli"
    )
    assert "textual" not in loaded
