"""The sessions directory's size cap: oldest finished recordings go, nothing else ever does."""

from __future__ import annotations

import argparse
import os
import sqlite3
from pathlib import Path

import pytest
import synthetic
from conftest import ROOT, run_gpuwatch

from gpuwatch.cli import CliError, build_parser
from gpuwatch.cli.live import configure_recording
from gpuwatch.session import Session
from gpuwatch.store import save_session
from gpuwatch.store.sessions import DEFAULT_CAP, parse_cap, prune, removable, sessions_dir
from gpuwatch.store.writer import SessionWriter


@pytest.mark.parametrize(
    ("text", "size"),
    [("0", 0), ("500M", 500 << 20), ("2G", 2 << 30), ("1.5GiB", 3 << 29), ("64k", 64 << 10)],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_cap(text) == size


def test_parse_size_none_and_garbage() -> None:
    assert parse_cap("none") is None
    with pytest.raises(ValueError):
        parse_cap("lots")


def _age(path: Path, days_ago: float) -> None:
    t = 1_700_000_000 - days_ago * 86400
    os.utime(path, (t, t))


@pytest.fixture
def sessions(tmp_path: Path):
    """A sessions directory: three finished recordings (oldest first), and things to keep."""
    d = tmp_path / "sessions"
    d.mkdir()
    made = {}
    for i, name in enumerate(("20260101-000000-a", "20260102-000000-a", "20260103-000000-a")):
        made[name] = save_session(synthetic.build(), d / f"{name}.gpuwatch")
        _age(made[name], 30 - i)
    # Oldest of all, but someone else's SQLite database under a session's name.
    foreign = d / "20251201-000000-a.gpuwatch"
    sqlite3.connect(foreign).execute("CREATE TABLE t (x)").connection.close()
    foreign.write_bytes(foreign.read_bytes() + b"\0" * 200_000)
    _age(foreign, 90)
    # Old too, and not a session's name at all.
    notes = d / "notes.txt"
    notes.write_bytes(b"x" * 300_000)
    _age(notes, 90)
    # Unfinished, and its writer (this process) is alive: being written right now.
    live_session = Session()
    live = SessionWriter(d / "20251215-000000-a.gpuwatch", live_session)
    live.sync()
    _age(live.path, 60)
    yield d, made, foreign, notes, live.path
    live.close()


def test_prune_removes_oldest_finished_recordings_only(sessions) -> None:
    d, made, foreign, notes, live = sessions
    sizes = {name: path.stat().st_size for name, path in made.items()}
    assert removable(made["20260101-000000-a"])
    assert not removable(foreign) and not removable(live)
    # Recordings with their -wal and -shm files (the live one has them): all but notes.txt.
    everything = sum(p.stat().st_size for p in d.iterdir() if p != notes)
    # Room for all but about one recording: exactly the oldest finished one goes.
    cap = everything - sizes["20260101-000000-a"] // 2
    result = prune(d, cap)
    assert result.removed == [made["20260101-000000-a"]]
    assert result.freed == sizes["20260101-000000-a"]
    assert foreign.exists() and notes.exists() and live.exists()
    assert made["20260102-000000-a"].exists() and made["20260103-000000-a"].exists()
    assert result.kept_busy == 2  # the foreign file and the live one were passed over
    # A cap of 0 takes every finished recording, and still nothing else.
    result = prune(d, 0)
    assert sorted(result.removed) == [made["20260102-000000-a"], made["20260103-000000-a"]]
    assert sorted(p.name for p in d.iterdir() if not p.name.endswith(("-wal", "-shm"))) == sorted(
        [foreign.name, notes.name, live.name]
    )


def test_prune_under_the_cap_touches_nothing(sessions) -> None:
    d, *_ = sessions
    before = sorted(p.name for p in d.iterdir())
    assert prune(d, DEFAULT_CAP).removed == []
    assert sorted(p.name for p in d.iterdir()) == before


def test_prune_keeps_the_file_about_to_be_written(sessions) -> None:
    d, made, *_ = sessions
    oldest = made["20260101-000000-a"]
    result = prune(d, 0, keep=oldest)
    assert oldest.exists() and oldest not in result.removed


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


class _Sources:
    """What configure_recording needs of LiveSources."""

    def __init__(self) -> None:
        self.session = Session()
        self.target: Path | None = None

    def record_to(self, path, **kw) -> None:
        self.target = Path(path)


def test_a_new_default_session_trims_the_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("GPUWATCH_SESSIONS_MAX", raising=False)
    d = sessions_dir()
    assert d.is_relative_to(tmp_path)
    d.mkdir(parents=True)
    old = [save_session(synthetic.build(), d / f"2026010{i}-000000-h.gpuwatch") for i in (1, 2)]
    for i, path in enumerate(old):
        _age(path, 10 - i)
    size = old[0].stat().st_size
    sources = _Sources()
    configure_recording(sources, _args("--sessions-max", str(size + size // 2)))
    assert not old[0].exists() and old[1].exists()
    assert sources.target is not None and sources.target.parent == d
    assert any("removed the 1 oldest" in n for n in sources.session.notes)
    # The environment variable is the default; the option wins over it; none turns it off.
    monkeypatch.setenv("GPUWATCH_SESSIONS_MAX", "0")
    configure_recording(_Sources(), _args("--sessions-max", "none"))
    assert old[1].exists()
    configure_recording(_Sources(), _args())
    assert not old[1].exists()
    monkeypatch.setenv("GPUWATCH_SESSIONS_MAX", "lots")
    with pytest.raises(CliError, match="GPUWATCH_SESSIONS_MAX"):
        configure_recording(_Sources(), _args())
    # An explicit --record PATH never trims the sessions directory.
    monkeypatch.setenv("GPUWATCH_SESSIONS_MAX", "0")
    keep = save_session(synthetic.build(), d / "20260105-000000-h.gpuwatch")
    configure_recording(_Sources(), _args("--record", str(tmp_path / "x.gpuwatch")))
    assert keep.exists()


def test_bad_sessions_max_is_one_line_and_exit_2() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = run_gpuwatch("--sessions-max", "lots", env=env)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1
    assert "not a size" in out.stderr
