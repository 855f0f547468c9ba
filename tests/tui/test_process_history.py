"""Issue 51, item 10: a live process's own timelines (enter on the Processes tab) draw its
lines up to now, under Pilot, for a real child process with a fake NVML entry.

NVML's process list is stored when it changes: a steady process (a sleeping child: its
GPU memory, SM %, CPU % and RSS hold still) has no row newer than its first lists. On
main its lines stopped at that row, a stub that scrolled out of the window ("drew
nothing"); its figures hold while the newest list still names it."""

from __future__ import annotations

import subprocess

import numpy as np
from conftest import until, wait_for

from gpuwatch.session import Session
from gpuwatch.sources.gpu import GpuSampler
from gpuwatch.sources.nvml import Nvml
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.process_screen import ProcessScreen
from gpuwatch.tui.processes import ProcessTable
from tests.fake_nvml import FakeNvml, GiB


async def test_a_steady_process_lines_reach_now() -> None:
    child = subprocess.Popen(["sleep", "600"])
    fake = FakeNvml(1)
    fake.gpus[0].used = 6 * GiB
    fake.set_process(0, child.pid, 5 * GiB, sm=40, mem=10)
    s = Session()
    sampler = GpuSampler(s, nvml=Nvml(fake), process_interval=0.2)
    assert sampler.start()
    try:
        table = s.gpu_procs
        assert wait_for(lambda: any(len(t) for t in table.values()), timeout=15)
        app = GpuwatchApp(s)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("3")
            procs = app.query_one(ProcessTable)
            assert await until(pilot, lambda: procs.row_count == 1, timeout=15)
            await pilot.press("enter")
            assert await until(pilot, lambda: isinstance(app.screen, ProcessScreen))
            screen = app.screen
            assert isinstance(screen, ProcessScreen) and screen.pid == child.pid
            (lists,) = table.values()

            def steady_for(seconds: float) -> bool:
                span = lists.span()
                return span is not None and s.now() - span[1] > seconds * 1e9

            # The list has not changed for 3 s (the figures hold still)...
            assert await until(pilot, lambda: steady_for(3), timeout=30)

            def reaches_now() -> bool:
                # A frame drawn since the list held still (a few come a second).
                frame = screen.memory.last_frame
                if frame is None:
                    return False
                hi = frame.series[0].hi
                t0, t1 = screen.memory.window
                now = (min(s.now(), t1) - t0) * len(hi) // (t1 - t0)
                newest = np.flatnonzero(np.isfinite(hi))
                return bool(len(newest)) and newest[-1] >= now - 3

            assert await until(pilot, reaches_now)
            frame = screen.memory.last_frame
            assert frame is not None
            hi = frame.series[0].hi
            # ...and the GPU memory line reaches the column of the newest time at 5 GiB
            # (the window may reach past it: the first minute of a session).
            t0, t1 = screen.memory.window
            now = (min(s.now(), t1) - t0) * len(hi) // (t1 - t0)
            newest = np.flatnonzero(np.isfinite(hi))
            assert len(newest) and newest[-1] >= now - 3, (now, newest)
            assert hi[newest[-1]] == 5 * GiB
            # The percent line too, within the same columns: the frame was drawn before
            # `now` was read (under load, a column or two before).
            pct = screen.percent.last_frame
            assert pct is not None
            held = np.flatnonzero(np.isfinite(pct.series[0].hi))
            assert len(held) and held[-1] >= now - 3, (now, held)
            assert np.isfinite(pct.series[0].hi[newest[-1] - 3 : held[-1] + 1]).all()
    finally:
        sampler.stop()
        child.kill()
        child.wait()
