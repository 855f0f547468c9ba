"""Issue 26's check of the Ranks view: the real CLI in tmux at 80x24, four ranks on the fake
NVML — rank 0 holds 1 GiB more in eval, rank 2 has a context on GPU 0 — both flagged on
screen, in ``gpuwatch info`` of the recording, and the stray context marked in it."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT, fake_nvml_env, run_gpuwatch
from tmuxhelp import Tmux

from gpuwatch.store import load

pytestmark = pytest.mark.tmux

GIB = 1 << 30
MIB = 1 << 20
RANK = ROOT / "tests" / "scripts" / "fake_rank.py"


def _write(path, rows) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rows))
    os.replace(tmp, path)  # the fake reads it whole or not at all


def test_ranks_view_flags_the_eval_rank_and_the_stray_context(tmp_path, sub_env) -> None:
    listed = tmp_path / "nvml-processes.json"
    _write(listed, [])
    env = fake_nvml_env(sub_env, {"gpus": 4, "trace": "flat", "processes_file": str(listed)})
    record = tmp_path / "job.gpuwatch"
    shown = {k: env[k] for k in ("PYTHONPATH", "GPUWATCH_SOCKET", "PATH", "HOME")}
    shown.update(
        {k: env[k] for k in ("GPUWATCH_NVML_BACKEND", "GPUWATCH_FAKE_NVML")},
        TERM="xterm-256color",
    )
    cmd = f"{shlex.quote(sys.executable)} -m gpuwatch --interval 50 --record {record}"
    tmux = Tmux(cmd, shown, width=80, height=24)
    ranks: list[subprocess.Popen] = []
    try:
        assert tmux.wait_for_text("LIVE"), tmux.screen()
        for k in range(4):
            child_env = {**env, "RANK": str(k), "LOCAL_RANK": str(k), "WORLD_SIZE": "4"}
            ranks.append(
                subprocess.Popen(
                    [sys.executable, str(RANK), "3", "0.05", str(GIB)],
                    env=child_env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for p in ranks:
            assert p.stdout.readline().strip() == "READY"
        # Each rank on its own GPU; rank 2 also on GPU 0 (a context before set_device).
        rows = [[p.pid, 2 * GIB, k] for k, p in enumerate(ranks)]
        _write(listed, [*rows, [ranks[2].pid, 300 * MIB, 0]])
        for p in ranks:
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in ranks:
            assert p.wait(timeout=60) == 0
        tmux.keys("5")
        assert tmux.wait_for_text("! rank 0 eval 1.0G over the median"), tmux.screen()
        assert tmux.wait_for_text("! rank 2: a context on GPU 0 (300M)"), tmux.screen()
        screen = tmux.screen()
        assert "ranks: 4 (world size 4, newest step 2)" in screen
        assert "! 2 faults" in screen
        # A row per rank (found by its pid), the flagged ones marked without colour.
        rows = [next(ln.split() for ln in screen.splitlines() if str(p.pid) in ln) for p in ranks]
        assert [r[0] for r in rows] == ["!0", "1", "!2", "3"], screen
        assert [r[2] for r in rows] == ["0", "1", "2", "3"], screen  # each rank's own GPU
        tmux.keys("q")
        assert tmux.wait_for_text("EXIT=0"), tmux.screen()
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
        tmux.close()
    out = run_gpuwatch("info", str(record))
    assert out.returncode == 0, out.stderr
    assert "ranks: 4 (world size 4, newest step 2)" in out.stdout
    assert "! rank 0 eval peak 5.00 GiB is 1.00 GiB above the median" in out.stdout
    assert f"! rank 2 (pid {ranks[2].pid}) holds 300 MiB on GPU 0, not its own GPU 2" in out.stdout
    out = run_gpuwatch("info", "--json", str(record))
    [job] = json.loads(out.stdout)["ranks"]
    assert job["phases"]["eval"]["max_rank"] == 0
    assert job["phases"]["eval"]["spread_bytes"] == GIB
    assert {(f["kind"], f["rank"]) for f in job["flags"]} == {
        ("above_median", 0),
        ("stray_context", 2),
    }
    # The live session marked the stray context once, in the file.
    marks = [m.text for m in load(record).every_mark() if m.text.startswith("gpuwatch: ")]
    assert len(marks) == 1 and f"rank 2 (pid {ranks[2].pid}) holds" in marks[0], marks
