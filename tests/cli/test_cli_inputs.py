"""Inputs a user (or a shell) can give that must end in one line and the right status.

File names that are not UTF-8, durations that are not numbers, outputs that cannot be
written, commands that do not exist, and a recording that another gpuwatch is writing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, record_cmd, run_gpuwatch, wait_for

from gpuwatch.store import RecordingError, open_recording

SAMPLE = ROOT / "samples" / "gpt2-small-h100.gpuwatch"


@pytest.fixture
def latin1(tmp_path: Path) -> Path:
    """A copy of a sample under a name that is not UTF-8 (as a Latin-1 shell would make)."""
    path = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9.gpuwatch"))
    shutil.copy(SAMPLE, path)
    return path


def _one_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_info_and_export_open_a_file_named_in_latin1(latin1: Path, tmp_path: Path) -> None:
    info = run_gpuwatch("info", str(latin1))
    assert info.returncode == 0, info.stderr
    assert "caf\\xe9.gpuwatch" in info.stdout
    out = tmp_path / "exported"
    exported = run_gpuwatch("export", str(latin1), "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    assert (out / "phases.csv").exists()
    default = run_gpuwatch("export", str(latin1), cwd=tmp_path)
    assert default.returncode == 0, default.stderr
    assert "caf\\xe9" in default.stderr


async def test_replay_opens_a_file_named_in_latin1(latin1: Path) -> None:
    from gpuwatch.store.player import open_replay
    from gpuwatch.tui.replay import replay_app

    player = open_replay(latin1)
    try:
        app = replay_app(player, subtitle=f"replay {latin1.name}")
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            assert "caf\\xe9" in str(app.dashboard.status_bar.render())
    finally:
        player.close()


def test_a_missing_latin1_file_is_one_line(tmp_path: Path) -> None:
    missing = os.fsdecode(os.fsencode(str(tmp_path)) + b"/gon\xe9.gpuwatch")
    result = run_gpuwatch("info", missing)
    assert result.returncode == 2
    assert "gon\\xe9" in _one_line(result)


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "soon"])
def test_duration_must_be_a_positive_finite_number(value: str, tmp_path: Path) -> None:
    result = run_gpuwatch("record", "--out", str(tmp_path / "r.gpuwatch"), "--duration", value)
    assert result.returncode == 2
    assert "--duration" in _one_line(result)
    assert not (tmp_path / "r.gpuwatch").exists()


@pytest.mark.parametrize("where", ["a file", "a file's child"])
def test_export_to_a_path_that_cannot_be_a_directory_exits_2(tmp_path: Path, where: str) -> None:
    blocker = tmp_path / "passwd"
    blocker.write_text("root:x:0:0\n")
    out = blocker if where == "a file" else blocker / "sub"
    result = run_gpuwatch("export", str(SAMPLE), "--out", str(out))
    assert result.returncode == 2
    assert "cannot write" in _one_line(result)
    assert blocker.read_text() == "root:x:0:0\n"


def test_run_and_record_of_a_missing_command_exit_2(tmp_path: Path, sock_path: str) -> None:
    result = run_gpuwatch(
        "record",
        "--out",
        str(tmp_path / "r.gpuwatch"),
        "--socket",
        sock_path,
        "--",
        "/nonexistent/program",
    )
    assert result.returncode == 2
    assert "cannot run /nonexistent/program" in result.stderr


def _writer_pid(path: Path) -> int | None:
    """The recording's writer pid, or None while the file is still being created."""
    try:
        rec = open_recording(path)
    except RecordingError:
        return None
    try:
        return int(rec.meta.get("writer_pid", 0))
    finally:
        rec.close()


def test_force_does_not_overwrite_a_recording_being_written(tmp_path: Path, sock_dir: Path) -> None:
    out = tmp_path / "r.gpuwatch"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(
        [
            *record_cmd(str(out), str(sock_dir / "a.sock")),
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(lambda: _writer_pid(out) == first.pid)
        second = run_gpuwatch(
            "record",
            "--force",
            "--out",
            str(out),
            "--duration",
            "1",
            "--socket",
            str(sock_dir / "b.sock"),
        )
        assert second.returncode == 2
        assert f"pid {first.pid}" in _one_line(second)
        # The first one's next commits still land in its file (its -wal changes).
        wal = Path(f"{out}-wal")
        before = wal.stat().st_mtime_ns, wal.stat().st_size
        assert wait_for(lambda: (wal.stat().st_mtime_ns, wal.stat().st_size) != before)
    finally:
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=30)
    assert first.returncode == 0, err
    rec = open_recording(out)
    assert rec.complete and int(rec.meta["writer_pid"]) == first.pid
    rec.close()


def test_a_replaced_recording_stops_its_writer_with_a_reason(tmp_path: Path) -> None:
    # The file removed (or replaced) under a running recorder: SQLite would write on into
    # the unlinked inode and lose every row without a word.
    import synthetic

    from gpuwatch.store import Recorder

    session = synthetic.build()
    recorder = Recorder(session, tmp_path / "r.gpuwatch", interval=0.05)
    recorder.start()
    assert recorder.flush()
    os.unlink(recorder.path)
    assert wait_for(lambda: recorder.error is not None)
    assert "file removed" in recorder.error
    recorder.close()
