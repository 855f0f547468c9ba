"""The real ``gpuwatch`` command in tmux, driven as a person would: keys in, screen out."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import uuid

import pytest
from conftest import ROOT, SAMPLE, wait_for

pytestmark = pytest.mark.tmux


class Tmux:
    """One detached tmux session running a command at a fixed size."""

    def __init__(
        self, command: str, env: dict[str, str], width: int = 140, height: int = 45
    ) -> None:
        self.name = f"gw-{uuid.uuid4().hex[:8]}"
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        # Keep the pane open after the command exits so its exit status can be read.
        script = f"env {exports} {command}; echo EXIT=$?; sleep 60"
        subprocess.run(
            [
                "tmux",
                "new-session",
                "-d",
                "-s",
                self.name,
                "-x",
                str(width),
                "-y",
                str(height),
                script,
            ],
            check=True,
        )
        # A server started by someone else may impose its own size: pin ours.
        subprocess.run(
            ["tmux", "set-option", "-t", self.name, "window-size", "manual"], capture_output=True
        )
        subprocess.run(
            ["tmux", "resize-window", "-t", self.name, "-x", str(width), "-y", str(height)],
            capture_output=True,
        )

    def screen(self) -> str:
        return subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True, text=True
        ).stdout

    def keys(self, *keys: str) -> None:
        for key in keys:
            subprocess.run(["tmux", "send-keys", "-t", self.name, key], check=True)
            time.sleep(0.15)

    def wait_for_text(self, text: str, timeout: float = 30) -> bool:
        return wait_for(lambda: text in self.screen(), timeout=timeout, interval=0.2)

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


@pytest.fixture
def gw_env(sock_path: str) -> dict[str, str]:
    return {
        "PYTHONPATH": str(ROOT),
        "GPUWATCH_SOCKET": sock_path,
        "TERM": "xterm-256color",
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
    }


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
        tmux.keys("Escape", "q")
        assert tmux.wait_for_text("EXIT=0"), tmux.screen()
    finally:
        tmux.close()


def test_second_dashboard_on_the_same_socket_is_refused(gw_env) -> None:
    first = Tmux(f"{shlex.quote(sys.executable)} -m gpuwatch --no-record", gw_env)
    try:
        assert first.wait_for_text("host")
        second = Tmux(f"{shlex.quote(sys.executable)} -m gpuwatch --no-record", gw_env)
        try:
            assert second.wait_for_text("EXIT=2"), second.screen()
            assert "already listening" in second.screen()
        finally:
            second.close()
    finally:
        first.close()
