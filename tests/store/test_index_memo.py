"""The index memo: a closed recording opens from one row per series, and a memo that is
stale, damaged or hostile is never believed."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import longdata
import numpy as np
import pytest
from longdata import KEY, PID, SECOND, T0

from gpuwatch.session import Session
from gpuwatch.store import RecordingError, SessionWriter, _index, open_recording, open_session

SECONDS = 300.0


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """5 minutes at 100 Hz in chunks of 2048 rows: 15 chunks a GPU, most summarised."""
    path = tmp_path_factory.mktemp("memo") / "run.gpuwatch"
    longdata.record(path, SECONDS)
    return path


def _copy(src: Path, dst: Path, sql: str = "", *args: object) -> Path:
    shutil.copy(src, dst)
    if sql:
        db = sqlite3.connect(dst)
        with db:
            db.execute(sql, args)
        db.close()
    return dst


def _ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def _plain(a: np.ndarray) -> list[object]:
    return [None if x != x else x for x in a.tolist()]  # NaN (no data) equals NaN here


def _answers(path: Path) -> list[object]:
    """What a replay asks of the file: windows of NVML and allocator lines, band spans and
    the maxima the opening view uses, over the whole run and two narrow windows."""
    rec = open_recording(path)
    try:
        s, _ = open_session(rec, windowed=True)
        proc = s.processes[PID]
        out: list[object] = [s.time_range()]
        first, last = T0, T0 + int(SECONDS * SECOND)
        for t0, t1 in (
            (first, last),
            (first + 61 * SECOND, first + 64 * SECOND),
            (last - SECOND, last),
        ):
            for line in (
                s.gpu_window(KEY, "used", t0, t1, 97),
                proc.torch_window(KEY, "allocated", t0, t1, 97),
            ):
                out += [_plain(a) for a in line]
            out += [_plain(a) for a in proc.band_spans(t0, t1, 40).values()]
        return out
    finally:
        rec.close()


def test_a_closed_recording_opens_from_a_memo_equal_to_its_index(recorded: Path, tmp_path) -> None:
    db = _ro(recorded)
    memo = _index.read_memo(db)
    assert memo is not None
    index, summaries = memo
    tables, stored = _index.read_index(db), _index.read_summaries(db)
    db.close()
    assert index.keys() == tables.keys() and len(index) >= 5
    for sid, part in tables.items():
        assert np.array_equal(index[sid], part)
    assert summaries.keys() == stored.keys() and summaries
    for sid, (row0, joined) in stored.items():
        assert np.array_equal(summaries[sid][0], row0) and summaries[sid][1] == joined
    # The same answers from the memo as from the tables (a copy without its memo).
    bare = _copy(recorded, tmp_path / "bare.gpuwatch", "DELETE FROM index_memo")
    assert _index.read_memo(_ro(bare)) is None
    assert _answers(recorded) == _answers(bare)


def test_files_not_closed_complete_have_no_memo(tmp_path: Path) -> None:
    s = longdata.new_session()
    writer = SessionWriter(tmp_path / "growing.gpuwatch", s, chunk_rows=256)
    longdata.fill(s, T0, 10.0, 10.0, 0)
    writer.sync()
    assert _index.read_memo(_ro(tmp_path / "growing.gpuwatch")) is None  # still being written
    writer.close(complete=False)
    db = _ro(tmp_path / "growing.gpuwatch")
    assert _index.read_memo(db) is None and _index.memo_agrees(db)


def _last_chunk(path: Path) -> tuple[int, int]:
    db = _ro(path)
    sid = db.execute(
        "SELECT id FROM series WHERE kind = 'gpu'",
    ).fetchone()[0]
    row0 = db.execute("SELECT max(row0) FROM chunks WHERE series = ?", (sid,)).fetchone()[0]
    db.close()
    return sid, row0


def _memo_blob(path: Path, sid: int) -> bytes:
    db = _ro(path)
    blob = db.execute("SELECT chunks FROM index_memo WHERE series = ?", (sid,)).fetchone()[0]
    db.close()
    return blob


Damage = Callable[[Path, int, int], tuple[str, tuple[object, ...]]]

DAMAGE: dict[str, Damage] = {
    # The tables changed after the memo was written (a chunk gone): stale.
    "stale": lambda p, sid, row0: ("DELETE FROM chunks WHERE series = ? AND row0 = ?", (sid, row0)),
    "truncated": lambda p, sid, _: (
        "UPDATE index_memo SET chunks = substr(chunks, 1, length(chunks) - 8) WHERE series = ?",
        (sid,),
    ),
    "text": lambda p, sid, _: ("UPDATE index_memo SET chunks = 'x' WHERE series = ?", (sid,)),
    "a series missing": lambda p, sid, _: ("DELETE FROM index_memo WHERE series = ?", (sid,)),
    "a series too many": lambda p, sid, _: (
        "INSERT INTO index_memo VALUES (99999, zeroblob(48), x'', x'')",
        (),
    ),
    "summaries of another chunk": lambda p, sid, _: (
        "UPDATE index_memo SET summary_row0 = zeroblob(length(summary_row0)) WHERE series = ?",
        (sid,),
    ),
    "out of order": lambda p, sid, _: (
        "UPDATE index_memo SET chunks = ? WHERE series = ?",
        (
            np.frombuffer(_memo_blob(p, sid), "<i8").reshape(-1, 6)[::-1].tobytes(),
            sid,
        ),
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_memo_that_disagrees_is_not_believed(recorded: Path, tmp_path: Path, damage: str):
    sid, row0 = _last_chunk(recorded)
    sql, args = DAMAGE[damage](recorded, sid, row0)
    path = _copy(recorded, tmp_path / "damaged.gpuwatch", sql, *args)
    db = _ro(path)
    assert _index.read_memo(db) is None
    assert not _index.memo_agrees(db)
    db.close()
    # Opened from the tables, exactly as a file without a memo.
    bare = _copy(path, tmp_path / "bare.gpuwatch", "DELETE FROM index_memo")
    assert _answers(path) == _answers(bare)
    with pytest.raises(RecordingError, match="index memo"):
        open_recording(path).validate()


def test_validation_finds_a_memo_that_agrees_only_on_its_counts(recorded: Path, tmp_path):
    """Counts and row bounds are what an open checks (a few ms); other figures that
    differ (here one chunk's first time) are found when the file is validated."""
    sid, _ = _last_chunk(recorded)
    part = np.frombuffer(_memo_blob(recorded, sid), "<i8").reshape(-1, 6).copy()
    part[1, 2] += 1
    path = _copy(
        recorded,
        tmp_path / "lying.gpuwatch",
        "UPDATE index_memo SET chunks = ? WHERE series = ?",
        part.tobytes(),
        sid,
    )
    assert _index.read_memo(_ro(path)) is not None
    with pytest.raises(RecordingError, match="index memo"):
        open_recording(path).validate()
    open_recording(recorded).validate()  # the file as written validates


def test_a_memo_that_cannot_be_written_leaves_the_file_complete(tmp_path, monkeypatch) -> None:
    def fail(db: sqlite3.Connection) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(_index, "write_memo", fail)
    s: Session = longdata.new_session()
    writer = SessionWriter(tmp_path / "full.gpuwatch", s, chunk_rows=256)
    longdata.fill(s, T0, 10.0, 10.0, 0)
    writer.close()
    rec = open_recording(tmp_path / "full.gpuwatch")
    assert rec.meta.get("complete") == "1"
    assert _index.read_memo(rec.db) is None
    rec.validate()
