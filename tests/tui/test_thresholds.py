"""Issue 51, item 5: colours that warn, live on the fake NVML under Pilot.

GPU 0 holds 77.6 of 80 GiB (97 %) at 97 % utilisation, GPU 1 20 of 80 GiB at 25 %: in every
theme the overview draws GPU 0's figures in the theme's high level (``$gw-level-high``)
and GPU 1's in another colour; the panels' headers and the Processes tab (a process at
97 % SM) do the same; the thresholds move with ``Thresholds``; the host panel's header
says CPU, load, RAM and swap. On main every figure was drawn in the line's own colour."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator

import pytest
from conftest import screen_text, until, wait_for
from rich.segment import Segment
from textual.color import Color

from gpuwatch.session import Session
from gpuwatch.sources.gpu import GpuSampler
from gpuwatch.sources.host import HostSampler
from gpuwatch.sources.nvml import Nvml
from gpuwatch.tui.app import GpuwatchApp
from tests.fake_nvml import FakeNvml, GiB

THEMES = ["gpuwatch-dark", "gpuwatch-light", "gpuwatch-contrast"]


@contextlib.contextmanager
def live(gpus: int, **app_args) -> Iterator[GpuwatchApp]:
    other = subprocess.Popen(["sleep", "600"])
    fake = FakeNvml(gpus)
    fake.gpus[0].used, fake.gpus[0].util = int(77.6 * GiB), (97, 60)
    fake.gpus[1].used, fake.gpus[1].util = 20 * GiB, (25, 10)
    fake.set_process(0, os.getpid(), 2 * GiB, sm=97, mem=40)
    fake.set_process(1, other.pid, 1 * GiB, sm=25, mem=5)
    s = Session()
    sampler = GpuSampler(s, nvml=Nvml(fake), process_interval=0.2)
    host = HostSampler(s)
    assert sampler.start()
    host.start()
    try:
        assert wait_for(lambda: all(len(t) for t in s.gpu_procs.values()), timeout=15)
        yield GpuwatchApp(s, **app_args)
    finally:
        host.stop()
        sampler.stop()
        other.kill()
        other.wait()


def cells(app: GpuwatchApp, text: str, after: str = "") -> list[Segment]:
    """The segments on screen of the first line holding ``after`` and ``text``, from the
    one where ``text`` starts."""
    for line in app.screen._compositor.render_strips():
        plain = "".join(seg.text for seg in line)
        if text in plain and after in plain:
            at, out, start = 0, [], plain.index(text, plain.index(after))
            for seg in line:
                if at + len(seg.text) > start:
                    out.append(seg)
                at += len(seg.text)
            return out
    raise AssertionError(f"{text!r} not on the screen:\n{screen_text(app)}")


def color_of(app: GpuwatchApp, text: str, after: str = "") -> tuple[int, int, int] | None:
    seg = cells(app, text, after)[0]
    color = seg.style.color if seg.style is not None else None
    return None if color is None else tuple(color.get_truecolor())


def theme(app: GpuwatchApp, name: str) -> tuple[int, int, int]:
    return Color.parse(app.theme_variables[name]).rgb


@pytest.mark.parametrize("name", THEMES)
async def test_the_overview_warns_in_every_theme(name: str) -> None:
    with live(8, theme_name=name) as app:
        async with app.run_test(size=(80, 24)) as pilot:
            assert await until(pilot, lambda: "97%" in screen_text(app), timeout=15)
            await pilot.pause()
            high = theme(app, "gw-level-high")
            assert color_of(app, "77.6/80G") == high, screen_text(app)
            assert color_of(app, "97%") == high
            # GPU 1 at 25 %: drawn otherwise (mid), not as the warning.
            assert color_of(app, "25%") == theme(app, "gw-level-mid")
            assert color_of(app, "20.0/80G") != high


async def test_the_panels_and_the_processes_tab_warn() -> None:
    with live(2) as app:
        async with app.run_test(size=(120, 40)) as pilot:
            assert await until(pilot, lambda: "97%" in screen_text(app), timeout=15)
            # Enter is the overview's key: it has the focus once it is placed (under load,
            # a frame or two after its first rows show).
            assert await until(pilot, lambda: app.dashboard.overview.has_focus, timeout=15)
            await pilot.press("enter")  # from the overview (no GPU instrumented): the panels
            assert await until(pilot, lambda: "util 97%" in screen_text(app), timeout=15)
            await pilot.pause()
            high = theme(app, "gw-level-high")
            assert color_of(app, "util 97%") == high
            assert color_of(app, "77.60 GiB / 80.00 GiB") == high
            assert color_of(app, "util 25%") == theme(app, "gw-level-mid")
            # The host's panel: CPU, load, RAM and swap in its header.
            host = next(x for x in screen_text(app).splitlines() if "RAM " in x and "CPU " in x)
            assert "load " in host and ("swap " in host or "no swap" in host), host
            await pilot.press("3")
            assert await until(pilot, lambda: " 97%" in screen_text(app), timeout=15)
            await pilot.pause()
            assert color_of(app, "97%", str(os.getpid())) == high
            assert color_of(app, "25%", "GPU 1") != high


async def test_the_thresholds_move() -> None:
    from gpuwatch.tui.thresholds import Thresholds

    # 25 % above a second threshold of 20: GPU 1 warns too.
    with live(8, thresholds=Thresholds(util=(10, 20))) as app:
        async with app.run_test(size=(80, 24)) as pilot:
            assert await until(pilot, lambda: "25%" in screen_text(app), timeout=15)
            await pilot.pause()
            assert color_of(app, "25%") == theme(app, "gw-level-high")
