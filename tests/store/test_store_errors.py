"""Bad files: one line and exit status 2 from replay, info and export, never a traceback."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ROOT, run_cli, run_gpuwatch
from store_data import populated_session

from gpuwatch.store import RecordingError, _codec, load, open_recording, open_session, save_session
from gpuwatch.store._schema import SCHEMA_VERSION, layout_dtypes


def _good(path: Path) -> Path:
    return save_session(populated_session(3), path)


def _empty(path: Path) -> Path:
    path.write_bytes(b"")
    return path


def _truncated(path: Path) -> Path:
    data = _good(path).read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _corrupt(path: Path) -> Path:
    data = bytearray(_good(path).read_bytes())
    # Keep the SQLite header, scramble the rest of the first pages (the schema lives there).
    for i in range(100, min(len(data), 40_000)):
        data[i] = (data[i] * 7 + i) & 0xFF
    path.write_bytes(bytes(data))
    return path


def _not_sqlite(path: Path) -> Path:
    path.write_text("step,loss\n1,2.3\n" * 100)
    return path


def _foreign(path: Path) -> Path:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("CREATE TABLE meta (key TEXT, value TEXT)")
        db.execute("INSERT INTO meta VALUES ('format', 'something-else')")
    return path


def _newer(path: Path) -> Path:
    _good(path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (str(SCHEMA_VERSION + 1),))
    return path


def _missing(path: Path) -> Path:
    return path


def _damaged_chunk(path: Path) -> Path:
    _good(path)
    with sqlite3.connect(path) as db:
        db.execute(
            "UPDATE chunks SET data = zeroblob(40) WHERE rowid = (SELECT max(rowid) FROM chunks)"
        )
    return path


BAD: dict[str, tuple[Callable[[Path], Path], str]] = {
    "empty": (_empty, "is empty"),
    "truncated": (_truncated, "is truncated"),
    "corrupt": (_corrupt, "damaged"),
    "not-sqlite": (_not_sqlite, "not an SQLite database"),
    "foreign": (_foreign, "not a gpuwatch recording"),
    "newer": (_newer, "newer gpuwatch"),
    "missing": (_missing, "no such file"),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_open_raises_a_one_line_recording_error(tmp_path: Path, kind: str) -> None:
    make, text = BAD[kind]
    path = make(tmp_path / f"{kind}.gpuwatch")
    with pytest.raises(RecordingError) as info:
        open_recording(path)
    message = str(info.value)
    assert text in message and "\n" not in message and str(path) in message


def test_damaged_chunk_fails_a_full_load_and_notes_in_replay(tmp_path: Path) -> None:
    path = _damaged_chunk(tmp_path / "chunk.gpuwatch")
    with pytest.raises(RecordingError, match="damaged"):
        load(path)
    rec = open_recording(path)  # the structure is sound: replay shows what loads
    session, loader = open_session(rec)
    loader.load_all()
    assert loader.error is not None and any("damaged" in n for n in session.notes)
    rec.close()


def test_validation_names_the_first_damaged_chunk_in_the_file(tmp_path: Path) -> None:
    """Chunks are checked on several threads: a later chunk that fails sooner (it is
    quick to find wrong) is not the one reported."""
    path = tmp_path / "two.gpuwatch"
    path.write_bytes((ROOT / "samples" / "gpt2-small-h100.gpuwatch").read_bytes())
    with sqlite3.connect(path) as db:
        first, blob, n, codec, columns = db.execute(
            "SELECT c.rowid, c.data, c.n, c.codec, s.columns FROM chunks c"
            " JOIN series s ON s.id = c.series WHERE length(c.data) > 1000"
            " ORDER BY c.rowid LIMIT 1"
        ).fetchone()
        bad = bytearray(blob)
        bad[len(bad) * 3 // 4] ^= 0xFF  # deep in a stream: found after inflating most of it
        db.execute("UPDATE chunks SET data = ? WHERE rowid = ?", (bytes(bad), first))
        db.execute(
            "UPDATE chunks SET data = zeroblob(40) WHERE rowid > ?", (first,)
        )  # every later chunk: damaged at its first bytes
    rec = open_recording(path)
    try:
        with pytest.raises(RecordingError) as info:
            rec.validate()
    finally:
        rec.close()
    with pytest.raises(Exception) as alone:
        _codec.check(bytes(bad), n, layout_dtypes(tuple(map(tuple, json.loads(columns)))), codec)
    assert str(alone.value) in str(info.value)


@pytest.mark.parametrize("kind", ["phases", "gpu_procs"])
def test_a_damaged_chunk_of_narrow_columns_replays_as_unknown(tmp_path: Path, kind: str) -> None:
    # Phases hold int32/int16/int8 columns (name, depth, error), NVML process lists an int8
    # one: the missing marker does not fit them, and a damaged chunk once raised
    # OverflowError into the replay instead of showing what can be read.
    from gpuwatch.store.player import open_replay

    path = tmp_path / "narrow.gpuwatch"
    path.write_bytes((ROOT / "samples" / "gpt2-small-h100.gpuwatch").read_bytes())
    with sqlite3.connect(path) as db:
        sid, row0, blob = db.execute(
            "SELECT c.series, c.row0, c.data FROM chunks c JOIN series s ON s.id = c.series"
            " WHERE s.kind = ? LIMIT 1",
            (kind,),
        ).fetchone()
        bad = bytearray(blob)
        bad[len(bad) // 2] ^= 0xFF
        db.execute(
            "UPDATE chunks SET data = ? WHERE series = ? AND row0 = ?", (bytes(bad), sid, row0)
        )
    player = open_replay(path)
    try:
        s = player.session
        tables = [p.phases for p in s.processes.values()] if kind == "phases" else []
        tables += list(s.gpu_procs.values()) if kind == "gpu_procs" else []
        for table in tables:
            cols = table.snapshot()
            assert len(next(iter(cols.values()))) == len(table)
        assert any("damaged" in n for n in s.notes)
    finally:
        player.close()


def test_every_command_gives_exit_2_and_one_line(tmp_path: Path, sub_env: dict[str, str]) -> None:
    cases = {kind: make(tmp_path / f"{kind}.gpuwatch") for kind, (make, _) in BAD.items()}
    cases["damaged-chunk"] = _damaged_chunk(tmp_path / "chunk.gpuwatch")
    # replay as a child (it would take this terminal), all at once; info and export here.
    procs = {}
    for kind, path in cases.items():
        if kind != "damaged-chunk":  # replay shows the sound part (tested above)
            procs[kind, "replay"] = subprocess.Popen(
                [sys.executable, "-m", "gpuwatch", "replay", str(path)], env=sub_env, cwd=ROOT,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
            )  # fmt: skip
    results = {
        (kind, command): run_cli(command, str(path), *extra)
        for kind, path in cases.items()
        for command, extra in (("info", ()), ("export", ("--out", str(tmp_path / "out"))))
    }
    for key, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        results[key] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    for (kind, command), r in results.items():
        lines = r.stderr.splitlines()
        assert r.returncode == 2, (kind, command, r.stderr)
        assert len(lines) == 1 and lines[0].startswith("gpuwatch: "), (kind, command, r.stderr)
        assert "Traceback" not in r.stderr and r.stdout == ""


def _pages_in_wal(path: Path) -> Path:
    """A recording whose writer died before any checkpoint: its pages sit in the -wal.

    The main file's header says more pages than the file holds (as after a checkpoint that
    a full disk cut short): every page SQLite needs is in the -wal, which it reads first.
    """
    code = (
        "import os, sys\n"
        f"sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests' / 'support')!r}]\n"
        "from store_data import populated_session\n"
        "from gpuwatch.store.writer import SessionWriter\n"
        f"w = SessionWriter({str(path)!r}, populated_session(60))\n"
        "w._db.execute('PRAGMA wal_autocheckpoint=0')\n"
        "w.sync(final=True)\n"
        "os._exit(0)\n"  # killed: no checkpoint, no close
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    Path(str(path) + "-shm").unlink(missing_ok=True)
    data = bytearray(path.read_bytes())
    data[28:32] = (72).to_bytes(4, "big")  # the header's page count, counters still agree
    path.write_bytes(bytes(data))
    return path


def test_a_file_whose_pages_sit_in_its_wal_opens(tmp_path: Path) -> None:
    path = _pages_in_wal(tmp_path / "wal.gpuwatch")
    assert path.stat().st_size < 72 * 8192 and Path(str(path) + "-wal").stat().st_size > 0
    rec = open_recording(path)
    assert not rec.complete
    rec.close()
    session = load(path)
    assert len(session.processes) == 2 and len(session.host) > 0
    result = run_gpuwatch("info", str(path))
    assert result.returncode == 0, result.stderr
    assert "incomplete" in result.stdout


def test_the_same_header_without_its_wal_is_truncated(tmp_path: Path) -> None:
    path = _pages_in_wal(tmp_path / "wal.gpuwatch")
    Path(str(path) + "-wal").unlink()
    with pytest.raises(RecordingError, match=r"truncated|no tables"):
        open_recording(path)
