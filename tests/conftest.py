"""Shared fixtures: short private socket paths, subprocess environments, GPU detection."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "train_tiny_gpt.py"


def _have_gpu() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return count > 0
    except Exception:
        return False


HAVE_GPU = _have_gpu()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU (none found here)")
    skip_tmux = pytest.mark.skip(reason="needs tmux on PATH")
    for item in items:
        if "gpu" in item.keywords and not HAVE_GPU:
            item.add_marker(skip_gpu)
        if "tmux" in item.keywords and shutil.which("tmux") is None:
            item.add_marker(skip_tmux)


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A private (0700) directory with a short path (AF_UNIX paths are limited to 107 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="gw-", dir="/tmp"))
    os.chmod(d, 0o700)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def sock_path(sock_dir: Path) -> str:
    return str(sock_dir / "gw.sock")


@pytest.fixture
def sub_env(sock_path: str) -> dict[str, str]:
    """Environment for child processes: this checkout first on the path, our socket."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["GPUWATCH_SOCKET"] = sock_path
    env.pop("GPUWATCH_DISABLE", None)
    return env


def wait_for(cond: Callable[[], bool], timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll ``cond`` until true or ``timeout`` seconds pass; returns the last result."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval)
    return cond()


def run_gpuwatch(
    *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run this checkout's ``gpuwatch`` command to completion, output captured.

    Args:
        args: The command line after ``gpuwatch``.
        env: The whole environment (default: ours, with this checkout on the path).
        cwd: Where to run it.
        timeout: Seconds before the run counts as hung.
    """
    return subprocess.run(
        [sys.executable, "-m", "gpuwatch", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)} if env is None else env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_sample(
    env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess:
    """Run the tiny-GPT sample to completion."""
    return subprocess.run(
        [sys.executable, str(SAMPLE), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_sample(env: dict[str, str], *args: str) -> subprocess.Popen:
    """Start the tiny-GPT sample in the background."""
    return subprocess.Popen(
        [sys.executable, str(SAMPLE), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class FakeClock:
    """A wall clock that moves only when told to (replay tests)."""

    def __init__(self, start_s: float = 5.0) -> None:
        self.now = int(start_s * 10**9)

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * 10**9)
