"""Hostile recordings: one line, exit status 2, in bounded time and memory, never a hang.

Each file is built for real from a sound recording: a chunk that inflates to 4 GiB, a
recursive VIEW where gpuwatch keeps a table, a FIFO named like a recording, a chunk index
with negative or overlapping rows, a time origin of -10^20. Every command that reads a file
(``info``, ``export``, the merge of several, ``replay``) runs as the real CLI under a 3 GB
address-space cap, and must refuse it with one line on stderr.
"""

from __future__ import annotations

import os
import resource
import sqlite3
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ROOT
from store_data import populated_session

from gpuwatch.store import save_session

CAP = 3 << 30
"""Address space each command may use: the 4 GiB chunk must not be inflated."""

WAIT = 30.0
"""Seconds one command may take (each takes about one; a hang never ends)."""

AT_ONCE = 4
"""Commands run at once (the machine is shared: each may use up to :data:`CAP`)."""

BOMB = 4 << 30
"""Bytes the hostile chunk inflates to."""


def zeros_stream(size: int) -> bytes:
    """A zlib stream of ``size`` zero bytes, written bit by bit in milliseconds (zlib
    itself takes half a minute for 4 GiB).

    One fixed-Huffman block: a literal 0, then copies of 258 bytes at distance 1, 13 bits
    each; eight of them are 13 whole bytes, repeated.
    """
    k = -(-(size - 1) // 258)
    k += (1 - k) % 8  # eight copies are whole bytes once one has aligned the first
    bits: list[int] = []

    def put(code: int, count: int) -> None:  # Huffman codes go most significant bit first
        bits.extend((code >> i) & 1 for i in reversed(range(count)))

    def take() -> bytes:
        assert len(bits) % 8 == 0 or len(bits) < 8 * 13
        out = bytes(
            sum(bit << j for j, bit in enumerate(bits[i : i + 8])) for i in range(0, len(bits), 8)
        )
        bits.clear()
        return out

    bits.extend((1, 1, 0))  # the final block, fixed Huffman codes
    put(0x30, 8)  # the literal 0
    put(0b11000101, 8)  # length 258 ...
    put(0, 5)  # ... at distance 1
    head = take()
    for _ in range(8):
        put(0b11000101, 8)
        put(0, 5)
    pattern = take()
    put(0, 7)  # end of block
    tail = take()
    total = 1 + 258 * k
    adler = ((total % 65521) << 16) | 1  # of zeros: a stays 1, b counts the bytes
    return b"\x78\x01" + head + pattern * ((k - 1) // 8) + tail + adler.to_bytes(4, "big")


def _good(path: Path) -> Path:
    return save_session(populated_session(3), path)


def _bomb(path: Path) -> Path:
    """A GPU chunk whose one block inflates to 4 GiB (its index says a few KB)."""
    _good(path)
    stream = zeros_stream(BOMB)
    with sqlite3.connect(path) as db:
        rowid, n, first = db.execute(
            "SELECT c.rowid, c.n, c.t_first FROM chunks c JOIN series s ON s.id = c.series"
            " WHERE s.kind = 'gpu' ORDER BY c.n DESC LIMIT 1"
        ).fetchone()
        blob = struct.pack("<I", 1) + struct.pack("<IIq", n, len(stream), first) + stream
        db.execute("UPDATE chunks SET data = ? WHERE rowid = ?", (blob, rowid))
    db.close()
    return path


_RECURSIVE = (
    "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT {} FROM r WHERE x < 0"
)


def _view(name: str, columns: str) -> Callable[[Path], Path]:
    """gpuwatch's table ``name`` replaced by a VIEW that never returns."""

    def make(path: Path) -> Path:
        _good(path)
        with sqlite3.connect(path) as db:
            db.execute(f"DROP TABLE {name}")
            db.execute(f"CREATE VIEW {name} AS " + _RECURSIVE.format(columns))
        db.close()
        return path

    return make


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _index(change: str) -> Callable[[Path], Path]:
    """A chunk index edited by ``change`` (no memo: a file whose writer was killed)."""

    def make(path: Path) -> Path:
        _good(path)
        with sqlite3.connect(path) as db:
            db.execute("DROP TABLE index_memo")
            db.execute("UPDATE meta SET value = '0' WHERE key = 'complete'")
            db.execute(change)
        db.close()
        return path

    return make


_HOST = "(SELECT id FROM series WHERE kind = 'host')"

HOSTILE: dict[str, Callable[[Path], Path]] = {
    "chunk inflating to 4 GiB": _bomb,
    "recursive view index_memo": _view("index_memo", "x, x, x, x"),
    "recursive view summaries": _view("summaries", "x, x, x, x"),
    "fifo": _fifo,
    "negative chunk rows": _index(f"UPDATE chunks SET row0 = row0 - 1000 WHERE series = {_HOST}"),
    "overlapping chunk rows": _index(
        "INSERT INTO chunks SELECT series, row0 + 1, n, t_first, t_last, vmax, t_vmax, codec,"
        f" data FROM chunks WHERE series = {_HOST}"
    ),
    "time origin -1e20": lambda path: _meta(path, "t_origin", "-100000000000000000000"),
    "created 1e30": lambda path: _meta(path, "created_wall_ns", "1" + "0" * 30),
}


def _meta(path: Path, key: str, value: str) -> Path:
    _good(path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = ? WHERE key = ?", (value, key))
    db.close()
    return path


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile")
    return {name: make(root / f"{i}-x.gpuwatch") for i, (name, make) in enumerate(HOSTILE.items())}


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _good(tmp_path_factory.mktemp("good") / "good.gpuwatch")


def _commands(path: Path, good: Path, out: Path) -> dict[str, list[str]]:
    return {
        "info": ["info", str(path)],
        "export": ["export", str(path), "--out", str(out / "one")],
        "merged info": ["info", str(good), str(path)],
        "merged export": ["export", str(good), str(path), "--out", str(out / "merged")],
        "merged replay": ["replay", str(good), str(path)],
        "replay": ["replay", str(path)],
    }


def _run_capped(argvs: dict[str, list[str]], env: dict[str, str]) -> list[str]:
    """Run each command line under the cap, a few at a time; what went wrong with each."""
    failures = []
    waiting = list(argvs.items())
    running: list[tuple[str, subprocess.Popen[str], float]] = []
    while waiting or running:
        while waiting and len(running) < AT_ONCE:
            what, argv = waiting.pop(0)
            proc = subprocess.Popen(
                argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, preexec_fn=_capped,
            )  # fmt: skip
            running.append((what, proc, time.monotonic() + WAIT))
        what, proc, deadline = running.pop(0)
        try:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            failures.append(f"{what}: still running after {WAIT:.0f} s")
            continue
        lines = err.splitlines()
        if proc.returncode != 2 or len(lines) != 1 or not lines[0].startswith("gpuwatch: "):
            failures.append(f"{what}: exit {proc.returncode}, stderr {err[-300:]!r}")
        elif "Traceback" in err or out:
            failures.append(f"{what}: printed {out[-300:]!r}")
    return failures


def test_every_command_refuses_each_hostile_file(
    hostile: dict[str, Path], good: Path, tmp_path: Path, sub_env: dict[str, str]
) -> None:
    argvs = {}
    for case, path in hostile.items():
        for command, args in _commands(path, good, tmp_path / case.replace(" ", "-")).items():
            if case == "chunk inflating to 4 GiB" and command == "replay":
                continue  # replay shows the sound part of a damaged file (tested below)
            argvs[f"{case} / {command}"] = [sys.executable, "-m", "gpuwatch", *args]
    failures = _run_capped(argvs, sub_env)
    assert not failures, "\n".join(failures)


_REPLAY_ALL = """
import sys
from gpuwatch.store.player import open_replay
player = open_replay(sys.argv[1])
s = player.session
tables = [t for _, _, t in s.tables()]
for table in tables:
    table.snapshot()
player.close()
print(any("damaged" in n for n in s.notes), len(tables))
"""


def test_replay_reads_around_a_chunk_that_inflates_too_far(
    hostile: dict[str, Path], sub_env: dict[str, str]
) -> None:
    """Replay shows what can be read of a damaged file: every table read whole, in bounded
    memory, the chunk that inflates too far noted as damaged."""
    result = subprocess.run(
        [sys.executable, "-c", _REPLAY_ALL, str(hostile["chunk inflating to 4 GiB"])],
        env=sub_env, cwd=ROOT, capture_output=True, text=True, timeout=WAIT,
        preexec_fn=_capped,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    damaged, tables = result.stdout.split()
    assert damaged == "True" and int(tables) > 5


def test_every_query_of_a_recording_has_a_time_limit(
    good: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backstop behind the checks: whatever a file makes SQLite do, a statement that
    runs past the limit stops with one line."""
    from gpuwatch.store import RecordingError, _untrusted, open_recording
    from gpuwatch.store.archive import ChunkSource

    monkeypatch.setattr(_untrusted, "QUERY_SECONDS", 1.0)
    rec = open_recording(good)
    start = time.monotonic()
    try:
        with rec.reading() as db:  # honest: SQLite's work a row is short, ours is not counted
            rows = db.execute(
                "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r"
                " WHERE x < 100000) SELECT x FROM r WHERE x % 100 = 0"
            )
            for _ in rows:
                time.sleep(0.003)  # 1000 rows, 3 s in all: past the limit, but between rows
        with pytest.raises(RecordingError, match="damaged or hostile"), rec.reading() as db:
            db.execute(_RECURSIVE.format("x")).fetchall()
    finally:
        rec.close()
    notes: list[str] = []
    source = ChunkSource(good, on_error=notes.append)
    assert source.query(_RECURSIVE.format("x"), ()) == []
    source.close()
    assert len(notes) == 1 and "damaged or hostile" in notes[0]
    assert time.monotonic() - start < WAIT
