"""Marks without end (issue 23, item 6): a session keeps the newest in memory and the
recording the rest, read back for the views, ``info`` and export that reach them."""

from __future__ import annotations

from pathlib import Path

from conftest import wait_for

from gpuwatch.protocol import Message
from gpuwatch.session import Session
from gpuwatch.session.navigate import events
from gpuwatch.session.retention import KEEP_MARKS
from gpuwatch.store.info import summarize_opened
from gpuwatch.store.multi import load_many
from gpuwatch.store.recorder import WAKE_MARKS, Recorder
from gpuwatch.store.writer import SessionWriter

PID = 777
MARKS = 8 * KEEP_MARKS
TEXT = "x" * 1000  # 1 KiB marks, as in the issue


def _mark(session: Session, i: int) -> None:
    t = 1_000_000 + i * 1_000
    session.ingest(
        Message(kind="mark", pid=PID, seq=i, t=t, body={"text": f"{i} {TEXT}", "step": i})
    )


def test_a_recorded_session_keeps_the_newest_marks_and_reads_the_rest_back(
    tmp_path: Path,
) -> None:
    s = Session()
    s.bound()
    path = tmp_path / "marks.gpuwatch"
    writer = SessionWriter(path, s)
    for i in range(MARKS):
        _mark(s, i)
        if i % 1000 == 999:
            writer.sync()
    # Before: every mark in memory (8 x 4096 of 1 KiB here; 200k in the issue: +265 MB).
    assert len(s.marks) <= 2 * KEEP_MARKS
    assert s.mark_count() == MARKS
    # An early window is read from the file; the newest from memory; nothing twice.
    early, _ = s.events_between(1_000_000, 1_000_000 + 99 * 1_000)
    assert [m.step for m in early] == list(range(100))
    assert early[5].text == f"5 {TEXT}"
    late, _ = s.events_between(1_000_000 + (MARKS - 10) * 1_000, 10**12)
    assert [m.step for m in late] == list(range(MARKS - 10, MARKS))
    across = s.events_between(0, 10**12)[0]
    assert len({m.step for m in across}) == len(across)
    assert len(events(s)) == MARKS  # jumping between marks reaches the first ones
    writer.close()

    opened = load_many([path])
    try:
        replay = opened.session
        assert len(replay.marks) <= 2 * KEEP_MARKS  # info and replay: bounded too
        assert replay.mark_count() == MARKS
        assert summarize_opened(opened)["marks"] == MARKS
        first, _ = replay.events_between(1_000_000, 1_000_000 + 2_000)
        assert [m.step for m in first] == [0, 1, 2]
        assert sum(1 for _ in replay.every_mark()) == MARKS
    finally:
        opened.close()


def test_marks_the_recording_has_not_written_stay_in_memory(tmp_path: Path) -> None:
    s = Session()
    s.bound()
    writer = SessionWriter(tmp_path / "slow.gpuwatch", s)
    for i in range(3 * KEEP_MARKS):  # no commit yet: none may go
        _mark(s, i)
    assert len(s.marks) == 3 * KEEP_MARKS
    writer.sync()
    _mark(s, 3 * KEEP_MARKS)
    assert len(s.marks) <= 2 * KEEP_MARKS + 1
    assert [m.step for m in s.every_mark()] == list(range(3 * KEEP_MARKS + 1))
    writer.close()


def test_an_unrecorded_bounded_session_lets_marks_go_and_counts_them() -> None:
    s = Session()
    s.bound()
    for i in range(MARKS):
        _mark(s, i)
    assert len(s.marks) <= 2 * KEEP_MARKS
    assert s.mark_count() == MARKS
    assert s.marks[-1].step == MARKS - 1


def test_a_flood_of_marks_wakes_the_recorder_before_its_interval(tmp_path: Path) -> None:
    """10k marks of 1 KiB a second waited a whole commit interval in memory (twice: the
    session's list and the rows of one sync); a recording's peak was 21 MB up."""
    s = Session()
    s.bound()
    rec = Recorder(s, tmp_path / "flood.gpuwatch", interval=60)  # never on its own here
    rec.start()
    try:
        for i in range(3 * WAKE_MARKS):
            _mark(s, i)
        assert wait_for(lambda: rec.syncs >= 2, timeout=10)  # woken once per WAKE_MARKS
        _mark(s, 3 * WAKE_MARKS)  # marks the file holds may go now
        assert len(s.marks) <= 2 * KEEP_MARKS + WAKE_MARKS
    finally:
        rec.close()
    assert sum(1 for _ in s.every_mark()) == 3 * WAKE_MARKS + 1
