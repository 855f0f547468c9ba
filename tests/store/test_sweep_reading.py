"""Reading a recording of a sweep of short processes (issue 23, item 6): ``info`` and
replay keep a settled process's chunk index packed, read when a view needs it, so what
they hold grows by a few kilobytes a process, and replay's first frame reads a few chunks,
not one a process.

The recordings are written by the real writer from a real Session fed the messages short
scripts send; replay runs the real app under Pilot.
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

from sweep import PHASES, write_sweep

from gpuwatch.session import Session
from gpuwatch.store import load
from gpuwatch.store.info import summarize, summarize_opened
from gpuwatch.store.multi import load_many


def _asleep(session: Session) -> tuple[int, int]:
    """(series asleep, series with an archive) over every process."""
    archives = [
        getattr(p, kind).archive
        for p in session.processes.values()
        for kind in ("torch", "peaks", "rss", "phases")
        if getattr(p, kind).archive is not None
    ]
    return sum(a.asleep for a in archives), len(archives)


def test_open_keeps_a_settled_process_index_packed(tmp_path: Path) -> None:
    path = write_sweep(tmp_path / "sweep.gpuwatch", 120)
    opened = load_many([str(path)])
    try:
        s = opened.session
        asleep, archives = _asleep(s)
        # The file is finished: every process's series (phases, peaks, rss); before: none.
        assert archives == 120 * 3 and asleep == 120 * 3
        source = next(iter(s.processes.values())).phases.archive.source
        assert source.decoded == 0
        # Asleep, a table still answers what every view asks without reading its index.
        proc = s.processes[1000]
        assert len(proc.phases) == PHASES and proc.phases.span() is not None
        assert proc.phases.archive.asleep
        # ...and reads its rows as before when asked.
        whole = load(path)
        want = whole.processes[1000].phases.snapshot()
        got = proc.phases.rows(0, PHASES)
        assert all((got[c] == want[c]).all() for c in want)
        # The summary of a file read asleep is the summary of the file loaded whole.
        info = summarize_opened(opened)
        assert info == summarize(opened.recordings[0], whole)
        assert [p["phases"] for p in info["processes"]] == [{"step": PHASES}] * 120
        assert _asleep(s)[0] == 120 * 3  # info lets go of each index once read
    finally:
        opened.close()


def _info_peak(path: Path) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        opened = load_many([str(path)])
        try:
            summarize_opened(opened)
        finally:
            opened.close()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_info_of_a_sweep_grows_by_a_summary_a_process(tmp_path: Path) -> None:
    small = write_sweep(tmp_path / "a.gpuwatch", 50)
    large = write_sweep(tmp_path / "b.gpuwatch", 250)
    _info_peak(small)  # what any info makes once (imports, caches)
    per = (_info_peak(large) - _info_peak(small)) / 200
    # Before: 29 KB a process (an index, summaries and archive of each of its series).
    assert per <= 16_000, f"{per:.0f} bytes per process"


async def test_replay_first_frame_reads_a_few_chunks(tmp_path: Path) -> None:
    from gpuwatch.store.player import open_replay
    from gpuwatch.tui.replay import replay_app

    path = write_sweep(tmp_path / "sweep.gpuwatch", 300)
    player = open_replay(path)
    try:
        app = replay_app(player, subtitle="sweep")
        async with app.run_test(size=(160, 50)) as pilot:
            while app.dashboard.redraws < 1:
                await pilot.pause()
            await pilot.pause()
            source = player.loader.source
            # Before: every process's phases were read (its earliest begin, the band's
            # rows, the phase at the cursor): 300 chunks and more. The host's chart
            # still draws each one's RSS line in the window.
            assert source.rows_decoded["phases"] <= 10 * PHASES, source.rows_decoded
            asleep = sum(p.phases.archive.asleep for p in player.session.processes.values())
            assert asleep >= 300 - 10
            # The band shows its rows, the rest folded, as before.
            host = next(p for p in app.dashboard.panels if p.is_host)
            labels = [r.label for r in host.band.rows]
            assert labels[-1].startswith("+") and labels[-1].endswith("more"), labels
    finally:
        player.close()


def test_a_series_woken_then_let_go_after_a_refresh_reads_its_file(tmp_path: Path) -> None:
    """A refresh packs only the series asleep then; one woken before it and let go of
    after (info lets go of each) reads its index from the file again."""
    from gpuwatch.store.loader import open_session
    from gpuwatch.store.recording import open_recording

    path = write_sweep(tmp_path / "sweep.gpuwatch", 20)
    rec = open_recording(path)
    try:
        s, loader = open_session(rec, windowed=True)
        table = s.processes[1005].phases
        want = table.rows(0, PHASES)  # wakes it, from the packed index
        assert not table.archive.asleep
        loader.refresh()  # the file has not changed: every other stays asleep
        assert table.archive.asleep is False and s.processes[1006].phases.archive.asleep
        table.archive.sleep()
        got = table.rows(0, PHASES)
        assert all((got[c] == want[c]).all() for c in want)
        assert table.max_between("peak_alloc") == (
            int(want["t1"][-1]),
            float(want["peak_alloc"][-1]),
        )
    finally:
        rec.close()
