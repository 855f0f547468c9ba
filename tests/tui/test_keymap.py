"""The user's keymap: bindings have ids, a keymap.toml moves keys, a bad file is one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import synthetic
from conftest import ROOT, run_gpuwatch

from gpuwatch.store.player import open_replay
from gpuwatch.tui.actions import LIVE_ACTIONS, REPLAY_ACTIONS
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.keymap import KEY_IDS, KeymapError, keymap_path, load_keymap
from gpuwatch.tui.main_screen import MainScreen
from gpuwatch.tui.replay import replay_app

SIZE = (140, 45)
END = synthetic.end_time()
SAMPLE = ROOT / "samples" / "gpt2-small-h100.gpuwatch"


def test_every_key_of_both_modes_has_an_id() -> None:
    keys = {k for a in (*LIVE_ACTIONS, *REPLAY_ACTIONS) for k in a.keys.split(",")}
    assert keys == set(KEY_IDS)
    for binding in MainScreen.BINDINGS:
        assert getattr(binding, "id", None) == KEY_IDS[binding.key]  # type: ignore[union-attr]


def test_the_arrows_are_the_same_in_both_modes_and_the_help_says_what_moves() -> None:
    arrows = ("left", "right", "ctrl+left", "ctrl+right")
    live = [a for a in LIVE_ACTIONS if a.keys in arrows]
    replay = [a for a in REPLAY_ACTIONS if a.keys in arrows]
    assert [a.keys for a in live] == [a.keys for a in replay] == list(arrows)
    assert [(a.action, a.title) for a in live] == [(a.action, a.title) for a in replay]
    assert all(a.help.startswith("Move the cursor ") for a in live)
    assert all(a.help.startswith("Cursor and position ") for a in replay)
    steps = [a.help.split(" ", 3)[-1] for a in live]
    assert steps == [a.help.split(" ", 3)[-1] for a in replay]  # the same words for the step


async def test_a_remapped_key_works_and_the_old_one_no_longer_does(tmp_path: Path) -> None:
    path = tmp_path / "keymap.toml"
    path.write_text('zoom-in = "i"\nfollow = ["F"]\n')
    app = GpuwatchApp(synthetic.build(), clock=lambda: END, keymap=load_keymap(path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        span = app.view.span
        await pilot.press("plus")
        await pilot.pause()
        assert app.view.span == span  # plus was zoom-in's: it goes with the id
        await pilot.press("i")
        await pilot.pause()
        assert app.view.span == span // 2
        await pilot.press("equals_sign")
        await pilot.pause()
        assert app.view.span == span // 2
        assert app.view.following
        await pilot.press("f")
        await pilot.pause()
        assert app.view.following
        await pilot.press("F")
        await pilot.pause()
        assert not app.view.following
        await pilot.press("space")  # play's own id, not follow's: it stays
        await pilot.pause()
        assert app.view.following


async def test_a_remapped_key_moves_in_a_replay_too(tmp_path: Path) -> None:
    # space means play in a replay and follow live: one id ("play") moves both.
    player = open_replay(str(SAMPLE))
    try:
        app = replay_app(player, keymap={"play": "p"})
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert not player.playing
            await pilot.press("space")
            await pilot.pause()
            assert not player.playing and not app.view.following
            await pilot.press("p")
            await pilot.pause()
            assert player.playing and app.view.following
    finally:
        player.close()


def test_load_keymap_reads_lists_and_strings(tmp_path: Path) -> None:
    path = tmp_path / "keymap.toml"
    assert load_keymap(path) == {}  # none there: the defaults
    path.write_text('play = "p"\nzoom-in = ["plus", "i"]\nhelp = "h,?"\n')
    assert load_keymap(path) == {"play": "p", "zoom-in": "plus,i", "help": "h,?"}


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("play = ", "is not TOML"),
        ('jump = "j"\n', "names 'jump': gpuwatch has"),
        ("play = 3\n", "something other than keys"),
        ('play = ["p", ""]\n', "something other than keys"),
        ('play = "p q"\n', "something other than keys"),
        ('play = "\\u001b[2J"\n', "something other than keys"),
        ("[keys]\nplay = 'p'\n", "names 'keys'"),
    ],
)
def test_a_bad_keymap_is_one_line(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "keymap.toml"
    path.write_text(text)
    with pytest.raises(KeymapError) as raised:
        load_keymap(path)
    assert said in str(raised.value) and "\n" not in str(raised.value)


def test_the_keymap_lives_in_the_config_directory(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("GPUWATCH_KEYMAP", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert keymap_path() == tmp_path / "gpuwatch" / "keymap.toml"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert keymap_path() == tmp_path / ".config" / "gpuwatch" / "keymap.toml"


def test_the_cli_says_a_bad_keymap_in_one_line_and_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "gpuwatch"
    config.mkdir()
    (config / "keymap.toml").write_text("play = [1]\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CONFIG_HOME": str(tmp_path)}
    env.pop("GPUWATCH_KEYMAP", None)
    result = run_gpuwatch("replay", str(SAMPLE), env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "keymap.toml gives 'play' something other than keys" in lines[0]
