"""``gpuwatch record -- CMD`` follows its command's end promptly, without a busier screen."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuwatch import launch
from gpuwatch.cli import record


class Recorder:
    """What ``_wait`` asks of the recorder: nothing to say, no failure."""

    error = None

    def take_notice(self) -> None:
        return None


def wait_for_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, seconds: float
) -> tuple[float, list[str]]:
    """Run ``_wait`` on a real command that sleeps ``seconds``, on a terminal.

    Returns:
        How long after the command ended ``_wait`` returned, and the status lines said.
    """
    said: list[str] = []
    monkeypatch.setattr(record, "say", lambda text, **kw: said.append(text))
    monkeypatch.setattr(record, "_status", lambda sources, started: "status")
    sources = SimpleNamespace(recorder=Recorder())
    end = tmp_path / "ended"  # when the command ended, on the one monotonic clock
    code = (
        f"import time; time.sleep({seconds}); open({str(end)!r}, 'w').write(str(time.monotonic()))"
    )
    child = launch.start([sys.executable, "-c", code], socket_path="/nonexistent", log_path="-")
    try:
        args = argparse.Namespace(duration=None)
        reported, elapsed = record._wait(
            args, sources, child, threading.Event(), time.monotonic(), True
        )
        returned = time.monotonic()
        assert (reported, elapsed) == (False, False)
        assert not child.running
        return returned - float(end.read_text()), said
    finally:
        if child.running:
            child.stop()


def test_the_commands_end_is_seen_within_a_poll(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Before, the loop looked once a second: a command that ended just after a look kept
    # gpuwatch (and a sweep running one record after another) waiting up to a second.
    late, _ = wait_for_command(monkeypatch, tmp_path, 0.0)
    assert late < 0.7  # the old loop: 0.96 s for a command ending as it starts


def test_the_status_line_stays_at_its_pace(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _, said = wait_for_command(monkeypatch, tmp_path, 2.5)
    assert 1 <= said.count("status") <= 3  # one a second, not one a poll
