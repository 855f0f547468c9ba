"""The real ``gpuwatch`` command in tmux, driven as a person would: keys in, screen out."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT, SAMPLE
from tmuxhelp import Tmux

pytestmark = pytest.mark.tmux


@pytest.fixture
def gw_env(sock_path: str) -> dict[str, str]:
    return {
        "PYTHONPATH": str(ROOT),
        "GPUWATCH_SOCKET": sock_path,
        "TERM": "xterm-256color",
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
    }


@pytest.mark.torch
def test_live_dashboard_shows_the_sample_and_reacts_to_keys(gw_env, sock_path) -> None:
    tmux = Tmux(f"{shlex.quote(sys.executable)} -m gpuwatch --no-record", gw_env)
    try:
        assert tmux.wait_for_text("host"), tmux.screen()
        assert "LIVE" in tmux.screen()
        env = {**os.environ, **gw_env}
        result = subprocess.run(
            [sys.executable, str(SAMPLE), "--steps", "40", "--step-sleep", "0.02"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        # The sample ran on the CPU: its phases are on the host panel's band.
        pid_label = "pid "
        assert tmux.wait_for_text(pid_label), tmux.screen()
        assert "RSS" in tmux.screen()
        tmux.keys("f")
        assert tmux.wait_for_text("PAUSED")
        tmux.keys("2")
        assert tmux.wait_for_text("optimizer.step"), tmux.screen()
        screen = tmux.screen()
        assert "forward" in screen and "backward" in screen and "zero_grad" in screen
        tmux.keys("1", "?")
        assert tmux.wait_for_text("what it is"), tmux.screen()
        # Escape, then q once the help has gone: a busy app that reads both bytes at once
        # takes them for Alt+q, as any terminal app would.
        tmux.keys("Escape")
        assert tmux.wait_for_gone("what it is"), tmux.screen()
        tmux.keys("q")
        assert tmux.wait_for_text("EXIT=0"), tmux.screen()
    finally:
        tmux.close()


def _squeeze(text: str) -> str:
    """Screen text without whitespace: a long line wraps at the pane's edge."""
    return "".join(text.split())


@pytest.mark.parametrize("records", [True, False], ids=["recording", "not recording"])
def test_second_dashboard_is_a_view_and_quitting_says_where_it_recorded(
    gw_env, tmp_path, records: bool
) -> None:
    recording = tmp_path / "first.gpuwatch"
    option = f"--record {recording}" if records else "--no-record"
    first = Tmux(f"{shlex.quote(sys.executable)} -m gpuwatch {option}", gw_env)
    try:
        assert first.wait_for_text("host")
        second = Tmux(f"{shlex.quote(sys.executable)} -m gpuwatch --no-record", gw_env)
        try:
            # A view of the first (issue 51): it says so, and on quit whose session it
            # viewed and where that one records (if it does).
            assert second.wait_for_text("view of gpuwatch pid"), second.screen()
            second.keys("q")
            assert second.wait_for_text("EXIT=0"), second.screen()
            screen = _squeeze(second.screen())
            assert "viewedthegpuwatchon" in screen, second.screen()
            assert (_squeeze(f"its recording: {recording}") in screen) == records, screen
        finally:
            second.close()
        first.keys("q")
        assert first.wait_for_text("EXIT=0"), first.screen()
        after = _squeeze(first.screen())
        assert (_squeeze(f"recorded to {recording}") in after) == records
        assert (_squeeze(f"replay it: gpuwatch replay {recording}") in after) == records
    finally:
        first.close()
