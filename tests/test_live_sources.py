"""The live sources' rank watcher: a look that raises is counted and noted once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from conftest import wait_for

import gpuwatch.live_sources as live_sources
from gpuwatch.analysis.rank_feed import RankMarks
from gpuwatch.live_sources import LiveSources


def test_a_failing_rank_check_is_counted_and_noted_once(monkeypatch, tmp_path: Path) -> None:
    # Before: every failure was swallowed, with no count and nothing on the screen.
    def broken(self, session) -> None:
        raise KeyError("rank")

    monkeypatch.setattr(RankMarks, "check", broken)
    monkeypatch.setattr(live_sources, "RANKS_EVERY", 0.01)
    tmp_path.chmod(0o700)
    sources = LiveSources(socket=str(tmp_path / "gw.sock"))
    watcher = threading.Thread(target=sources._mark_ranks, daemon=True)
    watcher.start()
    wait_for(lambda: sources.rank_check_failures >= 3, timeout=10)
    sources._ranks_stop.set()
    watcher.join(5)
    assert sources.rank_check_failures >= 3
    said = [n for n in sources.session.notes if "look at the ranks" in n]
    assert said == ["cannot look at the ranks for faults (KeyError): their marks may be missing"]


def test_stopping_looks_at_the_ranks_once_more(monkeypatch, tmp_path: Path) -> None:
    # A fault the screen showed in the last second before `q` must be in the recording: the
    # watcher looks once more when asked to stop, not only every RANKS_EVERY seconds.
    looks: list[float] = []
    monkeypatch.setattr(RankMarks, "check", lambda self, session: looks.append(time.monotonic()))
    monkeypatch.setattr(live_sources, "RANKS_EVERY", 3600.0)
    tmp_path.chmod(0o700)
    sources = LiveSources(socket=str(tmp_path / "gw.sock"))
    watcher = threading.Thread(target=sources._mark_ranks, daemon=True)
    asked = time.monotonic()
    watcher.start()
    sources._ranks_stop.set()
    watcher.join(5)
    assert not watcher.is_alive()
    assert len(looks) == 1 and looks[0] >= asked
