"""The instrumented process's panel comes first, whatever device it trains on (issue 37,
item 10): a CPU-only run on a machine with GPUs shows its phases on the first screen.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import synthetic
from conftest import until

from gpuwatch.protocol import Message
from gpuwatch.session import Device, Session, gpu_key
from gpuwatch.tui.app import GpuwatchApp

SIZES = [(80, 24), (120, 40), (220, 60)]
MS = 10**6
PID = 4242
OTHER = "GPU-22222222-3333-4444-5555-666666666666"


def gpus_and_a_cpu_run(with_run: bool = True) -> Session:
    """Two GPUs that nobody instrumented, and a training run on the CPU."""
    s = synthetic.build(with_process=False)
    s.add_device(Device(gpu_key(OTHER), "gpu", index=1, name="NVIDIA H100", uuid=OTHER))
    if with_run:
        cpu_run(s)
    return s


def cpu_run(s: Session) -> None:
    seq = iter(range(1, 1000))

    def msg(kind: str, t_ms: int, **body: object) -> None:
        s.ingest(Message(kind=kind, pid=PID, seq=next(seq), t=t_ms * MS, body=body))

    msg("hello", 0, argv=["train_cpu.py"], torch="2.13.0", devices=[])
    for i, (name, a, b) in enumerate((("forward", 100, 900), ("backward", 1000, 1900))):
        msg("phase", a, event="begin", name=name, id=i + 1, depth=0, step=0)
        msg("phase", b, event="end", name=name, id=i + 1, depth=0, step=0)
    s.add_rss(PID, 500 * MS, 2 << 30)


def first_screen(app: GpuwatchApp):
    """The panel the first screen shows on top (the focused one on a short terminal)."""
    panels = app.dashboard.panels
    shown = [p for p in panels if p.region.height > 0 and p.region.y < app.size.height]
    return panels[0], min(shown, key=lambda p: p.region.y, default=None)


def band_text(panel) -> str:
    return "\n".join(str(strip.text) for strip in panel.band.render_lines(panel.band.region))


@pytest.mark.parametrize("size", SIZES)
async def test_a_cpu_run_on_a_gpu_machine_shows_its_phases_first(size) -> None:
    app = GpuwatchApp(gpus_and_a_cpu_run(), theme_name="gpuwatch-dark")
    async with app.run_test(size=size) as pilot:
        app.view = replace(app.view, cursor=500 * MS)
        await pilot.pause()
        first, top = first_screen(app)
        assert first.is_host and top is first
        assert first.has_focus_within
        assert not first.has_class("-secondary")  # a full panel, not the host's strip
        if app.dashboard.short:
            assert first.place.startswith("1/3")
        assert "forward" in app.export_screenshot()


async def test_the_host_moves_first_when_a_cpu_run_says_hello_live() -> None:
    s = gpus_and_a_cpu_run(with_run=False)
    app = GpuwatchApp(s, theme_name="gpuwatch-dark")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert not app.dashboard.panels[0].is_host  # nothing instrumented yet: GPUs by index
        cpu_run(s)

        def host_first() -> bool:
            first, top = first_screen(app)
            return first.is_host and top is first and first.has_focus_within

        # The panels are rearranged at TABLE_HZ, then laid out.
        assert await until(pilot, host_first)
        # It gave way to the run's phases (issue 38's, by g).
        assert not app.dashboard.overview_shown
        await pilot.press("g")
        await pilot.pause()
        assert app.dashboard.overview_shown and app.focused is app.dashboard.overview


async def test_gpu_training_keeps_its_gpu_first() -> None:
    s = synthetic.build()
    s.add_device(Device(gpu_key(OTHER), "gpu", index=1, name="NVIDIA H100", uuid=OTHER))
    app = GpuwatchApp(s, theme_name="gpuwatch-dark")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        keys = [p.key for p in app.dashboard.panels]
        assert keys[0] == gpu_key(synthetic.UUID) and keys[-1] == "host"
        assert next(p for p in app.dashboard.panels if p.is_host).has_class("-secondary")
