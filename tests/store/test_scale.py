"""Memory that does not grow with the run, and recordings read a window at a time.

Real recordings (tests/support/longdata.py writes many chunks in seconds), the real recorder and
loader, the real app under Pilot: a live session keeps a bounded number of rows and reads
older ones back from its recording (or keeps their summaries when it has none); a replay
reads only what a window needs, and the whole recording's view still shows a single
10 ms spike.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import longdata
import numpy as np
import pytest
from conftest import until
from longdata import GIB, KEY, PID, SECOND, T0
from store_data import as_schema_1, assert_sessions_equal

from gpuwatch import protocol
from gpuwatch.session import Process, Session
from gpuwatch.session import navigate as nav
from gpuwatch.session.peaks import phase_peaks
from gpuwatch.session.table import HISTORY_BLOCKS
from gpuwatch.store import Recorder, load, open_recording, open_session
from gpuwatch.store._codec import BLOCK_ROWS
from gpuwatch.store.archive import CACHE
from gpuwatch.store.export import TABLES, columns, table
from gpuwatch.store.info import summarize_opened
from gpuwatch.store.multi import load_many
from gpuwatch.store.player import open_replay

SECONDS = 1200.0


@pytest.fixture(scope="module")
def long_file(tmp_path_factory) -> Path:
    """20 minutes: 120k NVML samples at 100 Hz, 24k phases, in chunks of 2048 rows."""
    path = tmp_path_factory.mktemp("long") / "long.gpuwatch"
    longdata.record(path, SECONDS)
    return path


@pytest.fixture(scope="module")
def full(long_file: Path) -> Session:
    """The same recording loaded whole: what every windowed answer must equal."""
    return load(long_file)


def _columns_of(line: np.ndarray, value: int) -> list[int]:
    """The chart columns where ``line`` reaches ``value``."""
    return np.flatnonzero(line == value).tolist()


def _windowed(path: Path):
    rec = open_recording(path)
    session, loader = open_session(rec, windowed=True)
    return rec, session, loader


# --------------------------------------------------------------------------- live memory


def test_recorded_session_keeps_a_bounded_tail_and_reads_the_rest_back(tmp_path: Path):
    keep = 2048
    s = longdata.record(tmp_path / "live.gpuwatch", SECONDS, keep=keep)
    gpu, phases = s.gpu[KEY], s.processes[PID].phases
    assert len(gpu) == SECONDS * 100 and len(phases) == SECONDS * 5 * 4
    for _, _, t in s.tables():
        # At most the kept rows, twice over between trims, plus what is not sealed yet.
        assert t.in_memory <= 2 * keep + 2048, t.kind
    # The rows that left memory are read back from the file: the same as a full load.
    full = load(tmp_path / "live.gpuwatch")
    first, last = full.time_range()
    for width in (100, 400):
        a = s.gpu_window(KEY, "used", first, last, width)
        b = full.gpu_window(KEY, "used", first, last, width)
        assert np.nanmax(a[1]) == np.nanmax(b[1]) == 70 * GIB
    t = T0 + 100 * SECOND  # long gone from memory
    assert gpu.at(t) == full.gpu[KEY].at(t)
    got, want = phases.between(t, t + SECOND), full.processes[PID].phases.between(t, t + SECOND)
    assert len(want["t1"]) > 0
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_a_million_samples_without_a_recording_keep_summaries_only():
    s = longdata.new_session(keep=4096)
    total = 10_000.0  # 10^6 samples at 100 Hz
    done, step = 0.0, 0
    while done < total:
        step += longdata.fill(s, T0 + int(done * SECOND), 500.0, total, step)
        done += 500.0
    gpu = s.gpu[KEY]
    assert len(gpu) == 1_000_000
    assert gpu.in_memory <= 2 * 4096
    assert len(gpu.history["rows"]) <= HISTORY_BLOCKS
    assert int(gpu.history["rows"].sum()) + gpu.in_memory == len(gpu)
    # The whole session still shows the single 10 ms spike, in the column that holds it.
    first, last = s.time_range()
    assert first == T0
    lo, hi = s.gpu_window(KEY, "used", first, last, 200)
    assert np.nanmax(hi) == 70 * GIB
    col = int((longdata.spike_time(total) - first) * 200 / (last - first))
    assert np.flatnonzero(hi == 70 * GIB).tolist() in ([col], [col - 1, col], [col, col + 1])
    assert np.nanmin(lo) == 20 * GIB
    assert nav.largest_spike(s, KEY)[1] == 70 * GIB
    # Rows let go without an archive: no value at their time, the newest still there.
    assert gpu.at(T0 + SECOND) is None
    assert gpu.value_at("used", last) is not None
    # The band still shows phases over the whole session, from the summaries' winners.
    band = s.processes[PID].band_spans(first, last, 200)
    assert 0 < len(band["t0"]) <= 4 * 200


def test_exporter_counters_stay_exact_however_many_rows_go(tmp_path: Path) -> None:
    from gpuwatch.prometheus import SessionCollector

    s = Session()
    s.bound(256)
    rec = Recorder(s, tmp_path / "tally.gpuwatch", interval=60)
    rec.start()
    pid, n = 4242, 6000
    t = s.t_origin
    s.ingest(protocol.Message("hello", pid, 0, t, 0, {"argv": ["x"]}))
    seq = 1
    for i in range(n):
        for event in ("begin", "end"):
            t += 1000
            body = {"event": event, "name": "step", "id": i, "step": i, "dev": 0,
                    "allocated": i, "reserved": 2 * i}  # fmt: skip
            if event == "end":
                body |= {"peak_allocated": 10 * i, "peak_reserved": 20 * i}
            s.ingest(protocol.Message("phase", pid, seq, t, 0, body))
            seq += 1
        if i % 1000 == 0:
            rec.flush()
    rec.flush()
    proc = s.processes[pid]
    assert proc.phases.in_memory <= 2 * 256 + 8192 and len(proc.phases) == n
    families = {f.name: f for f in SessionCollector(s, host="h").collect()}
    count = families["gpuwatch_process_phases"].samples[0].value
    seconds = families["gpuwatch_process_phase_seconds"].samples[0].value
    assert count == n and seconds == pytest.approx(n * 1000 / 1e9)
    peak = families["gpuwatch_process_phase_peak_allocated_bytes"].samples[0].value
    assert peak == 10 * (n - 1)
    assert families["gpuwatch_process_torch_allocated_bytes"].samples[0].value == n - 1
    assert families["gpuwatch_process_step"].samples[0].value == n - 1
    rec.close()


def test_a_recorder_that_fails_stops_holding_rows_for_the_file(tmp_path: Path) -> None:
    s = longdata.new_session(keep=1024)
    rec = Recorder(s, tmp_path / "fail.gpuwatch", interval=60)
    rec.start()
    rec.writer._db.close()  # the file becomes unwritable under the recorder
    longdata.fill(s, T0, 60.0, 60.0, 0)
    rec.flush()
    assert rec.error is not None
    longdata.fill(s, T0 + 60 * SECOND, 60.0, 120.0, 300)
    assert s.gpu[KEY].in_memory <= 2 * 1024 and len(s.gpu[KEY]) == 12_000
    rec.close()


# --------------------------------------------------------------------------- replay


def test_replay_reads_only_what_a_window_needs(long_file: Path, full: Session) -> None:
    CACHE.clear()
    rec, s, loader = _windowed(long_file)
    try:
        source = loader.source
        assert all(t.in_memory == 0 for _, _, t in s.tables())  # nothing loaded up front
        first, last = loader.bounds()
        # The whole recording: from the chunks' summaries, not one chunk decoded, and the
        # single 10 ms spike is there.
        lo, hi = s.gpu_window(KEY, "used", first, last, 300)
        assert source.decoded == 0
        assert np.nanmax(hi) == 70 * GIB and np.nanmin(lo) == 20 * GIB
        _, full_hi = full.gpu_window(KEY, "used", first, last, 300)
        assert _columns_of(hi, 70 * GIB) == _columns_of(full_hi, 70 * GIB)
        # A few seconds: the chunk or two that hold them, read exactly.
        t = T0 + 500 * SECOND
        window = s.gpu_window(KEY, "used", t, t + 5 * SECOND, 300)
        assert 1 <= source.decoded <= 2
        exact = full.gpu_window(KEY, "used", t, t + 5 * SECOND, 300)
        np.testing.assert_array_equal(window[0], exact[0])
        np.testing.assert_array_equal(window[1], exact[1])
        # What a panel asks at the cursor is the same as with everything loaded.
        proc, whole = s.processes[PID], full.processes[PID]
        for when in (t, t + 17 * longdata.MS, last - SECOND):
            assert s.span_at(proc, when) == full.span_at(whole, when)
            assert proc.torch.at(when) == whole.torch.at(when)
        assert phase_peaks(s, proc, KEY) == phase_peaks(full, whole, KEY)
    finally:
        rec.close()


def test_a_file_from_before_blocks_reads_the_same(
    long_file: Path, full: Session, tmp_path: Path
) -> None:
    """A schema-1 file (each chunk one stream) loads whole and windowed as before."""
    path = tmp_path / "schema1.gpuwatch"
    shutil.copy(long_file, path)
    as_schema_1(path)
    assert_sessions_equal(full, load(path))
    CACHE.clear()
    rec, s, loader = _windowed(path)
    try:
        assert rec.meta["schema"] == "1"
        first, last = loader.bounds()
        proc, whole = s.processes[PID], full.processes[PID]
        rng = np.random.default_rng(11)
        for when in rng.integers(first, last, 60).tolist():
            assert s.span_at(proc, when) == full.span_at(whole, when)
            assert proc.torch.at(when) == whole.torch.at(when)
            assert s.gpu[KEY].at(when) == full.gpu[KEY].at(when)
            window = s.gpu_window(KEY, "used", when, when + 5 * SECOND, 300)
            exact = full.gpu_window(KEY, "used", when, when + 5 * SECOND, 300)
            np.testing.assert_array_equal(window[1], exact[1])
        assert loader.source.error is None
    finally:
        rec.close()


def test_jumps_are_exact_across_the_whole_file(long_file: Path, full: Session) -> None:
    rec, s, loader = _windowed(long_file)
    try:
        times = nav.boundaries(full)
        first, last = loader.bounds()
        rng = np.random.default_rng(7)
        for t in [first - 1, first, last, last + 1, *rng.integers(first, last, 300).tolist()]:
            for direction in (1, -1):
                expected = nav.step_to(times, t, direction)
                assert nav.next_boundary(s, t, direction) == expected, (t, direction)
        assert nav.largest_spike(s, KEY) == nav.largest_spike(full, KEY)
        assert nav.largest_spike(s, "host") == nav.largest_spike(full, "host")
    finally:
        rec.close()


async def test_the_replay_app_opens_on_the_whole_file_and_shows_the_spike(long_file) -> None:
    from gpuwatch.tui.replay import replay_app

    CACHE.clear()
    player = open_replay(long_file)
    try:
        app = replay_app(player, subtitle="long")
        async with app.run_test(size=(140, 45)) as pilot:
            await pilot.pause()
            first, last = player.bounds()
            assert app.view.window(app.now()) == (first, last)
            panel = next(p for p in app.dashboard.panels if p.key == KEY)
            nvml = next(s for s in panel.chart.last_frame.series if s.role == "nvml")
            assert np.nanmax(nvml.hi) == 70 * GIB
            # The summaries drew the 120k samples: only the blocks of rows at the cursor
            # were inflated (of the chunk of 2048 rows that holds it).
            assert player.loader.source.rows_decoded["gpu"] <= 2 * BLOCK_ROWS < 2048
            # s: the highest exact phase peak (issue 37, item 4), from the phases' index.
            await pilot.press("s")
            spike = player.spike()
            assert spike is not None and spike.source == "phase"
            assert player.position() == spike.t
            await pilot.press("right_square_bracket", "2")
            assert await until(pilot, lambda: app.dashboard.peaks_table.row_count > 0)
    finally:
        player.close()


async def test_the_band_fetches_for_its_own_width_before_and_after_layout(
    long_file, monkeypatch
) -> None:
    """No band asks for every span in its window, not even before the first layout (it
    takes the screen's width then); a narrower terminal fetches the winners of the
    narrower band's cells."""
    from gpuwatch.tui.replay import replay_app

    player = open_replay(long_file)
    session = player.session
    widths: list[int | None] = []
    band_spans = Process.band_spans

    def spy(proc, t0: int, t1: int, width: int | None):
        widths.append(width)
        return band_spans(proc, t0, t1, width)

    monkeypatch.setattr(Process, "band_spans", spy)
    try:
        app = replay_app(player, subtitle="long")
        async with app.run_test(size=(140, 45)) as pilot:
            await pilot.pause()
            band = next(p for p in app.dashboard.panels if p.key == KEY).band
            assert widths and None not in widths
            assert widths[-1] == band.plot_cells() == band.size.width - band.axis_width
            await pilot.resize_terminal(50, 45)
            await pilot.pause()
            cells = band.plot_cells()
            assert widths[-1] == cells < 50
            t0, t1 = band.window
            want = band_spans(session.processes[PID], t0, t1, cells)
            assert 0 < len(want["t0"]) <= 4 * cells  # the winners: fewer than in a wide band
            assert [s.t0 for s in band.rows[0].spans] == want["t0"].tolist()
    finally:
        player.close()


def test_a_file_without_summaries_is_summarised_as_it_is_read(tmp_path: Path, full: Session):
    path = tmp_path / "old.gpuwatch"
    longdata.record(path, SECONDS)
    with sqlite3.connect(path) as db:  # as written before summaries existed
        db.execute("DROP TABLE summaries")
        db.execute("DELETE FROM meta WHERE key IN ('summaries', 'summary_block_rows')")
    rec, s, loader = _windowed(path)
    try:
        assert not loader.done  # the loader's thread summarises it
        loader.load_all()
        first, last = loader.bounds()
        _, hi = s.gpu_window(KEY, "used", first, last, 300)
        _, full_hi = full.gpu_window(KEY, "used", first, last, 300)
        assert _columns_of(hi, 70 * GIB) == _columns_of(full_hi, 70 * GIB)
    finally:
        rec.close()


def test_info_and_export_read_in_pieces_and_match_a_full_load(long_file: Path, full) -> None:
    opened = load_many([long_file])
    try:
        assert all(t.in_memory == 0 for _, _, t in opened.session.tables())
        info = summarize_opened(opened)
        whole = opened.session
        opened.session = full  # the same file, every row in memory
        assert summarize_opened(opened) == info
        for name in TABLES:
            opened.session = whole
            streamed = columns(table(opened, name))
            opened.session = full
            assert streamed == columns(table(opened, name)), name
    finally:
        opened.close()
    assert info["phases"]["forward"]["count"] == SECONDS * 5
    assert info["devices"][-1]["used_max"] == 70 * GIB or any(
        d["used_max"] == 70 * GIB for d in info["devices"]
    )


def test_merged_windowed_files_match_merged_loaded_ones(tmp_path: Path) -> None:
    from gpuwatch.session.merge import Part, merge

    a = tmp_path / "a.gpuwatch"
    b = tmp_path / "b.gpuwatch"
    longdata.record(a, 300.0)
    longdata.record(b, 300.0, clock=3 * 86_400 * SECOND)  # another host's clock, same job
    opened = load_many([a, b])
    opened.close()  # the windowed sessions read through connections of their own
    loaded = merge([Part(load(a), "a"), Part(load(b), "b")])
    m = opened.session
    assert set(m.processes) == set(loaded.processes)
    for key in m.gpu:
        np.testing.assert_array_equal(m.gpu[key].snapshot()["t"], loaded.gpu[key].snapshot()["t"])
        np.testing.assert_array_equal(
            m.gpu_procs[key].snapshot()["pid"], loaded.gpu_procs[key].snapshot()["pid"]
        )
    for pid, proc in m.processes.items():
        cols = proc.phases.snapshot()
        other = loaded.processes[pid].phases.snapshot()
        for name in ("t0", "t1", "name"):
            np.testing.assert_array_equal(cols[name], other[name])
    first, last = m.time_range()
    assert m.time_range() == loaded.time_range()
    ta, tb = (m.gpu[k].snapshot()["t"] for k in sorted(m.gpu))
    np.testing.assert_array_equal(ta, tb)  # one wall clock: the same times
    for key in m.gpu:
        assert np.nanmax(m.gpu_window(key, "used", first, last, 50)[1]) == 70 * GIB


async def test_the_live_dashboard_zooms_out_over_rows_its_recording_holds(tmp_path) -> None:
    from gpuwatch.tui.app import GpuwatchApp

    s = longdata.new_session(keep=1024)
    rec = Recorder(s, tmp_path / "live.gpuwatch", interval=60)
    rec.start()
    seconds = 600.0
    for i in range(10):
        longdata.fill(s, T0 + i * 60 * SECOND, 60.0, seconds, i * 300)
        assert rec.flush()
    gpu = s.gpu[KEY]
    assert gpu.in_memory <= 2 * 1024 + 2048 and len(gpu) == 60_000
    end = s.time_range()[1]
    app = GpuwatchApp(s, clock=lambda: end)
    try:
        async with app.run_test(size=(140, 45)) as pilot:
            panel = next(p for p in app.dashboard.panels if p.key == KEY)
            await pilot.pause()
            nvml = next(x for x in panel.chart.last_frame.series if x.role == "nvml")
            assert np.nanmax(nvml.hi) < 70 * GIB  # the last minute: no spike there
            await pilot.press("minus", "minus", "minus", "minus")  # 16 minutes: all of it
            await pilot.pause()
            nvml = next(x for x in panel.chart.last_frame.series if x.role == "nvml")
            assert np.nanmax(nvml.hi) == 70 * GIB  # read back from the recording
            # s: the highest exact phase peak (issue 37, item 4), found from the index of
            # the phases the recording holds.
            await pilot.press("s")
            spike = nav.spike(s, KEY)
            assert spike is not None and spike.source == "phase"
            assert app.view.cursor == spike.t
    finally:
        rec.close()
