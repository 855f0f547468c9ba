"""Drive a real terminal program in tmux: keys in, screen text out."""

from __future__ import annotations

import shlex
import subprocess
import time
import uuid

from conftest import wait_for


class Tmux:
    """One command in its own private tmux server, at a fixed size.

    A private server (``-L``) with no config means nobody else's tmux options or sessions
    change the window under the test; ``COLUMNS``/``LINES`` (pytest sets them) are removed
    so the program sizes itself from the window. The pane stays open after the command
    exits and shows ``EXIT=<status>``.
    """

    def __init__(
        self, command: str, env: dict[str, str], width: int = 140, height: int = 45
    ) -> None:
        self.server = f"gw-{uuid.uuid4().hex[:10]}"
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        script = f"env -u COLUMNS -u LINES {exports} {command}; echo EXIT=$?; sleep 60"
        self._tmux("new-session", "-d", "-s", "main", "-x", str(width), "-y", str(height), script)

    def _tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.server, "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            check=False,
        ).stdout

    def screen(self) -> str:
        """The text on the screen now."""
        return self._tmux("capture-pane", "-p", "-t", "main")

    def keys(self, *keys: str) -> None:
        """Type keys (tmux key names), a little apart, as a person would."""
        for key in keys:
            self._tmux("send-keys", "-t", "main", key)
            time.sleep(0.15)

    def wait_for_text(self, text: str, timeout: float = 30) -> bool:
        """Wait until ``text`` is on the screen."""
        return wait_for(lambda: text in self.screen(), timeout=timeout, interval=0.2)

    def wait_for_gone(self, text: str, timeout: float = 30) -> bool:
        """Wait until ``text`` is no longer on the screen."""
        return wait_for(lambda: text not in self.screen(), timeout=timeout, interval=0.2)

    def close(self) -> None:
        self._tmux("kill-server")
