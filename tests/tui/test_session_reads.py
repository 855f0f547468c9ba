"""Issue 53: each frame draws from what it read of the session in one read under its lock.

No widget reaches into the session's containers outside
:meth:`~gpuwatch.session.Session.read` (or :meth:`~gpuwatch.session.Session.frame_state`):
the session here is one whose containers and queries note every use made without the lock
with the dashboard's code (``gpuwatch.tui``) on the stack (what it calls reads for it),
while the real app under Pilot draws a replay's panels, its tabs, a process's screen, the
overview of eight GPUs and a job's ranks. A frame's reads are counted: one for the frame's
state, one for the predicted lines, one a panel drawn.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import many_gpus
import pytest
import rank_session as rs
from conftest import ROOT, until

from gpuwatch.session import Session
from gpuwatch.store.player import open_replay
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.replay import replay_app

OOM = ROOT / "samples" / "gpt2-small-h100-oom.gpuwatch"
SECOND = 10**9

WATCHED = frozenset(
    (
        # the session's containers
        "devices", "gpu", "gpu_procs", "hosts", "processes", "proc_info", "names",
        "marks", "ooms", "notes", "rejects", "sampler_rate",
        # and its queries over them
        "active", "alive", "events_between", "every_mark", "gpu_window", "host",
        "host_table", "host_window", "mark_count", "mark_times", "now", "phase_at",
        "processes_of_host", "processes_on", "ranked", "running", "runs_at", "span_at",
        "tables", "time_range",
    )
)  # fmt: skip
"""What a frame may read only under the session's lock."""


class Unlocked(Counter[tuple[str, str, str]]):
    """(module, function, name) of each use of :data:`WATCHED` outside the lock."""


def watch(session: Session) -> Unlocked:
    """Make ``session`` note each use of :data:`WATCHED` without its lock, by the
    dashboard's code or what it calls (a class of its own: the same object, the same
    data); noted as the dashboard's frame nearest the use."""
    seen = Unlocked()
    lock = session._lock

    class Watched(type(session)):  # type: ignore[misc]
        def __getattribute__(self, name: str) -> Any:
            if name in WATCHED and not lock._is_owned():  # type: ignore[attr-defined]
                # The dashboard's code anywhere up the stack: what it calls reads for it.
                frame: Any = sys._getframe(1)
                while frame is not None:
                    module = frame.f_globals.get("__name__", "")
                    if module.startswith("gpuwatch.tui"):
                        seen[(module, frame.f_code.co_name, name)] += 1
                        break
                    frame = frame.f_back
            return object.__getattribute__(self, name)

    session.__class__ = Watched
    return seen


@pytest.fixture
def oom_replay() -> Iterator[GpuwatchApp]:
    player = open_replay(OOM)
    player.loader.load_all()
    yield replay_app(player, theme_name="gpuwatch-dark", subtitle="replay")
    player.close()


def test_the_watch_sees_a_read_outside_the_lock() -> None:
    """The check itself: a container read without the lock is noted, one with it is not."""
    session = many_gpus.build(2)
    seen = watch(session)
    code = compile("len(session.devices)", "gpuwatch/tui/x.py", "eval")
    eval(code, {"__name__": "gpuwatch.tui.x", "session": session})
    session.read(lambda: eval(code, {"__name__": "gpuwatch.tui.x", "session": session}))
    assert seen == {("gpuwatch.tui.x", "<module>", "devices"): 1}


async def test_a_replay_frame_and_its_tabs_read_only_under_the_lock(
    oom_replay: GpuwatchApp,
) -> None:
    app = oom_replay
    app.animation_level = "none"  # Pilot waits out each tab's sliding underline otherwise
    seen = watch(app.session)
    async with app.run_test(size=(160, 50)) as pilot:
        dash = app.dashboard
        assert await until(pilot, lambda: dash.redraws > 0 and bool(dash.panels))
        app.view = replace(app.view, cursor=app.session.t_origin + 5 * SECOND)
        await pilot.pause()
        # Play, home, jump to the OOM (which pauses), fit the y axis, step back a mark
        # and through phase boundaries, then the tabs.
        for key in ("space", "home", "o", "y", "M", "[", "]", "2", "3"):
            await pilot.press(key)
            await pilot.pause(0.1)
        assert await until(pilot, lambda: dash.process_table.row_count > 0)
        await pilot.press("enter")  # a process's own screen
        assert await until(pilot, lambda: type(app.screen).__name__ == "ProcessScreen")
        frames = dash.redraws
        dash.redraw()
        assert await until(pilot, lambda: dash.redraws > frames)
        for key in ("escape", "escape", "1", "tab", "w", "s"):
            await pilot.press(key)
            await pilot.pause(0.1)
        dash.redraw()
        await pilot.pause(0.2)
    assert dict(seen) == {}


async def test_the_overview_and_a_panel_read_only_under_the_lock() -> None:
    session = many_gpus.build(8)
    seen = watch(session)
    app = GpuwatchApp(session, clock=lambda: many_gpus.END_MS * many_gpus.MS)
    async with app.run_test(size=(80, 24)) as pilot:
        assert await until(pilot, lambda: app.dashboard.overview_shown)
        await pilot.press("down", "enter")
        assert await until(pilot, lambda: not app.dashboard.overview_shown)
        await pilot.press("y", "escape")
        await pilot.pause(0.2)
    assert dict(seen) == {}


async def test_the_ranks_tab_reads_only_under_the_lock() -> None:
    session = rs.build()
    end = session.time_range()[1]
    seen = watch(session)
    app = GpuwatchApp(session, clock=lambda: end)
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.pause(0.3)
        await pilot.press("5")
        assert await until(pilot, lambda: bool(app.dashboard.ranks_view.tables))
        await pilot.press("1")
        await pilot.pause(0.2)
    assert dict(seen) == {}


async def test_a_frame_reads_once_for_its_state_once_for_the_lines_and_once_a_panel(
    oom_replay: GpuwatchApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = oom_replay
    async with app.run_test(size=(160, 50)) as pilot:
        dash = app.dashboard
        assert await until(pilot, lambda: dash.redraws > 0 and bool(dash.panels))
        await pilot.pause(0.2)
        reads: list[str] = []
        session = app.session
        read, state = session.read, session.frame_state

        def counted_read(fn: Any) -> Any:
            reads.append("read")
            return read(fn)

        def counted_state(window_of: Any) -> Any:
            reads.append("frame_state")
            return state(window_of)

        await pilot.press("f")  # paused: a frame only when asked for
        app.view = replace(app.view, cursor=session.t_origin + 3 * SECOND)
        await pilot.pause(0.2)
        monkeypatch.setattr(session, "read", counted_read)
        monkeypatch.setattr(session, "frame_state", counted_state)
        # A new cursor: every panel draws anew (no resize, so no fetch between frames).
        frames = dash.redraws
        app.view = replace(app.view, cursor=session.t_origin + 4 * SECOND)
        assert dash.redraws == frames + 1
        drawn = len(dash.panels) - len(dash.panel_list.behind)
        assert drawn >= 2  # the GPU's panel and the host's
        assert reads == ["frame_state", "read", *["read"] * drawn], (reads, drawn)
