"""Regenerate the README's screenshots (SVG, exported by Textual itself) from real recordings.

    python docs/screenshots.py

- ``replay-h100-spike.svg``: the first screen of ``gpuwatch replay
  samples/gpt-2.7b-h100-adamw-spike.gpuwatch`` (README's first command), a real H100 run:
  the cursor in the optimizer.step whose exact peak is 53.61 GiB, with its breakdown;
- ``peaks-h100-spike.svg``: the same recording's Peaks tab (key ``2``);
- ``replay-cpu.svg``: the first screen of ``samples/tiny-gpt-cpu-sdpa.gpuwatch``, what a
  machine without a GPU shows;
- ``overview-8-gpus.svg``: the first screen on eight GPUs (GPU 1 in MIG mode), the
  overview, from the tests' deterministic session (``tests/support/many_gpus.py``).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "support")]

from gpuwatch.store.player import open_replay  # noqa: E402
from gpuwatch.tui.app import GpuwatchApp  # noqa: E402
from gpuwatch.tui.replay import replay_app  # noqa: E402

OUT = ROOT / "docs" / "img"
SAMPLES = ROOT / "samples"
SIZE = (150, 44)


async def shoot(sample: str, keys: tuple[str, ...], name: str, size: tuple[int, int]) -> None:
    player = open_replay(SAMPLES / sample)
    try:
        app = replay_app(player, subtitle=f"replay {sample}")
        async with app.run_test(size=size) as pilot:
            await pilot.pause(0.5)
            for key in keys:
                await pilot.press(key)
            await pilot.pause(0.5)
            app.save_screenshot(str(OUT / name))
    finally:
        player.close()
    print("wrote", OUT / name)


async def shoot_overview(name: str, size: tuple[int, int]) -> None:
    import many_gpus

    session = many_gpus.build(8, mig=True)
    app = GpuwatchApp(session, clock=lambda: 3300 * many_gpus.MS)  # inside a forward
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.5)
        app.save_screenshot(str(OUT / name))
    print("wrote", OUT / name)


async def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    spike = "gpt-2.7b-h100-adamw-spike.gpuwatch"
    await shoot(spike, (), "replay-h100-spike.svg", SIZE)
    await shoot(spike, ("2",), "peaks-h100-spike.svg", (150, 30))
    await shoot("tiny-gpt-cpu-sdpa.gpuwatch", (), "replay-cpu.svg", (150, 30))
    await shoot_overview("overview-8-gpus.svg", (120, 20))


if __name__ == "__main__":
    asyncio.run(main())
