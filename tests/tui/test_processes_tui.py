"""The Processes tab under Pilot, live on the fake NVML with real processes: sort, filter,
tree, signals (a real child receives one after the confirmation; another user's process
is refused) and a process's own timelines, at 80x24 and 200x50.

Another user's process beside the test's own: as root, one the test starts as user 65534;
as anyone else, pid 1 (root's), which the test lists on a GPU and never signals."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import psutil
import pytest
from conftest import until, wait_for
from workers import LAUNCHER
from workers import alive as _alive

from gpuwatch.session import Session
from gpuwatch.sources.gpu import GpuSampler
from gpuwatch.sources.host import HostSampler
from gpuwatch.sources.nvml import Nvml
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.confirm import Confirm
from gpuwatch.tui.process_screen import ProcessScreen
from gpuwatch.tui.processes import ProcessTable
from tests.fake_nvml import FakeNvml, GiB, MiB

SIZES = {"80x24": (80, 24), "200x50": (200, 50)}
NOBODY = 65534

ROOT = os.geteuid() == 0


@dataclass
class World:
    launcher: subprocess.Popen
    workers: list[int]
    other: int  # a process of another user
    other_user: str
    fake: FakeNvml


@contextmanager
def _another_users_process() -> Iterator[tuple[int, str]]:
    """A process of a user other than this one: as root, ``sleep`` started as user 65534;
    else pid 1 (the test only lists it, never signals it)."""
    if ROOT:
        # Not Python: that user may not run this interpreter (it lives under /root).
        other = subprocess.Popen(["sleep", "600"], user=NOBODY, group=NOBODY)
        try:
            yield other.pid, psutil.Process(other.pid).username()
        finally:
            other.kill()
            other.wait()
        return
    init = psutil.Process(1)
    if init.uids().real == os.geteuid():  # a container whose pid 1 is this user's
        pytest.skip("no process of another user is visible here")
    yield 1, init.username()


@contextmanager
def world() -> Iterator[World]:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    try:
        with _another_users_process() as (other, user):
            assert launcher.stdout is not None
            workers = [int(p) for p in launcher.stdout.readline().split()]
            fake = FakeNvml(2)
            fake.gpus[0].used = 18 * GiB + 300 * MiB  # the rest: contexts, under the threshold
            fake.gpus[1].used = 4 * GiB + 300 * MiB
            fake.set_process(0, workers[0], 18 * GiB, sm=91, mem=40)
            fake.set_process(1, workers[1], 3 * GiB, sm=12, mem=5)
            fake.set_process(1, other, 1 * GiB, sm=55, mem=9)
            yield World(launcher, workers, other, user, fake)
    finally:
        launcher.kill()  # SIGKILL: the launcher cannot stop its workers, so they go too
        launcher.wait()
        for pid in workers if "workers" in locals() else ():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextmanager
def dashboard(w: World) -> Iterator[GpuwatchApp]:
    s = Session()
    sampler = GpuSampler(s, nvml=Nvml(w.fake), process_interval=0.2)
    host = HostSampler(s)
    assert sampler.start()
    host.start()
    try:
        # CPU % needs two readings: wait for it on every GPU's newest list.
        assert wait_for(lambda: all(_cpu_known(t) for t in s.gpu_procs.values()), timeout=15)
        yield GpuwatchApp(s)
    finally:
        host.stop()
        sampler.stop()


def cells(table: ProcessTable) -> list[list[str]]:
    return [[str(c) for c in table.get_row_at(r)] for r in range(table.row_count)]


async def open_tab(app, pilot) -> ProcessTable:
    await pilot.press("3")
    table = app.dashboard.process_table
    # The tab's key refreshes its table; its focus and rows are waited for, not assumed.
    assert await until(pilot, lambda: app.focused is table and table.row_count > 0)
    return table


def select(table: ProcessTable, pid: int) -> None:
    row = next(i for i, r in enumerate(table.shown) if r.pid == pid)
    table.move_cursor(row=row, animate=False)


@pytest.mark.parametrize("size", SIZES)
async def test_rows_sort_and_filter(size: str) -> None:
    with world() as w, dashboard(w) as app:
        async with app.run_test(size=SIZES[size]) as pilot:
            table = await open_tab(app, pilot)
            rows = cells(table)
            by_pid = {int(r[0]): r for r in rows}
            a, b = w.workers
            assert set(by_pid) == {a, b, w.other}
            assert by_pid[a][2:5] == ["GPU 0", "18.00 GiB", "91%"]
            assert by_pid[w.other][1] == w.other_user
            assert by_pid[a][5].endswith("%") and by_pid[a][6].endswith("MiB")  # CPU, RSS
            assert "import time" in by_pid[a][10]  # the command, not "pid N"
            # Sort: o cycles the column (GPU -> GPU mem), O reverses it.
            await pilot.press("o")  # GPU memory: the largest first
            await pilot.pause()
            assert table.sort_key == "gpu_mem"
            assert [r.pid for r in table.shown] == [a, b, w.other]
            await pilot.press("O")
            await pilot.pause()
            assert [r.pid for r in table.shown] == [w.other, b, a]
            await pilot.press("o")  # SM %
            await pilot.pause()
            assert [r.pid for r in table.shown] == [a, w.other, b]
            # Filter: "/" opens the line; rows follow each key; escape clears it.
            # The rows holding the other user's name: its own, and the test's where the
            # interpreter's path holds that name too (/root/... holds "root").
            word = w.other_user
            expected = [int(r[0]) for r in cells(table) if word in r[1] or word in r[10]]
            await pilot.press("slash", *word)
            await pilot.pause()
            assert [r.pid for r in table.shown] == expected
            assert w.other in expected and (expected == [w.other] or not ROOT)
            assert table.row_count == len(expected)
            await pilot.press("enter")  # keeps the filter, back in the table
            await pilot.pause()
            assert app.focused is table and table.row_count == len(expected)
            await pilot.press("slash", "escape")
            await pilot.pause()
            assert table.row_count == 3 and table.filter_text == ""


@pytest.mark.parametrize("size", SIZES)
async def test_tree_puts_workers_under_their_launcher(size: str) -> None:
    with world() as w, dashboard(w) as app:
        async with app.run_test(size=SIZES[size]) as pilot:
            table = await open_tab(app, pilot)
            await pilot.press("t")
            await pilot.pause()
            order = [(r.pid, r.depth) for r in table.shown]
            a, b = w.workers
            # As root the other user's process is this test's child, as the launcher is:
            # the test (their parent, described by the sampler) is a root above them.
            # Else the other is pid 1, and the launcher (whose parent lists nothing on a
            # GPU) is a root itself.
            top = 1 if ROOT else 0
            if ROOT:
                assert order[0] == (os.getpid(), 0)
            i = order.index((w.launcher.pid, top))
            assert {order[i + 1], order[i + 2]} == {(a, top + 1), (b, top + 1)}
            assert (w.other, top) in order
            rows = cells(table)
            lead = 3 * top  # the drawing of the levels above ("│  ", "   ")
            assert rows[i + 1][10][lead:].startswith(("├─ ", "└─ ")), rows[i + 1][10]
            assert rows[i + 2][10][lead:].startswith("└─ ")
            assert not table.shown[i].listed  # the launcher uses no GPU: shown for the tree
            await pilot.press("t")
            await pilot.pause()
            assert all(r.depth == 0 and r.listed for r in table.shown)


@pytest.mark.parametrize("size", SIZES)
async def test_a_signal_reaches_the_process_after_the_confirmation(size: str) -> None:
    with world() as w, dashboard(w) as app:
        target = w.workers[1]
        async with app.run_test(size=SIZES[size]) as pilot:
            table = await open_tab(app, pilot)
            select(table, target)
            await pilot.press("T")
            await pilot.pause()
            assert isinstance(app.screen, Confirm)
            assert any(f"pid {target}" in line for line in app.screen.question)
            await pilot.press("n")  # no: nothing is sent
            await pilot.pause(0.3)
            assert os.path.exists(f"/proc/{target}")
            select(table, target)
            await pilot.press("T")
            await pilot.pause()
            await pilot.press("y")
            # The launcher's worker ends by the SIGTERM; the launcher reaps it.
            assert await until(pilot, lambda: not _alive(target))
            said = [n.message for n in app._notifications]
            assert f"sent SIGTERM to pid {target}" in said


async def test_another_users_process_is_refused_in_one_line() -> None:
    """Another user's process is refused in one line, and one's own receives its signal.
    As root, gpuwatch is made user 65534 (the ownership check's uid): the test's own child
    (root's) is refused and the process of user 65534 receives the signal; as anyone
    else, pid 1 (root's) is refused and the test's own child receives it."""
    with world() as w, dashboard(w) as app:
        async with app.run_test(size=SIZES["80x24"]) as pilot:
            table = await open_tab(app, pilot)
            if ROOT:
                table.uid = NOBODY
                refused, owner, allowed = w.workers[0], "root", w.other
            else:
                refused, owner, allowed = w.other, w.other_user, w.workers[0]
            select(table, refused)
            await pilot.press("K")
            await pilot.pause()
            assert not isinstance(app.screen, Confirm)
            said = [n.message for n in app._notifications]
            assert (
                said[-1] == f"pid {refused} belongs to {owner}: only your own processes (root: any)"
            )
            assert "\n" not in said[-1]
            assert _alive(refused)
            select(table, allowed)
            await pilot.press("I")
            await pilot.pause()
            assert isinstance(app.screen, Confirm)
            await pilot.press("y")
            assert await until(pilot, lambda: not _alive(allowed))
            assert f"sent SIGINT to pid {allowed}" in [n.message for n in app._notifications]


async def test_a_replay_sends_no_signal() -> None:
    with world() as w, dashboard(w) as app:
        async with app.run_test(size=SIZES["80x24"]) as pilot:
            table = await open_tab(app, pilot)
            app.session.live = False  # as a replay's session
            select(table, w.workers[0])
            await pilot.press("K")
            await pilot.pause()
            assert not isinstance(app.screen, Confirm)
            said = [n.message for n in app._notifications]
            assert said[-1].startswith("this is a replay")
            assert _alive(w.workers[0])


@pytest.mark.parametrize("size", SIZES)
async def test_enter_opens_the_process_timelines(size: str) -> None:
    with world() as w, dashboard(w) as app:
        target = w.workers[0]
        async with app.run_test(size=SIZES[size]) as pilot:
            table = await open_tab(app, pilot)
            select(table, target)
            await pilot.press("enter")

            def drawn() -> bool:
                # The screen opens, and its header and lines come with its first frame.
                screen = app.screen
                return (
                    isinstance(screen, ProcessScreen)
                    and "SM 91%" in str(screen.header.render())
                    and screen.memory.last_frame is not None
                    and screen.percent.last_frame is not None
                )

            assert await until(pilot, drawn), str(app.screen)
            screen = app.screen
            assert isinstance(screen, ProcessScreen) and screen.pid == target
            header = str(screen.header.render())
            assert "GPU memory 18.00 GiB" in header and "SM 91%" in header, header
            frame = screen.memory.last_frame
            assert frame is not None
            assert _top(frame.series[0]) == 18 * GiB  # its GPU memory line
            pct = screen.percent.last_frame
            assert pct is not None and _top(pct.series[0]) == 91  # its SM % line
            # The dashboard's keys move this screen: zoom halves the window, the cursor shows.
            span = app.view.span
            await pilot.press("plus", "left")
            await pilot.pause()
            assert app.view.span == span // 2 and app.view.cursor is not None
            assert screen.memory.cursor == app.view.cursor
            await pilot.press("escape")  # clears the cursor first
            await pilot.pause()
            assert app.view.cursor is None and app.screen is screen
            await pilot.press("escape")
            await pilot.pause()
            assert app.screen is not screen and app.focused is table


async def test_memory_no_listed_process_holds_is_said() -> None:
    with world() as w:
        w.fake.gpus[1].hidden = 27 * GiB
        with dashboard(w) as app:
            async with app.run_test(size=SIZES["200x50"]) as pilot:
                await open_tab(app, pilot)
                note = str(app.query_one("#process-note").render())
                assert "27." in note and "on GPU 1 used by no listed process" in note, note
                assert "GPU 0" not in note


def _cpu_known(table) -> bool:
    last = table.span()
    snap = table.group_at(last[1]) if last else None
    return snap is not None and bool(np.isfinite(snap["cpu"]).all())


def _top(series) -> float:
    return float(np.nanmax(series.hi))


async def test_help_lists_the_processes_keys() -> None:
    """``?`` names every key of the Processes tab, as the key bar names only a few."""
    from gpuwatch.tui.help import HelpScreen
    from gpuwatch.tui.processes import KEYS

    app = GpuwatchApp(Session())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = app.screen.query_one("Markdown").source
        for _, _, desc in KEYS:
            assert desc in text, desc
        assert "| `/` |" in text and "| `K` |" in text
