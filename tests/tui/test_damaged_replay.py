"""A damaged or hostile recording never shows a negative figure (issue 37, item 5).

``info`` and ``export`` refuse a file with a damaged chunk; ``replay`` reads around it and
says so. The damaged chunk's rows read as unknown, shown as n/a; a count stored negative
by a hostile file reads as unknown too.
"""

from __future__ import annotations

import re
import sqlite3
import struct
from dataclasses import replace
from pathlib import Path

import pytest
import synthetic
from conftest import ROOT, until

from gpuwatch.session import MISSING_INT
from gpuwatch.store import save_session
from gpuwatch.store.player import open_replay
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.replay import replay_app

SPIKE = ROOT / "samples" / "gpt-2.7b-h100-adamw-spike.gpuwatch"
SIZES = [(80, 24), (120, 40), (220, 60)]
NEGATIVE = re.compile(r"-\d[\d.]* (?:GiB|MiB|KiB)")


def damaged(tmp_path: Path) -> Path:
    """The issue's file: the 2.7B sample with 64 bytes XORed in the middle of the NVML
    block (docs/recording.md, codec 2) that holds the opening cursor."""
    player = open_replay(SPIKE)
    try:
        cursor = player.opening().cursor
    finally:
        player.close()
    with sqlite3.connect(SPIKE) as db:
        [(data,)] = db.execute(
            "SELECT c.data FROM chunks c JOIN series s ON s.id = c.series WHERE s.kind = 'gpu'"
        ).fetchall()
    (count,) = struct.unpack_from("<I", data)
    table = [struct.unpack_from("<IIq", data, 4 + 16 * i) for i in range(count)]
    start = 4 + 16 * count
    for _, size, t_first in table:
        if t_first > cursor:
            break
        block, start = (start, size), start + size
    raw = SPIKE.read_bytes()
    assert raw.count(data) == 1  # the chunk lies whole in one place of the file
    at = raw.index(data) + block[0] + block[1] // 2
    path = tmp_path / "damaged.gpuwatch"
    path.write_bytes(raw[:at] + bytes(b ^ 0xFF for b in raw[at : at + 64]) + raw[at + 64 :])
    return path


def screen_text(app: GpuwatchApp) -> str:
    headers = [str(p.header.render()) for p in app.dashboard.panels]
    legends = [str(p.legend.render()) for p in app.dashboard.panels]
    return "\n".join(headers + legends)


@pytest.mark.parametrize("size", SIZES)
async def test_a_damaged_chunk_reads_as_unknown_never_negative(tmp_path: Path, size) -> None:
    player = open_replay(damaged(tmp_path))
    try:
        app = replay_app(player, subtitle="replay damaged.gpuwatch")
        async with app.run_test(size=size) as pilot:
            # The opening cursor lies in the damaged chunk: its figures are unknown, once
            # the first frame has drawn the panel.
            def gpu_header() -> str:
                gpus = [p for p in app.dashboard.panels if not p.is_host]
                return str(gpus[0].header.render()) if gpus else ""

            assert await until(pilot, lambda: "n/a / n/a" in gpu_header()), gpu_header()
            assert not NEGATIVE.search(screen_text(app)), screen_text(app)
            assert any("damaged" in note for note in app.session.notes)
            # And everywhere along the recording.
            for _ in range(12):
                await pilot.press("right")
                await pilot.pause()
                assert not NEGATIVE.search(screen_text(app)), screen_text(app)
    finally:
        player.close()


async def test_a_negative_count_in_a_file_reads_as_unknown(tmp_path: Path) -> None:
    s = synthetic.build()
    key = next(iter(s.gpu))
    t = synthetic.end_time() + 10**8
    row = {"t": t, "used": -(8 << 30), "free": -1, "total": 80 << 30}
    s.add_gpu_sample(key, {**row, "reserved": 0})
    path = save_session(s, tmp_path / "hostile.gpuwatch")
    player = open_replay(path)
    try:
        player.loader.load_all()
        got = player.session.gpu[key].at(t)
        assert got is not None
        assert got["used"] == MISSING_INT and got["free"] == MISSING_INT
        assert got["total"] == 80 << 30  # honest figures stay
        app = replay_app(player, subtitle="replay hostile.gpuwatch")
        async with app.run_test(size=(120, 40)) as pilot:
            app.view = replace(app.view, cursor=t)
            await pilot.pause()
            gpu = next(p for p in app.dashboard.panels if not p.is_host)
            assert str(gpu.header.render()).startswith("n/a / 80.00 GiB")
            assert not NEGATIVE.search(screen_text(app))
    finally:
        player.close()
