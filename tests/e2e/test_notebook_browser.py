"""``%load_ext gpuwatch`` in a real JupyterLab, shown by a real headless Chromium (Debian's).

A JupyterLab server (this venv's) starts on a random loopback port with a token, in a
temporary root holding the seed's notebook: the extension, a small model with AdamW, the
forward, ``loss.backward()``, ``opt.step()`` a cell each. Playwright opens it as a user
would, runs every cell from the Run menu, and checks that the page shows the gpuwatch line
(and its ``%gpuwatch chart`` timeline) under the step cell, with AdamW's state as its
largest part. The kernel runs this checkout's gpuwatch on the CPU. The server is shut down
through its API, and the test fails if it, its kernel or anything they started outlives it.

``NOTEBOOK_SCREENSHOT=PATH`` also writes a PNG of the page there (README's
docs/img/notebook.png); not a ``GPUWATCH_`` name: conftest clears those.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, no_gpu_env
from support.browser import CHROMIUM, chromium

# The kernel imports torch and ipykernel, the server jupyterlab; this process only finds them.
for _name, _why in (
    ("torch", "needs torch"),
    ("ipykernel", "needs ipykernel (the test extra)"),
    ("jupyterlab", "needs jupyterlab (pip; .ci/run installs it)"),
):
    if importlib.util.find_spec(_name) is None:
        pytest.skip(_why, allow_module_level=True)
psutil = pytest.importorskip("psutil")
playwright_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip)")

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(
        not os.access(CHROMIUM, os.X_OK), reason="no chromium (Debian's chromium package)"
    ),
]

BUDGET_S = 85.0
"""The whole test, server start to the last process gone (a 2-core CI machine takes ~30 s)."""

CELLS = [
    "%load_ext gpuwatch",
    "import torch, torch.nn as nn\n"
    "torch.manual_seed(0)\n"
    "torch.set_num_threads(1)\n"
    "model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256))\n"
    "opt = torch.optim.AdamW(model.parameters())\n"
    "x = torch.randn(64, 256)",
    "out = model(x)\nloss = out.pow(2).mean()",
    "loss.backward()",
    "%gpuwatch chart",  # the next cells' lines come with their timelines
    "opt.step()",
]
STEP = len(CELLS) - 1


class Deadline:
    """What is left of the test's budget, for each wait in turn."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self, floor: float = 1.0) -> float:
        return max(floor, self.end - time.monotonic())

    def ms(self) -> float:
        return self.left() * 1000


def _notebook() -> dict[str, Any]:
    return {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
        },
        "cells": [
            {
                "cell_type": "code",
                "id": f"cell-{i}",
                "metadata": {},
                "execution_count": None,
                "outputs": [],
                "source": src,
            }
            for i, src in enumerate(CELLS)
        ],
    }


