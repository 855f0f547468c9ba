"""Regenerate the README's screenshots (SVG, exported by Textual itself).

    python docs/screenshots.py

- ``replay-cpu.svg``: ``gpuwatch replay samples/tiny-gpt-cpu-sdpa.gpuwatch``, a real CPU
  recording of the sample (host RAM and the script's RSS, its phases and marks);
- ``gpu-synthetic.svg`` and ``peaks-synthetic.svg``: the dashboard on the synthetic GPU
  session the test suite uses (tests/synthetic.py): illustrative data, not a real GPU.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import synthetic  # noqa: E402

from gpuwatch.store.player import open_replay  # noqa: E402
from gpuwatch.tui.app import GpuwatchApp  # noqa: E402
from gpuwatch.tui.replay import ReplayApp  # noqa: E402

OUT = ROOT / "docs" / "img"
SIZE = (150, 44)


async def shoot(app, keys: tuple[str, ...], name: str) -> None:
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.5)
        for key in keys:
            await pilot.press(key)
        await pilot.pause(0.5)
        app.save_screenshot(str(OUT / name))
    print("wrote", OUT / name)


async def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    player = open_replay(ROOT / "samples" / "tiny-gpt-cpu-sdpa.gpuwatch")
    player.pause()
    try:
        await shoot(
            ReplayApp(player, subtitle="replay tiny-gpt-cpu-sdpa.gpuwatch"),
            ("w", "m", "m", "m"),
            "replay-cpu.svg",
        )
    finally:
        player.close()
    end = synthetic.end_time()
    keys = ("plus", "plus", "plus", "home", "m", "left", "left", "left", "left")
    await shoot(
        GpuwatchApp(
            synthetic.build(), clock=lambda: end, subtitle="synthetic data from tests/synthetic.py"
        ),
        keys,
        "gpu-synthetic.svg",
    )
    await shoot(
        GpuwatchApp(
            synthetic.build(), clock=lambda: end, subtitle="synthetic data from tests/synthetic.py"
        ),
        ("2",),
        "peaks-synthetic.svg",
    )


if __name__ == "__main__":
    asyncio.run(main())
