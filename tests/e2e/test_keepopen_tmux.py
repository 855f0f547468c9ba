"""Issue 51 in the real CLI in tmux, on the fake NVML: 8 GPUs, 40 real processes (5 a GPU)
and memory NVML attributes to none of them on every GPU; GPU 0 at 97 % of its memory and
utilisation, GPU 1 at 25 %.

The Processes tab at 80x24 shows at least 10 process rows under a heading that stays on
its row frame after frame, and the memory no process explains in one line; at 120 columns
each command is whole; without colour (``NO_COLOR``) a figure at its high level carries
its sign on the overview and in the tab."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import fake_nvml_env
from tmuxhelp import Tmux

pytestmark = pytest.mark.tmux

GIB = 1 << 30
COUNT = 40


def _command(rank: int) -> str:
    """What process ``rank`` runs (its shell stays: the ``:`` after the sleep)."""
    return f"sleep 600; : train.py --model gpt2-xl --rank {rank}"


@contextlib.contextmanager
def _forty() -> Iterator[list[int]]:
    procs = [subprocess.Popen(["/bin/sh", "-c", _command(i)]) for i in range(COUNT)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _rows(pids: list[int], big: bool) -> list[list[int]]:
    """NVML's process list: 5 a GPU; GPU 7's first process holds 20 GiB (all its used memory:
    no memory unexplained there) or 512 MiB (the rest unexplained)."""
    rows = [[pid, (1 + i % 5) * GIB // 2, i % 8] for i, pid in enumerate(pids)]
    rows[7][1] = 20 * GIB if big else GIB // 2
    return rows


def _spec(pids: list[int], listing: Path | None = None) -> dict:
    # GPU 0: 20 GiB (the flat trace) + 57.6 GiB no listed process holds = 97 % of 80 GiB.
    spec = {
        "gpus": 8,
        "trace": "flat",
        "processes": _rows(pids, big=False),
        "proc_util": [[pid, (i * 7) % 100, 5, i % 8] for i, pid in enumerate(pids)],
        "hidden": [[i, int(57.6 * GIB) if i == 0 else 9 * GIB] for i in range(7)],
        "util": [[0, 97, 60], [1, 25, 10]],
    }
    if listing is not None:  # the list read anew at each call, from this file
        spec["processes"] = []
        spec["processes_file"] = str(listing)
        listing.write_text(json.dumps(_rows(pids, big=False)))
    return spec


@contextlib.contextmanager
def _dashboard(
    sub_env: dict[str, str], size: tuple[int, int], listing: Path | None = None, **extra: str
) -> Iterator[Tmux]:
    with _forty() as pids:
        env = fake_nvml_env(sub_env, _spec(pids, listing))
        keep = ("PYTHONPATH", "GPUWATCH_SOCKET", "GPUWATCH_NVML_BACKEND", "GPUWATCH_FAKE_NVML")
        shown = {k: env[k] for k in keep} | {"TERM": "xterm-256color", **extra}
        term = Tmux(f"{shlex.quote(sys.executable)} -m gpuwatch --no-record", shown, *size)
        try:
            term.pids = pids  # type: ignore[attr-defined]
            yield term
        finally:
            term.close()


def _heading(term: Tmux, pids: set[str]) -> int:
    """The row of the tab's heading, checked: 10 process rows or more right under it, and
    the memory no process explains said in one line."""
    screen = term.screen()
    lines = screen.splitlines()
    heading = [i for i, x in enumerate(lines) if re.search(r"\bpid\b.*\bcommand", x)]
    assert len(heading) == 1, screen
    rows = [i for i, x in enumerate(lines) if x.split()[:1] and x.split()[0] in pids]
    assert len(rows) >= 10 and rows[0] == heading[0] + 1, screen
    said = [x for x in lines if "no listed process" in x]
    assert len(said) == 1 and "GPUs 0–" in said[0], screen
    return heading[0]


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_processes_fit_under_a_heading_that_stays(
    sub_env: dict[str, str], tmp_path: Path, size: tuple[int, int]
) -> None:
    listing = tmp_path / "listed.json"
    with _dashboard(sub_env, size, listing) as term:
        assert term.wait_for_text("top process"), term.screen()
        term.keys("3")
        assert term.wait_for_text("40 processes"), term.screen()
        pids = term.pids  # type: ignore[attr-defined]
        term.keys("o")  # GPU memory: the largest first
        assert term.wait_for_text("GPU mem▼"), term.screen()
        shown = {str(p) for p in pids}
        first = _heading(term, shown)
        # GPU 7's memory explained, then not, then explained: the heading stays put.
        for big in (True, False, True):
            listing.write_text(json.dumps(_rows(pids, big)))
            assert term.wait_for_text("GPUs 0–6" if big else "GPUs 0–7"), term.screen()
            assert _heading(term, shown) == first
        term.keys("q")
        assert term.wait_for_text("EXIT=0"), term.screen()


def test_the_whole_command_shows_at_120_columns_and_scrolls(sub_env: dict[str, str]) -> None:
    with _dashboard(sub_env, (120, 40)) as term:
        assert term.wait_for_text("top process"), term.screen()
        term.keys("3")
        assert term.wait_for_text("40 processes"), term.screen()
        pids = term.pids  # type: ignore[attr-defined]
        assert term.wait_for_text(_command(0)), term.screen()
        screen = term.screen()
        for rank, pid in enumerate(pids):
            line = next((x for x in screen.splitlines() if x.split()[:1] == [str(pid)]), None)
            if line is not None:  # in view: its whole command
                assert line.rstrip().endswith(_command(rank)), line
        term.keys("Right")  # nothing to scroll: the commands are whole
        term.keys("Down")
        assert _command(0) in term.screen()


def test_without_colour_a_high_figure_carries_its_sign(sub_env: dict[str, str]) -> None:
    with _dashboard(sub_env, (120, 40), NO_COLOR="1") as term:
        assert term.wait_for_text("top process"), term.screen()
        assert term.wait_for_text("97%!"), term.screen()
        lines = term.screen().splitlines()
        gpu0 = next(x for x in lines if x.split()[:1] in (["0"], ["▸"]) and " 0 " in x[:6])
        gpu1 = next(x for x in lines if x.split()[:1] == ["1"])
        assert "77.6/80G!" in gpu0 and "97%!" in gpu0, gpu0
        assert "!" not in gpu1 and "25%" in gpu1, gpu1
        term.keys("q")
        assert term.wait_for_text("EXIT=0"), term.screen()


def test_thresholds_come_from_the_flags(sub_env: dict[str, str]) -> None:
    """``--gpu-util-thresh 10 20`` makes GPU 1's 25 % high."""
    with _forty() as pids:
        env = fake_nvml_env(sub_env, _spec(pids))
        keep = ("PYTHONPATH", "GPUWATCH_SOCKET", "GPUWATCH_NVML_BACKEND", "GPUWATCH_FAKE_NVML")
        shown = {k: env[k] for k in keep} | {"NO_COLOR": "1", "HOME": os.environ.get("HOME", "/")}
        cmd = f"{shlex.quote(sys.executable)} -m gpuwatch --no-record --gpu-util-thresh 10 20"
        term = Tmux(cmd, shown, 120, 40)
        try:
            assert term.wait_for_text("25%!"), term.screen()
            term.keys("q")
            assert term.wait_for_text("EXIT=0"), term.screen()
        finally:
            term.close()
