"""Issue 38's overview on the real CLI in tmux: 8 fake GPUs (GPU 1 in MIG mode with three
instances) at 80x24 and 200x50 open on the overview; enter opens a GPU's panel, g comes
back; each MIG instance is a row with its own memory, as the fake NVML reports it; the
recording keeps the instances as devices."""

from __future__ import annotations

import shlex
import sys

import pytest
from conftest import fake_nvml_env
from fake_nvml import FakeNvml
from tmuxhelp import Tmux

from gpuwatch.store import load

pytestmark = pytest.mark.tmux

GIB = 1 << 30
SPEC = {"gpus": 8, "trace": "flat", "mig": [[1, 3]]}


def _line(screen: str, start: str) -> str:
    """The overview's row whose first word (past the selection mark) is ``start``."""
    for line in screen.splitlines():
        words = [w for w in line.split() if w != "▸"]
        if words[:1] == [start]:
            return line
    return ""


@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=["80x24", "200x50"])
def test_eight_gpus_open_on_the_overview(tmp_path, sub_env, size) -> None:
    env = fake_nvml_env(sub_env, SPEC)
    fake = FakeNvml.from_spec(SPEC)  # the same GPUs, to read what they report
    record = tmp_path / "eight.gpuwatch"
    shown = {k: env[k] for k in ("PYTHONPATH", "GPUWATCH_SOCKET", "PATH", "HOME")}
    shown.update(
        {k: env[k] for k in ("GPUWATCH_NVML_BACKEND", "GPUWATCH_FAKE_NVML")},
        TERM="xterm-256color",
    )
    cmd = f"{shlex.quote(sys.executable)} -m gpuwatch --record {record}"
    tmux = Tmux(cmd, shown, width=size[0], height=size[1])
    try:
        assert tmux.wait_for_text("top process"), tmux.screen()
        assert tmux.wait_for_text("/20G"), tmux.screen()
        screen = tmux.screen()
        for i in range(8):
            assert "/80G" in _line(screen, str(i)), (i, screen)
        for slot, instance in enumerate(fake.gpus[1].mig or []):
            row = _line(screen, f"1.{slot}")
            own = f"{instance.used / GIB:.1f}/{instance.total / GIB:.0f}G"
            assert own in row and "MIG" in row, (own, screen)
        assert "CPU " in _line(screen, "host"), screen
        assert "enter Open GPU" in screen
        tmux.keys("Down", "Down", "Enter")  # GPU 1's first instance
        assert tmux.wait_for_text("GPU 1.0 · "), tmux.screen()
        assert tmux.wait_for_gone("top process"), tmux.screen()
        tmux.keys("g")
        assert tmux.wait_for_text("top process"), tmux.screen()
        assert "▸" in _line(tmux.screen(), "1.0"), tmux.screen()  # back where it was
        tmux.keys("q")
        assert tmux.wait_for_text("EXIT=0"), tmux.screen()
    finally:
        tmux.close()
    devices = load(record).devices
    migs = sorted((d.mig[1], d.total) for d in devices.values() if d.mig is not None)
    assert migs == [(slot, g.total) for slot, g in enumerate(fake.gpus[1].mig or [])]
