"""Issue 51, items 2, 3 and 8: the Processes tab fits, under Pilot on the fake NVML with 8
GPUs and 40 real processes, memory no process explains on every GPU.

At 80x24: 10 process rows or more, the unexplained memory in one line naming the GPUs, and
a heading that stays on its row while GPU 7's unexplained memory comes and goes; the
command takes the free width and scrolls with ←/→; at 120 columns each command is whole;
the memory sort starts with the largest; one row reads "1 process"."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator

import pytest
from conftest import screen_text, until, wait_for

from gpuwatch.session import Session
from gpuwatch.sources.gpu import GpuSampler
from gpuwatch.sources.host import HostSampler
from gpuwatch.sources.nvml import Nvml
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.processes import ProcessTable
from tests.fake_nvml import FakeNvml, GiB

COUNT = 40


def command(rank: int) -> str:
    return f"sleep 600; : train.py --model gpt2-xl --rank r{rank}"


@contextlib.contextmanager
def live() -> Iterator[tuple[GpuwatchApp, FakeNvml, list[int]]]:
    procs = [subprocess.Popen(["/bin/sh", "-c", command(i)]) for i in range(COUNT)]
    fake = FakeNvml(8)
    for i, p in enumerate(procs):
        fake.set_process(i % 8, p.pid, (1 + i % 5) * GiB // 2, sm=(i * 7) % 100, mem=5)
    for gpu in fake.gpus:
        gpu.used, gpu.hidden = 8 * GiB, 9 * GiB
    s = Session()
    sampler = GpuSampler(s, nvml=Nvml(fake), process_interval=0.2)
    host = HostSampler(s)
    assert sampler.start()
    host.start()
    try:
        assert wait_for(lambda: all(len(t) for t in s.gpu_procs.values()), timeout=15)
        yield GpuwatchApp(s), fake, [p.pid for p in procs]
    finally:
        host.stop()
        sampler.stop()
        for p in procs:
            p.kill()
            p.wait()


async def open_tab(app: GpuwatchApp, pilot) -> ProcessTable:
    await pilot.press("3")
    table = app.query_one(ProcessTable)
    assert await until(pilot, lambda: table.row_count == COUNT, timeout=15)
    await pilot.pause()
    return table


def heading_row(app: GpuwatchApp) -> int:
    rows = [
        i for i, x in enumerate(screen_text(app).splitlines()) if " pid " in x and "command" in x
    ]
    assert len(rows) == 1, screen_text(app)
    return rows[0]


async def test_ten_rows_at_80x24_under_a_heading_that_stays() -> None:
    with live() as (app, fake, pids):
        async with app.run_test(size=(80, 24)) as pilot:
            table = await open_tab(app, pilot)
            first = heading_row(app)
            for hidden in (0, 9 * GiB, 0, 9 * GiB):  # GPU 7's unexplained memory goes, comes
                fake.gpus[7].hidden = hidden
                want = "GPUs 0–6" if hidden == 0 else "GPUs 0–7"
                assert await until(pilot, lambda w=want: w in screen_text(app), timeout=15)
                await pilot.pause()
                text = screen_text(app)
                assert heading_row(app) == first, text
                shown = [x for x in text.splitlines() if x.split()[:1] in ([str(p)] for p in pids)]
                assert len(shown) >= 10, text
                assert sum("no listed process" in x for x in text.splitlines()) == 1, text
            assert table.size.height - 1 >= 10


async def test_the_whole_command_at_120_columns() -> None:
    with live() as (app, _fake, pids):
        async with app.run_test(size=(120, 40)) as pilot:
            await open_tab(app, pilot)
            text = screen_text(app)
            for rank, pid in enumerate(pids):
                line = next((x for x in text.splitlines() if x.split()[:1] == [str(pid)]), None)
                if line is not None:
                    assert line.rstrip().endswith(command(rank)), line


async def test_the_command_scrolls_with_left_and_right() -> None:
    with live() as (app, _fake, pids):
        async with app.run_test(size=(80, 24)) as pilot:
            table = await open_tab(app, pilot)
            row = table.shown[0]
            rank = pids.index(row.pid)
            assert command(rank) not in screen_text(app)  # cut at 80 columns
            for _ in range(8):
                await pilot.press("right")
            await pilot.pause()
            assert table.hscroll > 0
            line = next(x for x in screen_text(app).splitlines() if x.split()[:1] == [str(row.pid)])
            assert line.rstrip().endswith(f"--rank r{rank}"), line  # the end of it, scrolled in
            before = table.hscroll  # as far as the longest command needs, no farther
            await pilot.press("left")
            await pilot.pause()
            assert table.hscroll == max(0, before - 8)


async def test_the_memory_sort_starts_with_the_largest_and_one_process_reads_so() -> None:
    with live() as (app, _fake, _pids):
        async with app.run_test(size=(120, 40)) as pilot:
            table = await open_tab(app, pilot)
            await pilot.press("o")
            await pilot.pause()
            assert table.sort_key == "gpu_mem" and table.reverse
            sizes = [r.gpu_mem for r in table.shown]
            assert sizes == sorted(sizes, reverse=True) and "GPU mem▼" in screen_text(app)
            await pilot.press("slash", *f"r{COUNT - 1}", "enter")
            assert await until(pilot, lambda: table.row_count == 1)
            await pilot.pause()
            assert "1 process " in screen_text(app) and "1 processes" not in screen_text(app)


@pytest.mark.parametrize("width", [80, 120])
async def test_the_note_is_one_line(width: int) -> None:
    with live() as (app, _fake, _pids):
        async with app.run_test(size=(width, 30)) as pilot:
            await open_tab(app, pilot)
            note = app.query_one("#process-note")
            assert note.size.height == 1
            assert "40 processes" in str(note.render())
