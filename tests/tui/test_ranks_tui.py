"""The Ranks tab under Pilot: it appears with a job's ranks, flags its faults, fits 80x24."""

from __future__ import annotations

import rank_session as rs
import synthetic
from conftest import until
from store_data import T0, Script

from gpuwatch.analysis.rank_feed import RankFeed
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.ranks import render


def _app(session) -> GpuwatchApp:
    return GpuwatchApp(session, clock=lambda: session.time_range()[1])


def _shown(app: GpuwatchApp) -> list[str]:
    return str(app.dashboard.ranks_view.body.render()).splitlines()


async def test_the_tab_shows_each_rank_and_flags_the_faults() -> None:
    app = _app(rs.build())
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.press("5")
        await pilot.pause()
        assert app.dashboard.tabs.active == "ranks"
        lines = _shown(app)
        assert lines[0].startswith("ranks: 4 (world size 4, newest step 2)")
        assert "! 2 faults" in lines[0]
        rows = [ln for ln in lines if ln[:2] in ("!0", " 1", "!2", " 3")]
        assert [r.split()[0] for r in rows] == ["!0", "1", "!2", "3"]
        assert "5.0G!" in rows[0] and "5.0G" not in rows[1]
        assert "eval: max 5.0G rank 0 · min 4.0G rank 1 · spread 1.0G" in lines
        faults = [ln for ln in lines if ln.startswith("! ")]
        assert faults[0].startswith("! rank 0 eval peak 5.00 GiB is 1.00 GiB above the median")
        assert faults[0].endswith("(unexplained)")
        assert faults[1].startswith("! rank 2 (pid 5102) holds 300 MiB on GPU 0")
        await pilot.press("1")
        assert app.dashboard.tabs.active == "timelines"
        # Whatever the tab, the status bar counts the job's faults.
        assert "! 2 rank faults (5)" in app.dashboard.status_bar.text


async def test_at_80x24_the_table_fits_and_the_faults_are_short() -> None:
    app = _app(rs.build())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("5")
        await pilot.pause()
        lines = _shown(app)
        width = app.dashboard.ranks_view.size.width
        assert all(len(ln) <= width for ln in lines), lines
        assert "! rank 0 eval 1.0G over the median (unexplained)" in lines
        assert "! rank 2: a context on GPU 0 (300M), not its own GPU" in lines
        # Everything is on screen at once: no scrolling to find a fault.
        assert len(lines) <= app.dashboard.ranks_view.size.height


async def test_no_tab_without_ranks_and_one_once_a_second_rank_says_hello() -> None:
    s = rs.build(ranks=(0,))
    s.live = True
    app = _app(s)
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.press("5")
        await pilot.pause()
        assert app.dashboard.tabs.active == "timelines" and not app.dashboard.has_ranks()
        # Rank 1's first message is not its hello (a dashboard that started late).
        Script(s, rs.PIDS[1]).send("mark", T0, text="resumed")
        await pilot.pause(0.6)
        assert not app.dashboard.has_ranks()
        rs.build(session=s, ranks=(1,), stray=False)  # its hello, and its steps
        # The table timer looks at the new process on its next tick.
        assert await until(pilot, app.dashboard.has_ranks)
        await pilot.press("5")
        await pilot.pause()
        assert app.dashboard.tabs.active == "ranks"
        assert _shown(app)[0].startswith("ranks: 2 (world size 4")


async def test_a_ranks_view_no_longer_on_screen_is_not_drawn() -> None:
    """The table timer can tick once more while the app closes, after its widgets are
    detached: the view takes its tables and draws nothing (it raised NoScreen)."""
    app = _app(rs.build())
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.press("5")
        await pilot.pause()
        view = app.dashboard.ranks_view
        await view.remove()
        view.refresh_rows()
        assert view.tables  # read, not drawn


async def test_a_single_process_session_has_no_ranks_tab() -> None:
    app = GpuwatchApp(synthetic.build(), clock=lambda: synthetic.end_time())
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.pause(0.6)
        await pilot.press("5")
        await pilot.pause()
        assert not app.dashboard.has_ranks() and app.dashboard.tabs.active == "timelines"


def test_columns_go_least_telling_first_as_the_width_shrinks() -> None:
    tables = RankFeed().tables(rs.build())
    heads = {}
    for width in (120, 70, 50, 30):
        text = str(render(tables, width, compact=True, flag_style="bold"))
        heads[width] = text.splitlines()[1].split()
        assert all(len(ln) <= width for ln in text.splitlines())
    phases = ["fwd", "bwd", "optim", "eval"]
    assert heads[120] == ["rank", "host", "gpu", "pid", "step", *phases, "predicted", "used"]
    assert "pid" not in heads[50] and "host" not in heads[50]
    assert heads[30][0] == "rank" and "eval" in heads[30]


def test_a_hostile_host_name_is_shown_escaped() -> None:
    s = rs.build()
    s.processes[rs.PIDS[1]].hello["hostname"] = "evil\x1b]0;pwned\x07"
    text = str(render(RankFeed().tables(s), 140, compact=False, flag_style="bold"))
    assert "\x1b" not in text and "\\x1b" in text


async def test_the_tab_in_a_replay(tmp_path) -> None:
    from gpuwatch.store import save_session
    from gpuwatch.store.player import open_replay
    from gpuwatch.tui.replay import replay_app

    path = save_session(rs.build(), tmp_path / "job.gpuwatch")
    app = replay_app(open_replay(path), subtitle="replay")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("5")
        await pilot.pause()
        assert app.dashboard.tabs.active == "ranks"
        lines = _shown(app)
        assert lines[0].startswith("ranks: 4 (world size 4, newest step 2)")
        assert "! rank 2: a context on GPU 0 (300M), not its own GPU" in lines
