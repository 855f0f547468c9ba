"""The recorder gives freed heap pages back to the system after a sweep's processes were
let go of (issue 23, item 6): a burst of processes left 18 MB free, never used again."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest
from conftest import wait_for

from gpuwatch.protocol import Message
from gpuwatch.session import Session
from gpuwatch.store import Recorder, _heap
from gpuwatch.store.recorder import TRIM_SETTLED, WAKE_BYES


def _script(s: Session, pid: int) -> None:
    s.ingest(Message(kind="hello", pid=pid, seq=0, t=pid * 10, body={"argv": ["x.py"]}))
    body = {"event": "begin", "id": 1, "name": "step", "depth": 0}
    s.ingest(Message(kind="phase", pid=pid, seq=1, t=pid * 10 + 1, body=body))
    s.ingest(Message(kind="phase", pid=pid, seq=2, t=pid * 10 + 2, body={**body, "event": "end"}))
    s.ingest(Message(kind="bye", pid=pid, seq=3, t=pid * 10 + 3, body={"exit_code": 0}))


def test_the_recorder_trims_the_heap_once_many_processes_settled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trims = []
    monkeypatch.setattr(_heap, "trim", lambda: trims.append(1) or True)
    s = Session()
    s.bound()
    rec = Recorder(s, tmp_path / "sweep.gpuwatch")
    rec.start()
    try:
        for pid in range(1000, 1000 + TRIM_SETTLED - 10):
            _script(s, pid)
        assert rec.flush() and rec.flush()  # the second settles what the first wrote
        assert trims == []  # not yet many
        for pid in range(5000, 5020):
            _script(s, pid)
        assert rec.flush() and rec.flush()
        assert trims == [1]
        assert rec.flush() and trims == [1]  # nothing more settled: no trim
    finally:
        rec.close()
    assert rec.error is None


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="malloc_trim is glibc's",
)
def test_trim_returns_the_heaps_free_pages() -> None:
    assert _heap.trim() is True


def test_a_sweep_wakes_the_recorder_every_so_many_processes(tmp_path: Path) -> None:
    # A gpuwatch catching up on a backlog ingests hundreds of processes a second; each
    # keeps its tables until written and settled. Written once an interval, they were let
    # go of in batches of hundreds, and the freed memory stayed fragmented.
    s = Session()
    s.bound()
    rec = Recorder(s, tmp_path / "sweep.gpuwatch", interval=60)  # never on its own here
    rec.start()
    try:
        for pid in range(1000, 1000 + 3 * WAKE_BYES):
            _script(s, pid)
        assert wait_for(lambda: rec.syncs >= 2, timeout=10)
    finally:
        rec.close()
    assert rec.error is None
