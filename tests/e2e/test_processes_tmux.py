"""The Processes tab of the real CLI in tmux, at 80x24 and 200x50: sort, filter, tree and
a SIGTERM that a real worker receives after the confirmation; a replay refuses signals."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys

import pytest
from conftest import ROOT, fake_nvml_env, wait_for
from tmuxhelp import Tmux
from workers import LAUNCHER
from workers import alive as _alive

pytestmark = pytest.mark.tmux

SIZES = {"80x24": (80, 24), "200x50": (200, 50)}
GIB = 1 << 30


@pytest.mark.parametrize("size", SIZES)
def test_sort_filter_tree_and_a_signal_in_the_terminal(sub_env: dict[str, str], size: str) -> None:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    term = None
    workers: list[int] = []
    try:
        assert launcher.stdout is not None
        workers = [int(p) for p in launcher.stdout.readline().split()]
        a, b = workers
        spec = {
            "gpus": 2,
            "trace": "flat",
            "processes": [[a, 18 * GIB, 0], [b, 3 * GIB, 1]],
            "proc_util": [[a, 91, 40, 0], [b, 12, 5, 1]],
        }
        env = fake_nvml_env(sub_env, spec)
        keep = ("PYTHONPATH", "GPUWATCH_SOCKET", "GPUWATCH_NVML_BACKEND", "GPUWATCH_FAKE_NVML")
        w, h = SIZES[size]
        term = Tmux(
            f"{shlex.quote(sys.executable)} -m gpuwatch --no-record",
            {k: env[k] for k in keep},
            width=w,
            height=h,
        )
        assert term.wait_for_text("GPU"), term.screen()
        term.keys("3")
        assert term.wait_for_text(str(b)) and term.wait_for_text("91%"), term.screen()
        assert "GPU▲" in term.screen()
        term.keys("o")  # sort by GPU memory: the 18 GiB worker first
        assert term.wait_for_text("GPU mem▼"), term.screen()
        lines = term.screen().splitlines()
        assert [i for i, x in enumerate(lines) if f"{a} " in x] < [
            i for i, x in enumerate(lines) if f"{b} " in x
        ]
        term.keys("t")  # the tree: both workers under their launcher
        assert term.wait_for_text("└─ "), term.screen()
        assert str(launcher.pid) in term.screen()
        term.keys("t", "/", *str(b), "Enter")  # filter to one worker
        assert term.wait_for_gone(f"{a} "), term.screen()
        assert "1 process " in term.screen()
        term.keys("T")
        assert term.wait_for_text(f"Send SIGTERM to pid {b}?"), term.screen()
        term.keys("y")
        assert wait_for(lambda: not _alive(b), timeout=15), term.screen()
        assert _alive(a)
        term.keys("q")
        assert term.wait_for_text("EXIT=0"), term.screen()
    finally:
        if term is not None:
            term.close()
        launcher.kill()  # SIGKILL: the launcher cannot stop its workers, so they go too
        launcher.wait()
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_replay_refuses_signals_in_one_line(sub_env: dict[str, str]) -> None:
    sample = ROOT / "samples" / "gpt2-small-h100.gpuwatch"
    env = {"PYTHONPATH": sub_env["PYTHONPATH"], "HOME": os.environ.get("HOME", "/tmp")}
    term = Tmux(
        f"{shlex.quote(sys.executable)} -m gpuwatch replay {shlex.quote(str(sample))}", env, 80, 24
    )
    try:
        assert term.wait_for_text("Processes"), term.screen()
        term.keys("3", "K")
        assert term.wait_for_text("this is a replay"), term.screen()
        assert "Send SIG" not in term.screen()
        term.keys("q")
        assert term.wait_for_text("EXIT=0"), term.screen()
    finally:
        term.close()
