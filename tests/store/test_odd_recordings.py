"""Recordings the format admits open everywhere: null, empty, missing and odd values.

Each case edits a sound recording the way an older gpuwatch, another client or a hand
could have written it: JSON bodies with nulls, empty lists and missing keys, events at
the ends of the clock (old files predate the receiver's ranges), a process without a
hello. ``info`` (text and JSON), ``export``, a full load and the replay dashboard must all
take each one: a recording is shown as it is, never a traceback.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import run_cli
from store_data import T0, populated_session

from gpuwatch.store import load, save_session
from gpuwatch.store.player import open_replay
from gpuwatch.tui.replay import replay_app

Edit = Callable[[sqlite3.Connection], None]


def _bodies(db: sqlite3.Connection, table: str, key: str, change: Callable[[dict], dict]) -> None:
    for k, body in db.execute(f"SELECT {key}, body FROM {table}").fetchall():
        db.execute(
            f"UPDATE {table} SET body = ? WHERE {key} = ?",
            (json.dumps(change(json.loads(body))), k),
        )


def _events(kind: str, change: Callable[[dict], dict]) -> Edit:
    def edit(db: sqlite3.Connection) -> None:
        for seq, body in db.execute("SELECT seq, body FROM events WHERE kind = ?", (kind,)):
            db.execute(
                "UPDATE events SET body = ? WHERE seq = ?",
                (json.dumps(change(json.loads(body))), seq),
            )

    return edit


def _processes(change: Callable[[dict], dict]) -> Edit:
    return lambda db: _bodies(db, "processes", "pid", change)


def _devices(change: Callable[[dict], dict]) -> Edit:
    return lambda db: _bodies(db, "devices", "key", change)


def _hello(change: Callable[[dict], dict]) -> Callable[[dict], dict]:
    return lambda p: {**p, "hello": change(dict(p.get("hello") or {}))}


def _insert_event(t: int, kind: str, pid: int | None, body: dict) -> Edit:
    def edit(db: sqlite3.Connection) -> None:
        db.execute(
            "INSERT INTO events (t, kind, pid, body) VALUES (?, ?, ?, ?)",
            (t, kind, pid, json.dumps(body)),
        )

    return edit


CASES: dict[str, Edit] = {
    "oom all null": _events("oom", lambda b: dict.fromkeys(b)),
    "oom empty": _events("oom", lambda b: {}),
    "oom message empty": _events("oom", lambda b: {**b, "message": ""}),
    "oom message blank lines": _events("oom", lambda b: {**b, "message": "\n \n"}),
    "mark text empty, no level": _events("mark", lambda b: {"text": ""}),
    "mark step null, odd level": _events("mark", lambda b: {**b, "level": "fatal", "step": None}),
    "argv empty": _processes(_hello(lambda h: {**h, "argv": []})),
    "argv null": _processes(_hello(lambda h: {**h, "argv": None})),
    "hello empty": _processes(lambda p: {**p, "hello": {}}),
    "hello null": _processes(lambda p: {**p, "hello": None}),
    "rank and world null": _processes(_hello(lambda h: {**h, "rank": None, "world_size": None})),
    "rank without world": _processes(_hello(lambda h: {**h, "rank": 3, "world_size": None})),
    "process body empty": _processes(lambda p: {}),
    "process devices null": _processes(lambda p: {**p, "devices": None}),
    "facts null": _processes(lambda p: {**p, "facts": None}),
    "facts odd": _processes(lambda p: {**p, "facts": {"params": "many", "optimizer": []}}),
    "device name and total null": _devices(lambda d: {**d, "name": None, "total": None}),
    "device index null": _devices(lambda d: {**d, "index": None, "uuid": None}),
    "device minimal": _devices(lambda d: {"key": d["key"], "kind": d["kind"]}),
    "proc_info empty": lambda db: _bodies(db, "proc_info", "pid", lambda b: {}),
    "proc_info cmdline list": lambda db: _bodies(
        db, "proc_info", "pid", lambda b: {**b, "cmdline": ["python", "x.py"], "user": None}
    ),
    "event pid null": lambda db: db.execute("UPDATE events SET pid = NULL WHERE kind = 'mark'"),
    "mark at the boot": _insert_event(0, "mark", 4242, {"text": "t=0", "level": "info"}),
    "mark at the end of time": _insert_event(2**63 - 1, "mark", 4242, {"text": "late"}),
    "oom at the boot": _insert_event(1, "oom", 4242, {"message": None}),
    "note without text": _insert_event(T0, "note", None, {}),
    "event of a pid with no process": _insert_event(T0, "mark", 77, {"text": "who?"}),
    "meta without label, host, created": lambda db: db.execute(
        "DELETE FROM meta WHERE key IN ('label', 'host', 'created_wall_ns', 'sampler_rate')"
    ),
    "meta created empty": lambda db: db.execute(
        "UPDATE meta SET value = '' WHERE key = 'created_wall_ns'"
    ),
    "open span minimal": lambda db: _bodies(
        db, "open_spans", "pid", lambda b: {"id": b["id"], "name": b["name"], "t0": b["t0"]}
    ),
    "no processes at all": lambda db: db.execute("DELETE FROM processes"),
}


@pytest.fixture(scope="module")
def odd_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("odd")
    files = {}
    for i, (name, edit) in enumerate(CASES.items()):
        path = save_session(populated_session(3), root / f"case{i}.gpuwatch")
        with sqlite3.connect(path) as db:
            edit(db)
        db.close()
        files[name] = path
    return files


@pytest.mark.parametrize("case", sorted(CASES))
def test_info_export_and_load_take_it(case: str, odd_files: dict[str, Path], tmp_path) -> None:
    path = odd_files[case]
    session = load(path)
    lo, hi = session.time_range()
    assert hi - lo < 3600 * 10**9  # no axis stretched over the clock's ends
    for args in (("info", str(path)), ("info", "--json", str(path))):
        result = run_cli(*args)
        assert result.returncode == 0, (case, result.stderr)
        assert "Traceback" not in result.stderr
    info = json.loads(result.stdout)
    assert info["duration_s"] < 3600
    result = run_cli("export", str(path), "--out", str(tmp_path / "x"))
    assert result.returncode == 0, (case, result.stderr)


@pytest.mark.parametrize("case", sorted(CASES))
async def test_replay_shows_it(case: str, odd_files: dict[str, Path]) -> None:
    player = open_replay(odd_files[case])
    try:
        app = replay_app(player, subtitle=case)
        # Pilot waits out each animation after a key: the tab bar's sliding underline took
        # most of each case. The tabs are composed and drawn just the same without it.
        app.animation_level = "none"
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            await pilot.press("s", "m", "o", "2", "3", "1", "end")  # each handled in turn
            await pilot.pause()
            assert app.return_code is None  # still running: nothing raised
            lo, hi = player.bounds()
            assert hi - lo < 3600 * 10**9
    finally:
        player.close()
