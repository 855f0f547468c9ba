"""README's first command, for every shipped sample, in a real terminal at 80x24 and 200x60.

``gpuwatch replay samples/<file>`` must open on the data: the first screen, before any
key, names the phases (forward, backward), the lines (allocated, reserved; the host's
RAM and RSS for the CPU recording) and the exact peak the recording is about; ``q``
leaves with status 0.
"""

from __future__ import annotations

import os
import shlex
import sys

import pytest
from conftest import ROOT, wait_for
from tmuxhelp import Tmux

pytestmark = pytest.mark.tmux

SAMPLES = ROOT / "samples"

# What each sample's first screen must show: the words, and the exact per-phase peak
# (as `gpuwatch info` reports it) where the recording has one.
FIRST_SCREEN = {
    "gpt-2.7b-h100-adamw-spike.gpuwatch": ("allocated", "reserved", "53.61 GiB"),
    "gpt2-small-h100.gpuwatch": ("allocated", "reserved", "19.77 GiB"),
    "gpt2-small-h100-oom.gpuwatch": ("allocated", "reserved", "19.77 GiB", "OOM"),
    # No GPU: host RAM and the script's RSS, and the recording's own note about it.
    "tiny-gpt-cpu-sdpa.gpuwatch": ("RAM used", "RSS", "recorded on vm: no NVIDIA driver"),
}
SIZES = {"80x24": (80, 24), "200x60": (200, 60)}


def test_every_sample_is_covered() -> None:
    assert sorted(FIRST_SCREEN) == sorted(p.name for p in SAMPLES.glob("*.gpuwatch"))


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", sorted(FIRST_SCREEN))
def test_replay_opens_on_the_data(name: str, size: str, tmp_path) -> None:
    env = {
        "PYTHONPATH": str(ROOT),
        "TERM": "xterm-256color",
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
    }
    width, height = SIZES[size]
    command = f"{shlex.quote(sys.executable)} -m gpuwatch replay {shlex.quote(str(SAMPLES / name))}"
    tmux = Tmux(command, env, width=width, height=height)
    try:
        assert tmux.wait_for_text("REPLAY paused"), tmux.screen()
        # Help and quit on the key bar: nothing at the terminal's edge is lost.
        expected = ("forward", "backward", *FIRST_SCREEN[name], "? Help", "q Quit")
        # No key pressed: the first screen, once drawn, shows all of it.
        shown = wait_for(lambda: all(text in tmux.screen() for text in expected), 30, 0.2)
        screen = tmux.screen()
        assert shown, f"{[t for t in expected if t not in screen]} not on:\n{screen}"
        tmux.keys("q")
        assert tmux.wait_for_text("EXIT=0"), tmux.screen()
    finally:
        tmux.close()