@dataclass
class Lab:
    proc: subprocess.Popen[bytes]
    base: str
    token: str
    log: Path

    def api(self, method: str, path: str) -> Any:
        req = urllib.request.Request(
            f"{self.base}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


def _env(home: Path) -> dict[str, str]:
    """The server's (and so its kernels') environment: this checkout's gpuwatch, the CPU,
    and Jupyter's own directories in ``home`` (no user settings, kernels or workspaces)."""
    env = no_gpu_env({**os.environ, "PYTHONPATH": str(ROOT)})
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["OMP_NUM_THREADS"] = "1"
    for name, sub in (
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTER_DATA_DIR", "data"),
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("IPYTHONDIR", "ipython"),
    ):
        env[name] = str(home / sub)
        (home / sub).mkdir(parents=True, exist_ok=True)
    env.pop("JUPYTER_PATH", None)
    env.pop("JUPYTER_TOKEN", None)
    # No news or update toast over the notebook: a fresh user's first page asks about both.
    settings = home / "config" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    return env


def _stop(lab: Lab, deadline: Deadline) -> list[str]:
    """Shut the server down through its API (it shuts its kernels down first); whatever of
    it, or of what it started, is still alive after that is killed by pid and named."""
    try:
        family = [lab.proc.pid, *(c.pid for c in psutil.Process(lab.proc.pid).children(True))]
    except psutil.NoSuchProcess:
        family = [lab.proc.pid]
    try:
        lab.api("POST", "/api/shutdown")
    except Exception:
        pass
    try:
        lab.proc.wait(timeout=min(20.0, deadline.left(5.0)))
    except subprocess.TimeoutExpired:
        os.killpg(lab.proc.pid, signal.SIGTERM)
        try:
            lab.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(lab.proc.pid, signal.SIGKILL)
            lab.proc.wait(timeout=5)
    left: list[str] = []
    end = time.monotonic() + 10
    for pid in family:
        try:
            p = psutil.Process(pid)
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except psutil.NoSuchProcess:
            continue
        except psutil.TimeoutExpired:
            try:
                left.append(f"{pid} {' '.join(p.cmdline())[:120]}")
                p.kill()
            except psutil.NoSuchProcess:
                pass
    return left


def _kernel_idle(lab: Lab) -> bool:
    sessions = lab.api("GET", "/api/sessions")
    return any(
        s.get("path") == "seed.ipynb" and (s.get("kernel") or {}).get("execution_state") == "idle"
        for s in sessions
    )


@pytest.fixture
def deadline() -> Deadline:
    return Deadline(BUDGET_S)


@pytest.fixture
def lab(tmp_path: Path, deadline: Deadline) -> Iterator[Lab]:
    root = tmp_path / "root"
    root.mkdir()
    (root / "seed.ipynb").write_text(json.dumps(_notebook(), indent=1))
    home = tmp_path / "jupyter"
    env = _env(home)
    token = secrets.token_hex(24)
    log = tmp_path / "lab.log"
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.port=0",  # a free port, chosen by the server, read from its info file
        "--ServerApp.port_retries=0",
        "--allow-root",  # CI's containers run as root; a no-op elsewhere
        "--ServerApp.terminals_enabled=False",
        f"--ServerApp.root_dir={root}",
        f"--IdentityProvider.token={token}",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",  # nothing asks PyPI
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, env=env, cwd=root, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    info = home / "runtime" / f"jpserver-{proc.pid}.json"
    lab = Lab(proc, "", token, log)
    left: list[str] = []
    try:
        while not info.exists():
            if proc.poll() is not None or deadline.left(0) == 0:
                pytest.fail(f"jupyter lab never started (exit {proc.poll()}):\n{lab.tail()}")
            time.sleep(0.1)
        while True:  # the file may be caught half-written
            try:
                port = json.loads(info.read_text())["port"]
                break
            except (ValueError, KeyError):
                time.sleep(0.05)
        lab.base = f"http://127.0.0.1:{port}"
        while True:
            try:
                lab.api("GET", "/api/status")
                break
            except OSError:
                if proc.poll() is not None or deadline.left(0) == 0:
                    pytest.fail(f"jupyter lab never answered:\n{lab.tail()}")
                time.sleep(0.1)
        yield lab
    finally:
        left = _stop(lab, deadline)
    assert not left, f"still running after the server's shutdown: {left}"


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    with chromium(tmp_path / "profile", 1200, 900) as context:
        yield context


def test_the_line_under_the_step_cell_in_jupyterlab(
    lab: Lab, browser: Any, deadline: Deadline, tmp_path: Path
) -> None:
    expect = playwright_api.expect
    page = browser.new_page()
    page.set_default_timeout(15_000)  # the steps on a page already drawn; long waits say more
    page.goto(f"{lab.base}/lab/tree/seed.ipynb?reset&token={lab.token}", timeout=deadline.ms())

    cells = page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell")
    expect(cells).to_have_count(len(CELLS), timeout=deadline.ms())
    # The notebook's kernel started and idle (the server's word) before the cells are sent.
    while not _kernel_idle(lab):
        assert deadline.left(0) > 0, f"the kernel never came up: {lab.api('GET', '/api/sessions')}"
        page.wait_for_timeout(100)

    # The file browser out of the way (a click on its open tab folds the left area).
    tab = page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current")
    if tab.count():
        tab.first.click(timeout=deadline.ms())
        expect(tab).to_have_count(0, timeout=deadline.ms())

    # Run ▸ Run All Cells, as a user would.
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click(timeout=deadline.ms())
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click(timeout=deadline.ms())

    step = cells.nth(STEP)
    line = step.locator(".jp-OutputArea-output div.gpuwatch-cell")
    try:
        expect(line).to_have_count(1, timeout=deadline.ms())
    except AssertionError:
        outputs = [cells.nth(i).inner_text() for i in range(len(CELLS))]
        raise AssertionError(f"no gpuwatch line under the step cell; the cells: {outputs}")
    line.scroll_into_view_if_needed()
    expect(line).to_be_visible(timeout=deadline.ms())
    expect(line).to_be_in_viewport()
    expect(line).to_contain_text(f"gpuwatch [{STEP + 1}]")
    expect(line).to_contain_text("in optimizer.step")
    expect(line).to_contain_text("largest: AdamW state")
    text = line.inner_text()
    assert text.startswith("gpuwatch ["), text
    # %gpuwatch chart: the step cell's timeline drawn under its line.
    chart = step.locator(".jp-OutputArea-output svg")
    expect(chart).to_be_visible()
    assert chart.bounding_box()["height"] > 100
    # The cells before it: the forward's and the backward's lines (no chart asked for yet),
    # none under the model's or the magic's.
    expect(cells.nth(2).locator("div.gpuwatch-cell")).to_contain_text("in forward")
    expect(cells.nth(3).locator("div.gpuwatch-cell")).to_contain_text("in backward")
    assert cells.nth(3).locator(".jp-OutputArea-output svg").count() == 0
    for quiet in (0, 1, 4):
        assert cells.nth(quiet).locator("div.gpuwatch-cell").count() == 0

    # The page as README shows it: from the top of the notebook to the step cell's chart.
    page.evaluate("document.activeElement && document.activeElement.blur()")
    cells.nth(0).evaluate("el => el.scrollIntoView({block: 'start'})")
    expect(cells.nth(0)).to_be_in_viewport()
    expect(chart).to_be_in_viewport(ratio=1)
    bottom = step.bounding_box()
    height = min(900, round(bottom["y"] + bottom["height"] + 16))
    png = page.screenshot(
        path=str(tmp_path / "notebook.png"), clip={"x": 0, "y": 0, "width": 1200, "height": height}
    )
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    shot = os.environ.get("NOTEBOOK_SCREENSHOT")
    if shot:
        Path(shot).write_bytes(png)
    page.close()
