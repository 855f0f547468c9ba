"""The recording format: chunk codec, writing and loading real SQLite files, following one."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest
from conftest import in_threads
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from store_data import MS, T0, Script, add_gpu, assert_sessions_equal, gpu_row, populated_session

from gpuwatch.session import MISSING_INT, Session
from gpuwatch.store import Recorder, SessionWriter, load, open_recording, open_session, save_session
from gpuwatch.store._codec import (
    CODEC,
    CODECS,
    STREAM,
    ChunkError,
    Inflater,
    check,
    cut,
    decode,
    encode,
    summary,
)
from gpuwatch.store._schema import layout_dtypes

# --------------------------------------------------------------------------- codec

LAYOUT = [
    ("t", np.dtype("i8")),
    ("a", np.dtype("i4")),
    ("b", np.dtype("i1")),
    ("f", np.dtype("f4")),
]


@settings(max_examples=60, deadline=None)
@given(
    t=hnp.arrays(np.int64, st.integers(1, 300)),
    data=st.data(),
)
def test_codec_round_trips_any_values(t: np.ndarray, data: st.DataObject) -> None:
    n = len(t)
    cols = {
        "t": t,
        "a": data.draw(hnp.arrays(np.int32, n)),
        "b": data.draw(hnp.arrays(np.int8, n)),
        "f": data.draw(hnp.arrays(np.float32, n)),  # NaN and infinities included
    }
    start = data.draw(st.integers(0, n - 1))
    codec = data.draw(st.sampled_from(CODECS))
    blob = encode(cols, LAYOUT, start, n, codec=codec, block_rows=data.draw(st.integers(1, 64)))
    out = decode(blob, n - start, LAYOUT, codec)
    for name, dtype in LAYOUT:
        # Bitwise: NaN payloads and the missing-int marker come back exactly.
        assert out[name].dtype == dtype
        assert out[name].tobytes() == cols[name][start:].astype(dtype).tobytes(), name


def test_codec_rejects_damage() -> None:
    cols = {"t": np.arange(50, dtype=np.int64), "a": np.zeros(50, np.int32)}
    cols |= {"b": np.zeros(50, np.int8), "f": np.zeros(50, np.float32)}
    blob = encode(cols, LAYOUT, 0, 50)
    with pytest.raises(ChunkError):
        decode(blob, 51, LAYOUT)  # the index promises more rows than the blob holds
    bad = bytearray(blob)
    bad[len(bad) // 2] ^= 0xFF
    with pytest.raises(ChunkError):
        decode(bytes(bad), 50, LAYOUT)
    with pytest.raises(ChunkError):
        decode(blob, 50, LAYOUT, codec=99)


@settings(max_examples=60, deadline=None)
@given(
    t=hnp.arrays(np.int64, st.integers(1, 300), elements=st.integers(-50, 50)),
    data=st.data(),
)
def test_blocks_give_any_rows_and_search_like_the_whole_column(
    t: np.ndarray, data: st.DataObject
) -> None:
    """A reader asks a chunk for a few rows (the cursor's) or searches its times: the
    blocks it inflates answer exactly as the whole chunk would, equal times straddling a
    block boundary included."""
    t = np.sort(t)
    n = len(t)
    cols = {"t": t, "a": np.arange(n, dtype=np.int32), "b": np.zeros(n, np.int8)}
    cols["f"] = np.linspace(0, 1, n, dtype=np.float32)
    codec = data.draw(st.sampled_from(CODECS))
    blob = encode(cols, LAYOUT, 0, n, codec=codec, block_rows=data.draw(st.integers(1, 40)))
    check(blob, n, LAYOUT, codec)
    inflater = Inflater(blob, n, LAYOUT, codec)
    for _ in range(4):
        lo = data.draw(st.integers(0, n))
        hi = data.draw(st.integers(lo, n))
        upto = data.draw(st.integers(1, len(LAYOUT)))
        got = inflater.columns(upto, lo, hi)
        for name, _ in LAYOUT[:upto]:
            assert got[name].tobytes() == cols[name][lo:hi].tobytes(), (name, lo, hi)
    for _ in range(8):
        x = data.draw(st.integers(-52, 52))
        side = data.draw(st.sampled_from(["left", "right"]))
        lo = data.draw(st.integers(0, n))
        hi = data.draw(st.integers(lo, n))
        expected = min(max(int(np.searchsorted(t, x, side)), lo), hi)
        assert inflater.search(x, side, lo, hi) == expected, (x, side, lo, hi)


def test_a_cursor_read_inflates_one_block() -> None:
    n = 8192
    cols = {"t": np.arange(n, dtype=np.int64) * 100, "a": np.arange(n, dtype=np.int32)}
    cols |= {"b": np.zeros(n, np.int8), "f": np.zeros(n, np.float32)}
    inflater = Inflater(encode(cols, LAYOUT, 0, n, block_rows=512), n, LAYOUT)
    i = inflater.search(5000 * 100 + 1, "right") - 1
    assert i == 5000 and inflater.inflated == 512
    assert inflater.columns(4, i, i + 1)["a"].tolist() == [5000]
    assert inflater.inflated == 512  # the same block: nothing more inflated
    assert inflater.columns(1, 600, 700)["t"][0] == 60_000 and inflater.inflated == 1024
    assert inflater.columns(1, 1000, 1100)["t"][-1] == 109_900 and inflater.inflated == 1536
    # One stream (a schema-1 file): the whole chunk's rows, as before.
    old = Inflater(encode(cols, LAYOUT, 0, n, codec=STREAM), n, LAYOUT, STREAM)
    assert old.search(5000 * 100 + 1, "right") - 1 == 5000 and old.inflated == n


def test_a_damaged_block_table_is_a_chunk_error() -> None:
    n = 100
    cols = {"t": np.arange(n, dtype=np.int64), "a": np.zeros(n, np.int32)}
    cols |= {"b": np.zeros(n, np.int8), "f": np.zeros(n, np.float32)}
    blob = encode(cols, LAYOUT, 0, n, block_rows=30)  # 4 blocks
    assert int.from_bytes(blob[:4], "little") == 4
    damaged = {
        "no table": blob[:2],
        "too many blocks": (10**6).to_bytes(4, "little") + blob[4:],
        "no blocks": (0).to_bytes(4, "little") + blob[4:],
        "truncated": blob[:-1],
        "one byte more": blob + b"\0",
    }
    for why, bad in damaged.items():
        with pytest.raises(ChunkError):
            Inflater(bad, n, LAYOUT, CODEC)
        with pytest.raises(ChunkError):
            check(bad, n, LAYOUT, CODEC)
        print(why, "refused")
    # A block's first time that is not what its table says (the table steers searches).
    bad = bytearray(blob)
    bad[4 + 16 + 8] ^= 0x01  # block 1's first time
    with pytest.raises(ChunkError):
        check(bytes(bad), n, LAYOUT, CODEC)
    with pytest.raises(ChunkError):
        Inflater(bytes(bad), n, LAYOUT, CODEC).columns(1, 30, 31)
    assert Inflater(bytes(bad), n, LAYOUT, CODEC).columns(4, 0, 30)["t"][-1] == 29


def test_cut_limits_rows_and_time() -> None:
    t = np.array([0, 1, 2, 3, 10, 11, 30, 31, 32, 33, 34, 35], dtype=np.int64)
    ends = cut(t, 0, len(t), rows=4, span=10)
    assert ends == [4, 6, 10, 12]
    starts = [0, *ends[:-1]]
    for a, b in zip(starts, ends, strict=True):
        assert b - a <= 4 and t[b - 1] - t[a] < 10
    assert cut(t, 12, 12, 4, 10) == []


def test_summary_skips_unknown_values() -> None:
    t = np.array([1, 2, 3, 4], dtype=np.int64)
    assert summary(t, np.array([5, MISSING_INT, 9, 9], np.int64)) == (9, 3)
    assert summary(t, np.array([MISSING_INT] * 4, np.int64)) == (None, None)
    assert summary(t, np.array([np.nan, 2.0, np.nan, 1.0], np.float32)) == (2, 2)


# --------------------------------------------------------------------------- round trips


def test_saved_session_loads_identical(tmp_path: Path) -> None:
    live = populated_session()
    path = save_session(live, tmp_path / "s.gpuwatch", label="test label")
    rec = open_recording(path)
    assert rec.label == "test label" and rec.complete
    rec.close()
    loaded = load(path)
    assert loaded.live is False
    assert_sessions_equal(live, loaded)


def test_save_refuses_to_overwrite(tmp_path: Path) -> None:
    path = save_session(populated_session(1), tmp_path / "s.gpuwatch")
    with pytest.raises(FileExistsError):
        save_session(populated_session(1), path)
    save_session(populated_session(2), path, overwrite=True)
    assert len(load(path).processes[4242].phases) == 2 * 4


def _grow(session: Session, script: Script, key: str, i: int) -> None:
    """Add one "second" of data: samples, RSS and one phase."""
    t = T0 + i * 100 * MS
    for k in range(10):
        session.add_gpu_sample(key, gpu_row(t + k * 10 * MS, (1 << 30) + i * k))
        session.add_host_sample({"t": t + k * 10 * MS, "total": 8, "used": i, "available": 1})
    script.send(
        "phase", t, event="begin", name=f"p{i % 3}", id=i, step=i, dev=0, allocated=i, reserved=i
    )
    script.send(
        "phase",
        t + 50 * MS,
        event="end",
        name=f"p{i % 3}",
        id=i,
        step=i,
        dev=0,
        allocated=i + 1,
        reserved=i,
        peak_allocated=i + 2,
    )
    session.add_rss(script.pid, t + 60 * MS, 1000 + i)
    if i % 4 == 0:
        script.send("mark", t + 70 * MS, text=f"mark {i}")


def _growing_session() -> tuple[Session, Script, str]:
    s = Session(t_origin=T0, wall_offset=0)
    s.ensure_host("h", 8)
    key = add_gpu(s, "GPU-abcd", 0)
    script = Script(s, 77)
    script.send(
        "hello", T0, argv=["x"], hostname="h", wall_ns=0, devices=[{"index": 0, "uuid": "abcd"}]
    )
    return s, script, key


def _chunk_sizes(path: Path) -> list[int]:
    with sqlite3.connect(path) as db:
        return [n for (n,) in db.execute("SELECT n FROM chunks")]


def test_incremental_writes_seal_chunks_and_load_identical(tmp_path: Path) -> None:
    s, script, key = _growing_session()
    path = tmp_path / "inc.gpuwatch"
    writer = SessionWriter(path, s, chunk_rows=16, chunk_span=10**18)
    for i in range(30):
        _grow(s, script, key, i)
        writer.sync()
        # Small chunks are merged into sealed ones of 16 rows as they fill up.
        if i == 20:
            sizes = _chunk_sizes(path)
            assert max(sizes) == 16 and min(sizes) < 16
    writer.close()
    assert max(_chunk_sizes(path)) <= 16
    assert_sessions_equal(s, load(path))


def test_follow_a_file_while_it_is_written(tmp_path: Path) -> None:
    s, script, key = _growing_session()
    path = tmp_path / "tail.gpuwatch"
    writer = SessionWriter(path, s, chunk_rows=16, chunk_span=10**18)
    _grow(s, script, key, 0)
    writer.sync()
    rec = open_recording(path)
    assert not rec.complete and rec.writer_alive()  # this process is its writer
    replay, loader = open_session(rec)
    loader.load_all(strict=True)
    assert len(replay.gpu[key]) == 10
    for i in range(1, 25):
        _grow(s, script, key, i)
        writer.sync()  # seals rows the reader already has into larger chunks
        if i % 5 == 0:
            assert loader.poll() > 0
            assert_sessions_equal(s, replay)
    writer.close()
    loader.poll()
    assert rec.complete
    assert_sessions_equal(s, replay)
    rec.close()


def test_recorder_commits_from_its_thread(tmp_path: Path) -> None:
    s, script, key = _growing_session()
    rec = Recorder(s, tmp_path / "r.gpuwatch", interval=60)  # commits only when asked
    rec.start()
    _grow(s, script, key, 0)
    script.send("facts", T0 + 1, facts={"params": 5})
    assert rec.flush()
    mid = load(rec.path)  # a second reader sees the committed data while it is written
    assert len(mid.gpu[key]) == 10 and mid.processes[77].facts == {"params": 5}
    _grow(s, script, key, 1)
    rec.close()
    assert rec.error is None and rec.cpu_seconds > 0
    assert_sessions_equal(s, load(rec.path))
    hellos = [e for e in open_recording(rec.path).events() if e["kind"] in ("hello", "facts")]
    assert [e["kind"] for e in hellos] == ["hello", "facts"]


def test_recorder_failure_becomes_a_note(tmp_path: Path) -> None:
    s, script, key = _growing_session()
    rec = Recorder(s, tmp_path / "r.gpuwatch", interval=60)
    rec.start()
    rec.writer._db.close()  # the file becomes unwritable under the recorder
    _grow(s, script, key, 0)
    rec.flush()
    assert rec.error is not None and "stopped" in rec.error
    assert any("stopped" in n for n in s.notes)
    rec.close()  # no exception


def test_file_with_unknown_columns_and_missing_ones_loads(tmp_path: Path) -> None:
    # A file from another version of schema 1: its host layout has an extra column and
    # lacks "available". The reader keeps what it knows and marks the rest unknown.
    live = populated_session(1)
    path = save_session(live, tmp_path / "v.gpuwatch")
    with sqlite3.connect(path) as db:
        (sid, cols) = db.execute("SELECT id, columns FROM series WHERE kind='host'").fetchone()
        layout = layout_dtypes(tuple(tuple(c) for c in __import__("json").loads(cols)))
        rows = db.execute("SELECT rowid, n, data FROM chunks WHERE series=?", (sid,)).fetchall()
        new_layout = [c for c in layout if c[0] != "available"] + [("extra", np.dtype("f4"))]
        for rowid, n, data in rows:
            old = decode(data, n, layout)
            old["extra"] = np.ones(n, np.float32)
            db.execute(
                "UPDATE chunks SET data=? WHERE rowid=?", (encode(old, new_layout, 0, n), rowid)
            )
        db.execute(
            "UPDATE series SET columns=? WHERE id=?",
            (__import__("json").dumps([[k, d.str] for k, d in new_layout]), sid),
        )
    host = load(path).host.snapshot()
    assert np.array_equal(host["used"], live.host.snapshot()["used"])
    assert (host["available"] == MISSING_INT).all()


def test_one_inflater_shared_by_threads_stays_whole() -> None:
    """A replay's view and the loader summarising an older file read one cached chunk at
    once: each thread asks for more columns while the other inflates (once, a sample's
    info failed with 'incorrect data check')."""
    from gpuwatch.store._codec import Inflater

    rng = np.random.default_rng(3)
    n = 4000
    layout = [(f"c{i}", np.dtype("i8")) for i in range(24)]
    cols = {name: rng.integers(0, 1 << 40, n) for name, _ in layout}
    blob = encode(cols, layout, 0, n)
    for _ in range(40):
        inflater = Inflater(blob, n, layout)

        def read(inflater: Inflater = inflater) -> None:
            for upto in range(1, len(layout) + 1):
                got = inflater.columns(upto)
                # np.array_equal: assert_array_equal's report costs a hundred times more
                bad = [n for n, _ in layout[:upto] if not np.array_equal(got[n], cols[n])]
                assert not bad, f"columns {bad} differ at upto={upto}"

        errors = in_threads(read, 4)
        assert not errors, errors[0]
