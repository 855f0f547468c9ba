"""``mv rec.gpuwatch renamed.gpuwatch`` while ``gpuwatch record`` writes it (issue 23,
item 4): the recording goes on in the renamed file, and every event lands there.

SQLite writes on into the renamed file, but its ``-wal`` stays at the old name: before,
the renamed file was 8 KB with "no tables" and gpuwatch said "file removed".
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, record_cmd, run_cli, wait_for

CHILD = """
import sys, time
import gpuwatch

for i in range(40):  # ~4 s: the rename comes in the middle
    with gpuwatch.phase("forward"):
        gpuwatch.mark(f"step {i}")
    time.sleep(0.1)
open(sys.argv[1], "w").write("done")
"""


def _marks_recorded(path: Path) -> int:
    """How many marks the recording being written at ``path`` has committed."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            return db.execute("SELECT count(*) FROM events WHERE kind = 'mark'").fetchone()[0]
    except sqlite3.Error:  # not yet a recording
        return 0


def test_renaming_the_recording_while_it_is_written_loses_nothing(
    tmp_path: Path, sock_path: str
) -> None:
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    out, renamed = tmp_path / "rec.gpuwatch", tmp_path / "renamed.gpuwatch"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GPUWATCH_SOCKET", None)
    proc = subprocess.Popen(
        [
            *record_cmd(str(out), sock_path),
            "--", sys.executable, str(child), str(tmp_path / "finished"),
        ],
        env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_for(lambda: Path(f"{out}-wal").exists(), 60)
        assert wait_for(lambda: _marks_recorded(out) >= 5, 60)  # committed, in the -wal
        os.rename(out, renamed)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert (tmp_path / "finished").exists()
    told = [line for line in err.splitlines() if "was renamed" in line]
    assert len(told) == 1 and str(renamed) in told[0], err
    assert "file removed" not in err and "Traceback" not in err
    assert str(renamed) in err.splitlines()[-2]  # the last status line names it
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith("rec.gpuwatch")]
    assert leftovers == []  # nothing left at the old name: no -wal, no -shm
    result = run_cli("info", "--json", str(renamed))
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["complete"] is True
    assert info["marks"] == 40, info  # each one the child sent, before and after the move
    (process,) = info["processes"]
    assert process["phases"] == {"forward": 40}
    assert any("was renamed" in note for note in info["notes"])


def test_rows_let_go_are_read_back_from_the_renamed_file(tmp_path: Path) -> None:
    """A recorded session keeps few rows in memory and reads the rest from its file: after
    a rename it reads them from the file's new name."""
    from gpuwatch.session import Session
    from gpuwatch.store import Recorder

    session = Session()
    session.bound(rows=1000)
    session.ensure_host("testhost", 1 << 34)
    recorder = Recorder(session, tmp_path / "rec.gpuwatch", interval=0.05)
    recorder.start()
    t0 = session.t_origin

    def add(i0: int, i1: int) -> None:
        for i in range(i0, i1):
            session.add_host_sample({"t": t0 + i * 10**6, "total": 1 << 34, "used": i})

    try:
        add(0, 20_000)
        assert recorder.flush()
        os.rename(tmp_path / "rec.gpuwatch", tmp_path / "renamed.gpuwatch")
        add(20_000, 40_000)
        assert recorder.flush() and recorder.flush()
        assert recorder.error is None and recorder.path == tmp_path / "renamed.gpuwatch"
        assert session.host.in_memory < 20_000  # the rows before the rename: in the file
        used = session.host.rows(0, len(session.host), ["used"])["used"]
        assert used.tolist() == list(range(40_000))  # the first rows come from the file
        assert not [n for n in session.notes if "cannot be read" in n or "damaged" in n]
    finally:
        recorder.close()
    assert not (tmp_path / "rec.gpuwatch-wal").exists()
    assert run_cli("info", str(tmp_path / "renamed.gpuwatch")).returncode == 0
