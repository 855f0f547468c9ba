"""Issue 51 item 9 / issue 53: the key bar and ``?`` say the keys bound now, a keymap's.

Before, both were built from the static action table: with ``play = "p"`` in keymap.toml
they still said ``space Play / pause``; the Processes tab's keys could not be remapped, and
the process screen listed its keys by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import synthetic
from conftest import ROOT, until

from gpuwatch.analysis.processes import rows as process_rows
from gpuwatch.store.player import open_replay
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.help import HelpScreen
from gpuwatch.tui.keymap import load_keymap
from gpuwatch.tui.process_screen import ProcessScreen
from gpuwatch.tui.replay import replay_app

SIZE = (140, 45)
END = synthetic.end_time()
SAMPLE = ROOT / "samples" / "gpt2-small-h100.gpuwatch"


def keymap(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "keymap.toml"
    path.write_text(text)
    return load_keymap(path)


def bar(app: GpuwatchApp) -> str:
    return app.screen.query_one("KeyBar").render().plain  # type: ignore[attr-defined]


def rows(app: GpuwatchApp) -> dict[str, str]:
    screen = app.screen
    assert isinstance(screen, HelpScreen)
    return {desc: keys for keys, desc in [*screen.keys, *screen.process_keys]}


async def moved(
    app: GpuwatchApp, pilot: Any, old: str, new: str, state: Callable[[], object]
) -> dict[str, str]:
    """Press ``old`` (``state`` stays), then ``new`` (it changes), then ``?``: the help's
    rows."""
    before = state()
    await pilot.press(old)  # the remapped action's key no more
    await pilot.pause()
    assert state() == before
    await pilot.press(new)
    await pilot.pause()
    assert state() != before
    await pilot.press("question_mark")
    assert await until(pilot, lambda: isinstance(app.screen, HelpScreen))
    return rows(app)


async def test_a_remapped_play_key_is_what_the_key_bar_and_help_say_in_a_replay(
    tmp_path: Path,
) -> None:
    player = open_replay(str(SAMPLE))
    try:
        app = replay_app(player, keymap=keymap(tmp_path, 'play = "p"\nzoom-in = "i"\n'))
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert " p Play / pause " in bar(app), bar(app)
            assert "space" not in bar(app) and " i Zoom in " in bar(app)
            await pilot.press("question_mark")
            assert await until(pilot, lambda: isinstance(app.screen, HelpScreen))
            said = rows(app)
            assert said["Play or pause the recording"] == "p"
            assert said["Halve the time window"] == "i"
            assert said["Double the playback speed (to x64)"] == ">"  # not remapped
    finally:
        player.close()


async def test_live_the_help_lists_every_key_of_an_action_the_keymap_moved(
    tmp_path: Path,
) -> None:
    # Live, f and space both follow; play = "p" moves space's binding only.
    app = GpuwatchApp(synthetic.build(), clock=lambda: END, keymap=keymap(tmp_path, 'play = "p"'))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert " f Follow / pause " in bar(app)
        await pilot.press("question_mark")
        assert await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        said = rows(app)
        assert said["Follow the newest data, or freeze the window where it is"] == "f / p"
        assert said["Halve the time window"] == "+ / ="


async def test_the_processes_tab_keys_are_remappable_and_the_help_says_so(
    tmp_path: Path,
) -> None:
    app = GpuwatchApp(
        synthetic.build(), clock=lambda: END, keymap=keymap(tmp_path, 'sort-next = "x"\n')
    )
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        table = app.dashboard.process_table
        assert await until(pilot, lambda: app.focused is table)
        said = await moved(app, pilot, "o", "x", lambda: table.sort_key)
        assert said["Sort by the next column"] == "x"
        assert rows(app)["Filter the rows by text (enter keeps it, escape clears it)"] == "/"


async def test_the_process_screen_bar_says_its_keys_as_bound(tmp_path: Path) -> None:
    app = GpuwatchApp(
        synthetic.build(), clock=lambda: END, keymap=keymap(tmp_path, 'follow = "F"\n')
    )
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        row = process_rows(app.session)[0]  # the synthetic run's own process
        app.push_screen(ProcessScreen(app.session, row))
        assert await until(pilot, lambda: isinstance(app.screen, ProcessScreen))
        await pilot.pause()
        assert " F Follow / pause " in bar(app), bar(app)
        assert app.view.following
        await pilot.press("F")
        await pilot.pause()
        assert not app.view.following


async def test_the_cluster_view_keys_are_remappable_and_its_bar_and_help_say_so(
    tmp_path: Path,
) -> None:
    # Before: its bar and help listed "s Sort" and "r" by hand beside its BINDINGS.
    from promstub import PromStub, Stub, gpu_series

    from gpuwatch.cluster import PromClient
    from gpuwatch.tui.cluster import ClusterApp

    server = PromStub(Stub(families=gpu_series("node-a", 2, used_gib=70)))
    try:
        keys = keymap(tmp_path, 'sort = "S"\nrefresh = "R"\n')
        app = ClusterApp(PromClient(server.url), [], keymap=keys)
        async with app.run_test(size=SIZE) as pilot:
            assert await until(pilot, lambda: app.refreshes >= 1)
            assert " S Sort " in bar(app) and " R Refresh " in bar(app), bar(app)
            said = await moved(app, pilot, "s", "S", lambda: app.sort)  # type: ignore[arg-type]
            assert said["sort: memory, headroom, host, rank"] == "S"
            assert said["refresh now"] == "R"
            assert said["on a host: a longer window"] == "+ / ="
    finally:
        server.close()


async def test_the_status_line_names_the_ranks_key_as_bound(tmp_path: Path) -> None:
    # It said "(5)" whatever the keymap said.
    import rank_session

    session = rank_session.build()
    app = GpuwatchApp(
        session, clock=lambda: session.time_range()[1], keymap=keymap(tmp_path, 'ranks = "R"')
    )
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("R")
        assert await until(pilot, lambda: app.dashboard.tabs.active == "ranks")
        assert "! 2 rank faults (R)" in app.dashboard.status_bar.text
        assert "(5)" not in app.dashboard.status_bar.text
