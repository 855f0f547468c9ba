"""Untrusted text never reaches the terminal raw, and a failed recording says so on screen.

Phase names, marks, argv, host and device names, notes, labels and OOM messages come from
datagrams and from recordings people share. Shown in the CLI or the dashboard, control
characters become visible escapes and Rich markup is shown as typed; exports keep the raw
text.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import synthetic
from conftest import run_cli, until, wait_for

from gpuwatch.fmt import printable
from gpuwatch.protocol import Message
from gpuwatch.session import Device, Session
from gpuwatch.store import Recorder, save_session
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.tables import PeaksTable

TITLE = "\x1b]0;pwned\x07"  # sets the terminal's (tmux pane's) title
CLEAR = "\x1b[2J"  # blanks the screen
EVIL_NAME = f"[red]fwd[/red]{TITLE}"
EVIL_TEXT = f"checkpoint {TITLE}{CLEAR} done\u202e"


def hostile_session() -> Session:
    s = synthetic.build()
    pid = synthetic.PID
    t = synthetic.end_time() - 10**8
    msgs = [
        Message(
            "hello",
            pid,
            1000,
            t,
            body={"argv": [f"train.py{CLEAR}", TITLE], "hostname": f"node{TITLE}"},
        ),
        Message(
            "phase",
            pid,
            1001,
            t,
            body={
                "event": "begin",
                "name": EVIL_NAME,
                "id": 999,
                "parent": None,
                "depth": 0,
                "step": 5,
            },
        ),
        Message(
            "phase",
            pid,
            1002,
            t + 10**7,
            body={
                "event": "end",
                "name": EVIL_NAME,
                "id": 999,
                "parent": None,
                "depth": 0,
                "step": 5,
            },
        ),
        Message("mark", pid, 1003, t, body={"text": EVIL_TEXT, "level": "info"}),
        Message(
            "oom",
            pid,
            1004,
            t,
            body={"message": f"CUDA out of memory{CLEAR}\nmore", "phase": EVIL_NAME, "step": 5},
        ),
    ]
    for m in msgs:
        s.ingest(m)
    s.note(f"note {TITLE}")
    s.add_device(
        Device("host", "host", name=f"box{TITLE}", total=64 * synthetic.GIB, source="host")
    )
    return s


def test_printable_escapes_every_control_and_keeps_plain_text() -> None:
    assert printable("forward") == "forward"
    assert printable(TITLE) == "\\x1b]0;pwned\\x07"
    assert printable("a\tb\nc\r") == "a\\tb\\nc\\r"
    assert printable("\x9b31m") == "\\x9b31m"  # C1 CSI
    assert printable("abc\u202edef") == "abc\\u202edef"  # right-to-left override
    assert printable(os.fsdecode(b"caf\xe9.gpuwatch")) == "caf\\xe9.gpuwatch"
    assert printable("naïve ünïcode ✓") == "naïve ünïcode ✓"


def test_info_prints_no_escape_and_export_keeps_the_raw_text(tmp_path: Path) -> None:
    path = save_session(hostile_session(), tmp_path / f"evil{CLEAR}.gpuwatch", label=TITLE)
    result = run_cli("info", str(path))
    assert result.returncode == 0, result.stderr
    for out in (result.stdout, result.stderr):
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "[red]fwd[/red]\\x1b]0;pwned\\x07" in result.stdout  # shown as typed
    assert "CUDA out of memory\\x1b[2J" in result.stdout  # first line only, escaped
    as_json = run_cli("info", "--json", str(path))
    assert json.loads(as_json.stdout)["label"] == TITLE  # JSON escapes, and keeps it exact
    out = tmp_path / "export"
    assert run_cli("export", str(path), "--out", str(out)).returncode == 0
    with open(out / "events.csv", newline="") as f:
        texts = [row["body"] for row in csv.DictReader(f)]
    assert any(EVIL_TEXT in json.loads(body).get("text", "") for body in texts)


async def test_the_dashboard_shows_hostile_text_escaped() -> None:
    session = hostile_session()
    subtitle = f"replay evil{TITLE}[b]x[/b] [$warning]w"
    app = GpuwatchApp(session, clock=lambda: synthetic.end_time(), subtitle=subtitle)
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.pause()
        screen = app.export_screenshot()
        assert "\x1b]0;" not in screen and "\x07" not in screen
        status = str(app.dashboard.status_bar.render())
        assert "[b]x[/b]" in status and "\\x1b]0;pwned" in status
        assert "[$warning]w" in status  # a Textual variable is text too
        assert "\\x1b]0;pwned" in str(app.dashboard.notes_bar.render())
        await pilot.press("2")
        await pilot.pause()
        table = app.query_one(PeaksTable)
        names = {str(table.get_row_at(i)[1]) for i in range(table.row_count)}
        assert printable(EVIL_NAME) in names  # markup shown as typed, not as red "fwd"
        await pilot.press("3")
        await pilot.pause()
        assert "\x1b" not in app.export_screenshot().replace("\x1b[", "")  # SVG has none


@pytest.mark.parametrize("kind", ["phase", "mark"])
def test_band_labels_are_printable(kind: str) -> None:
    from gpuwatch.tui.band import _label

    assert "\x1b" not in _label(EVIL_NAME, 80)


async def test_a_recording_that_stops_says_so_in_the_header(tmp_path: Path) -> None:
    from gpuwatch.live_sources import LiveSources

    session = synthetic.build()
    sources = LiveSources(socket=str(tmp_path / "x.sock"))
    sources.session = session
    recorder = Recorder(session, tmp_path / "r.gpuwatch", interval=0.05)
    # SQLite's own "database or disk is full": the file may not grow one page more.
    pages = recorder.writer._db.execute("PRAGMA page_count").fetchone()[0]
    recorder.writer._db.execute(f"PRAGMA max_page_count={pages}")
    sources.recorder, sources.record_path = recorder, recorder.path
    recorder.start()
    t = synthetic.end_time()
    for i in range(300):  # ~300 KB more than the file may hold
        session.ingest(Message("mark", synthetic.PID, 5000 + i, t, body={"text": "x" * 1000}))
    app = GpuwatchApp(session, clock=lambda: synthetic.end_time(), subtitle=sources.describe)
    async with app.run_test(size=(140, 45)) as pilot:
        assert wait_for(lambda: recorder.error is not None, timeout=10)
        # The next frame says so, in the status bar and the notes.
        assert await until(
            pilot, lambda: "NOT RECORDING (disk full)" in str(app.dashboard.status_bar.render())
        ), str(app.dashboard.status_bar.render())
        assert await until(
            pilot, lambda: "recording stopped: disk full" in str(app.dashboard.notes_bar.render())
        ), str(app.dashboard.notes_bar.render())
    recorder.close()


async def test_a_recording_that_stops_after_the_first_frame_shows_at_once() -> None:
    # The clock stands still (a paused view's frame stays the same too): the status bar is
    # redrawn because what it says changed, not because a frame did. The warning comes
    # first and stays whole on 80 columns, where the subtitle gives way.
    said: dict[str, str | None] = {"warning": None, "subtitle": "recording ~/a · socket /s"}
    app = GpuwatchApp(
        synthetic.build(),
        clock=lambda: synthetic.end_time(),
        subtitle=lambda: str(said["subtitle"]),
        warning=lambda: said["warning"],
    )
    async with app.run_test(size=(80, 24)) as pilot:
        assert await until(pilot, lambda: "recording ~/a" in app.dashboard.status_bar.text)
        said["warning"], said["subtitle"] = "NOT RECORDING (disk full)", "not recording " * 9
        warned = "gpuwatch · LIVE · NOT RECORDING (disk full) · "
        assert await until(pilot, lambda: app.dashboard.status_bar.text.startswith(warned)), (
            app.dashboard.status_bar.text
        )


@pytest.mark.tmux
def test_replay_in_a_real_terminal_keeps_its_title_and_rows(tmp_path: Path) -> None:
    # The reproduction: a shared recording whose phase names and notes carry an
    # OSC title and a screen clear set tmux's pane title and blanked rows.
    import shlex
    import sys

    from conftest import ROOT
    from tmuxhelp import Tmux

    path = save_session(hostile_session(), tmp_path / "evil.gpuwatch", label=TITLE + CLEAR)
    env = {
        "PYTHONPATH": str(ROOT),
        "TERM": "xterm-256color",
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
    }
    tmux = Tmux(f"{shlex.quote(sys.executable)} -m gpuwatch replay {shlex.quote(str(path))}", env)
    try:
        assert tmux.wait_for_text("GPU 0")
        tmux.keys("space")  # pause; the whole recording is in view
        assert tmux.wait_for_text("\\x1b]0;pwned")  # the note, shown escaped
        title = tmux._tmux("display-message", "-p", "-t", "main", "#{pane_title}").strip()
        assert "pwned" not in title
        screen = tmux.screen()
        assert "GPU 0" in screen and "gpuwatch" in screen  # rows were not blanked
        tmux.keys("q")
        assert tmux.wait_for_text("EXIT=0")
    finally:
        tmux.close()


async def test_marks_read_at_the_cursor_and_listed_stay_inert() -> None:
    # Issue 37, item 3: a mark's text and an OOM's phase are shown now (status bar,
    # toasts, the Peaks tab's list): escaped, never markup.
    from gpuwatch.tui.marks import MarksTable

    session = hostile_session()
    app = GpuwatchApp(session, clock=lambda: synthetic.end_time())
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.pause()
        app.view = replace(app.view, cursor=synthetic.end_time() - 10**8 - 1)
        await pilot.press("m")  # the evil mark and OOM share a time: both told
        await pilot.pause()
        told = [n.message for n in app._notifications]
        assert any(printable(EVIL_TEXT) in m for m in told), told
        assert any(printable(EVIL_NAME) in m and "OOM" in m for m in told), told
        status = str(app.dashboard.status_bar.render())
        assert printable(EVIL_NAME) in status or printable(EVIL_TEXT)[:20] in status, status
        await pilot.press("2")
        await pilot.pause()
        table = app.query_one(MarksTable)
        texts = {str(table.get_row_at(i)[3]) for i in range(table.row_count)}
        assert any(printable(EVIL_TEXT) in t for t in texts), texts
        screen = app.export_screenshot()
        assert "\x1b]0;" not in screen and "\x07" not in screen and "\u202e" not in screen
