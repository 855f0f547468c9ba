"""``gpuwatch serve`` without its extra: one line naming the extra, exit 2 (no aiohttp needed)."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT

SPIKE = ROOT / "samples" / "gpt-2.7b-h100-adamw-spike.gpuwatch"


def test_serve_without_the_extra_says_how_to_install_it() -> None:
    # sys.modules[name] = None: find_spec (and import) then find no aiohttp, installed or not.
    code = (
        "import sys; sys.modules['aiohttp'] = None; from gpuwatch.cli import main; "
        f"sys.exit(main(['serve', {str(SPIKE)!r}]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'gpuwatch[serve]'" in lines[0], out.stderr
