"""The replay screen under Pilot: transport keys, jumps, the scrubber."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import synthetic
from conftest import FakeClock, until
from textual.binding import Binding

from gpuwatch.session import navigate as nav
from gpuwatch.store import Player, open_recording, open_session, save_session
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.replay import Scrubber, replay_app

SIZE = (140, 45)
SECOND = 10**9


@pytest.fixture
def replay(tmp_path: Path):
    """A Player over a real recording file of the synthetic session, on a fake clock."""
    path = save_session(synthetic.build(), tmp_path / "synthetic.gpuwatch")
    rec = open_recording(path)
    session, loader = open_session(rec)
    loader.load_all()
    clock = FakeClock(100.0)
    player = Player(session, loader, playing=False, clock=clock)
    yield player, clock
    rec.close()


def make_app(player: Player, theme: str = "gpuwatch-dark") -> GpuwatchApp:
    return replay_app(player, theme_name=theme, subtitle="replay synthetic.gpuwatch")


async def test_space_plays_and_pauses_and_the_window_follows(replay) -> None:
    player, clock = replay
    app = make_app(player)
    async with app.run_test(size=SIZE) as pilot:
        assert "REPLAY paused" in app.dashboard.status_bar.text
        await pilot.press("space")
        assert player.playing and app.view.following
        clock.now += 2 * SECOND
        # Play resumes from the cursor's time (the position the scrubber shows).
        start = app.transport.player.opening().position
        assert await until(pilot, lambda: "REPLAY ▶" in app.dashboard.status_bar.text)
        assert app.now() == start + 2 * SECOND
        await pilot.press("space")
        assert not player.playing


async def test_arrows_move_cursor_and_position_as_live(replay) -> None:
    # Issue 37, item 8: the arrows mean what they mean live (a column; ctrl: a tenth of
    # the window); paused, the playback position goes with the cursor.
    player, _ = replay
    app = make_app(player)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("plus", "plus", "plus")  # 7.5 s window
        start = app.view.cursor if app.view.cursor is not None else player.position()
        width = next(p for p in app.dashboard.panels if not p.is_host).chart.plot_width
        col = app.view.span // width
        await pilot.press("right")
        assert player.position() == app.view.cursor == start + col
        await pilot.press("right", "left")
        assert player.position() == start + col
        await pilot.press("ctrl+right")
        assert player.position() == app.view.cursor == start + (1 + round(width / 10)) * col
        await pilot.press("end")
        assert player.position() == player.bounds()[1]
        await pilot.press("home")
        assert player.position() == player.bounds()[0]


async def test_speed_keys(replay) -> None:
    player, _ = replay
    app = make_app(player)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("greater_than_sign", "greater_than_sign")
        assert player.speed == 4.0
        await pilot.press(*["less_than_sign"] * 10)
        assert player.speed == 0.25
        await pilot.press(*["greater_than_sign"] * 12)
        assert player.speed == 64.0


async def test_jumps_seek_and_pause_there(replay) -> None:
    player, _ = replay
    app = make_app(player)
    session = player.session
    async with app.run_test(size=SIZE) as pilot:
        times = nav.boundaries(session)
        start = player.position()  # the opening cursor's time
        assert start == app.view.cursor
        await pilot.press("right_square_bracket")
        first = player.position()
        assert first == times[np.searchsorted(times, start, "right")]
        assert app.view.cursor == first and not player.playing
        await pilot.press("right_square_bracket", "left_square_bracket")
        assert player.position() == first
        await pilot.press("m")
        assert player.position() == session.marks[0].t
        await pilot.press("o")
        assert player.position() == session.ooms[0].t
        await pilot.press("O")
        assert player.position() == session.ooms[0].t  # no earlier OOM: no move
        await pilot.press("home", "s")
        assert player.position() == player.spike().t  # the highest exact phase peak


async def test_whole_session_and_follow(replay) -> None:
    player, _ = replay
    app = make_app(player)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("w")
        first, last = player.bounds()
        assert app.view.window(app.now()) == (first, last)
        await pilot.press("f")
        assert app.view.following


async def test_scrubber_click_seeks(replay) -> None:
    player, _ = replay
    app = make_app(player)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        bar = app.query_one(Scrubber)
        start, cells = bar._bar
        await pilot.click(Scrubber, offset=(1 + start + cells // 2, 0))
        await pilot.pause()
        first, last = player.bounds()
        assert abs(player.position() - (first + (last - first) // 2)) <= (last - first) / cells


async def test_replay_help_lists_transport_keys(replay) -> None:
    player, _ = replay
    app = make_app(player)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        text = " ".join(desc for _, desc in app.screen.keys)
        assert "Play or pause" in text and "playback speed" in text


def test_replay_snapshot(snap_compare, replay) -> None:
    player, _ = replay
    assert snap_compare(make_app(player), press=("plus", "plus", "plus", "m"), terminal_size=SIZE)


@pytest.mark.parametrize("size", [(80, 24), (140, 45)])
async def test_the_scrubber_keeps_its_total_at_the_end(replay, size) -> None:
    # Before: at the end of a recording the line ran over and read `01:04.122 /`.
    player, _ = replay
    app = make_app(player)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        app.transport.action_end()
        await pilot.pause()
        bar = app.query_one(Scrubber)
        text = bar.render().plain
        last = player.bounds()[1]
        assert player.position() >= last
        total = text.rsplit(" / ", 1)[-1].split()[0]
        assert text.rstrip().endswith(total) and ":" in total, text
        assert len(text) <= bar.content_size.width, (len(text), bar.content_size.width)


@pytest.mark.parametrize("size", [(80, 24), SIZE])
async def test_home_and_end_work_in_every_layout(replay, size) -> None:
    # Before: at 80x24 the focused panel's scrolling container took both keys.
    player, _ = replay
    app = make_app(player)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        first, last = player.bounds()
        await pilot.press("end")
        await pilot.pause()
        assert player.position() == last
        await pilot.press("home")
        await pilot.pause()
        assert player.position() == first


SPIKE = Path(__file__).resolve().parents[2] / "samples" / "gpt-2.7b-h100-adamw-spike.gpuwatch"


@pytest.mark.parametrize("size", [(80, 24), SIZE])
async def test_right_moves_the_cursor_on_and_minus_zooms_around_it(size) -> None:
    # Before: `right` re-anchored the window on the playback position (the chart jumped
    # back a window and the cursor went); `-` then zoomed around the right edge.
    from gpuwatch.store.player import open_replay

    player = open_replay(SPIKE)
    try:
        app = replay_app(player)
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            window = app.view.window(app.now())
            cursor = app.view.cursor
            assert cursor is not None and window[0] < cursor < window[1]
            await pilot.press("right")
            await pilot.pause()
            assert app.view.window(app.now()) == window  # no jump
            width = next(p for p in app.dashboard.panels if not p.is_host).chart.plot_width
            assert app.view.cursor == cursor + app.view.span // width
            assert player.position() == app.view.cursor
            cursor = app.view.cursor
            await pilot.press("minus")
            await pilot.pause()
            t0, t1 = app.view.window(app.now())
            assert t1 - t0 == 2 * (window[1] - window[0]) and app.view.cursor == cursor
            last = player.bounds()[1]
            # Centred, as far as the recording's end allows.
            assert t0 <= cursor - (t1 - t0) // 2 or t1 == last
            assert abs((t0 + t1) // 2 - cursor) <= max(0, cursor + (t1 - t0) // 2 - last) + 1
    finally:
        player.close()


async def test_4_in_replay_says_there_is_no_log(replay) -> None:
    player, _ = replay
    app = make_app(player)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await pilot.pause()
        assert any("replay has no Log tab" in n.message for n in app._notifications)


def resolved(app: GpuwatchApp) -> dict[str, str]:
    """Each bound key and the action it runs in ``app``'s mode: the first of its
    bindings that the mode's transport leaves on (as Textual tries them)."""
    from textual.actions import parse

    out: dict[str, str] = {}
    for binding in app.dashboard.BINDINGS:
        assert isinstance(binding, Binding)
        _, name, params = parse(binding.action)
        if binding.key not in out and app.dashboard.check_action(name, params):
            out[binding.key] = binding.action
    return out


def table(actions) -> dict[str, str]:
    return {key: a.action for a in actions for key in a.keys.split(",")}


def test_each_mode_runs_the_keys_of_its_own_table(replay) -> None:
    # Before: ReplayApp subclassed the app and dropped the live keys it rebound
    # (kept_actions); now one app class, the keys of both modes, and the transport says
    # which are on. Each key a mode lists runs what its table says, and no other key runs.
    from gpuwatch.session import Session
    from gpuwatch.tui.actions import LIVE_ACTIONS, REPLAY_ACTIONS

    player, _ = replay
    played = make_app(player)
    live = GpuwatchApp(Session(), clock=lambda: 0)
    for app, actions in ((played, REPLAY_ACTIONS), (live, LIVE_ACTIONS)):
        keys = [k for a in app.transport.actions for k in a.keys.split(",")]
        assert len(keys) == len(set(keys))
        assert resolved(app) == table(actions)
    assert resolved(played)["space"] == "transport('toggle_play')"
    assert resolved(live)["space"] == "toggle_follow"
    assert resolved(played)["less_than_sign"] == "transport('speed', -1)"
    assert resolved(live)["less_than_sign"] == "pan(-0.25)"
    assert "o" not in resolved(live) and "w" not in resolved(live)
