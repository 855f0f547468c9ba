"""The replay Player, without a terminal: a fake wall clock drives playback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import FakeClock
from store_data import GIB, MS, T0, populated_session

from gpuwatch.session import Session
from gpuwatch.store import Player, open_recording, open_session, save_session
from gpuwatch.store.player import MAX_SPEED, MIN_SPEED, open_replay

SECOND = 10**9


@pytest.fixture
def session() -> Session:
    return populated_session(steps=5)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_plays_at_speed_and_pauses(session: Session, clock: FakeClock) -> None:
    first = session.time_range()[0]
    p = Player(session, speed=1.0, clock=clock)
    assert p.position() == first and p.playing
    clock.advance(0.01)
    assert p.position() == first + 10 * MS
    p.set_speed(4)
    clock.advance(0.01)
    assert p.position() == first + 50 * MS
    p.pause()
    clock.advance(1)
    assert p.position() == first + 50 * MS and not p.playing
    p.toggle()
    clock.advance(0.005)
    assert p.position() == first + 70 * MS


def test_stops_at_the_end_and_plays_again_from_the_start(
    session: Session, clock: FakeClock
) -> None:
    first, last = session.time_range()
    p = Player(session, speed=64, clock=clock)
    clock.advance(10)
    assert p.position() == last and not p.playing and p.at_end
    p.play()
    assert p.position() == first and p.playing


def test_speed_is_clamped_and_steps(session: Session, clock: FakeClock) -> None:
    p = Player(session, speed=1000, clock=clock)
    assert p.speed == MAX_SPEED
    p.set_speed(0.01)
    assert p.speed == MIN_SPEED
    assert [p.faster() for _ in range(3)] == [0.5, 1.0, 2.0]
    assert p.slower() == 1.0
    p.set_speed(3)
    assert p.faster() == 4.0 and p.slower() == 2.0


def test_seek_is_clamped(session: Session, clock: FakeClock) -> None:
    first, last = session.time_range()
    p = Player(session, playing=False, clock=clock)
    assert p.seek(first + 20 * MS) == first + 20 * MS
    assert p.seek_by(-10 * MS) == first + 10 * MS
    assert p.seek(first - SECOND) == first
    assert p.seek(last + SECOND) == last
    assert p.home() == first and p.end() == last
    assert not p.playing  # a finished recording does not follow its end


def test_phase_jumps_visit_every_boundary(session: Session, clock: FakeClock) -> None:
    p = Player(session, playing=False, clock=clock)
    expected = set()
    for proc in session.processes.values():
        cols = proc.phases.snapshot()
        expected |= set(cols["t0"].tolist()) | set(cols["t1"].tolist())
        expected |= {o.t0 for o in proc.open.values()}
    seen = []
    while (t := p.next_phase()) is not None:
        seen.append(t)
    assert seen == sorted(expected)
    assert p.position() == max(expected)
    back = []
    while (t := p.prev_phase()) is not None:
        back.append(t)
    assert back == sorted(expected, reverse=True)[1:]


def test_mark_and_oom_jumps(session: Session, clock: FakeClock) -> None:
    p = Player(session, playing=False, clock=clock)
    marks = sorted(m.t for m in session.marks)
    assert p.next_mark() == marks[0]
    assert p.next_mark() == marks[1]
    assert p.prev_mark() == marks[0]
    assert p.prev_mark() is None and p.position() == marks[0]  # nothing before: no move
    oom = session.ooms[0].t
    assert p.next_oom() == oom
    assert p.next_oom() is None and p.position() == oom
    p.home()
    assert p.prev_oom() is None


def test_largest_spike_is_the_first_time_nvml_used_peaked(
    session: Session, clock: FakeClock
) -> None:
    p = Player(session, playing=False, clock=clock)
    t, value, key = p.largest_spike()
    best = max(
        ((int(c["used"].max()), k) for k, tab in session.gpu.items() for c in [tab.snapshot()]),
    )
    assert (value, key) == best
    cols = session.gpu[key].snapshot()
    assert t == int(cols["t"][np.argmax(cols["used"])])


def test_s_goes_to_the_highest_exact_phase_peak_before_nvml(
    session: Session, clock: FakeClock
) -> None:
    # Issue 37, item 4: where phases have exact allocator peaks, those are the spike.
    p = Player(session, playing=False, clock=clock)
    best = None
    for proc in session.processes.values():
        cols = proc.phases.snapshot()
        if len(cols["t1"]):
            i = int(np.argmax(cols["peak_alloc"]))
            cand = (int(cols["peak_alloc"][i]), int(cols["t0"][i]), int(cols["t1"][i]))
            best = cand if best is None or cand[0] > best[0] else best
    assert best is not None
    spike = p.spike()
    assert spike is not None and spike.source == "phase" and spike.value == best[0]
    assert spike.t == (best[1] + best[2]) // 2
    assert p.jump_to_spike() == spike.t and p.position() == spike.t
    # Without phases: nvidia-smi's highest reading, and it says so.
    bare = Session(t_origin=T0, wall_offset=0)
    for key, table in session.gpu.items():
        bare.add_device(session.devices[key])
        for row in _rows(table):
            bare.add_gpu_sample(key, row)
    t, value, _ = Player(bare, clock=clock).largest_spike()
    assert Player(bare, clock=clock).spike() == (t, value, "nvml", 0, "", None)


def _rows(table) -> list[dict]:
    cols = table.snapshot()
    return [{c: v[i].item() for c, v in cols.items()} for i in range(len(cols["t"]))]


def test_spike_falls_back_to_rss_on_a_cpu_recording(clock: FakeClock) -> None:
    s = Session(t_origin=T0, wall_offset=0)
    s.ensure_host("h", 8 * GIB)
    s.add_host_sample({"t": T0, "total": 8 * GIB, "used": GIB, "available": 1})
    assert Player(s, clock=clock).largest_spike() == (T0, GIB, "host")
    assert Player(Session(), clock=clock).largest_spike() is None


def test_player_over_a_file_matches_the_session(tmp_path: Path, session: Session) -> None:
    path = save_session(session, tmp_path / "p.gpuwatch")
    player = open_replay(path)
    try:
        # The index knows the bounds and the spike before the samples are loaded.
        assert player.bounds() == session.time_range()
        assert player.largest_spike() == Player(session).largest_spike()
        assert not player.growing
    finally:
        player.close()


def test_growing_file_end_follows_the_tail(
    tmp_path: Path, session: Session, clock: FakeClock
) -> None:
    path = save_session(session, tmp_path / "g.gpuwatch")
    rec = open_recording(path)
    replay, loader = open_session(rec)
    loader.following = True  # as when another gpuwatch is still writing the file
    p = Player(replay, loader, playing=False, clock=clock)
    assert p.end() == p.bounds()[1] and p.playing
    clock.advance(100)
    assert p.position() == p.bounds()[1] and p.playing  # waits at the tail, still playing
    rec.close()


async def test_replay_drives_the_dashboard(tmp_path: Path, session: Session) -> None:
    from gpuwatch.tui.replay import replay_app

    path = save_session(session, tmp_path / "app.gpuwatch")
    player = open_replay(path)
    try:
        app = replay_app(player, subtitle="replay app.gpuwatch")
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            # It opens paused on the data (Player.opening); playing, the clock is the player.
            opening = player.opening()
            assert not player.playing and player.position() == opening.position
            assert opening.cursor is None or opening.position == opening.cursor
            assert app.view.window(app.now()) == opening.window
            await pilot.press("space")
            player.pause()
            assert app.dashboard.redraws >= 1 and app.now() == player.position()
            spike = player.jump_to_spike()
            app.dashboard.redraw()
            await pilot.pause()
            assert app.now() == spike
            assert len(app.dashboard.panel_list.by_key) == len(session.devices)
    finally:
        player.close()
