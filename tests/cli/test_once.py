"""``gpuwatch --once`` / ``-1`` (issue 51 item 4) on the fake NVML (8 GPUs, 40 real
processes, memory NVML attributes to no process), piped (no terminal): the text table and
``--json``; beside a running gpuwatch, its session's phases; bad input is one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import fake_nvml_env, run_gpuwatch
from support.phasecheck import HOLD

GIB = 1 << 30
PROCESSES = 40



@pytest.fixture
def machine(sub_env: dict[str, str]):
    """The environment of a machine with 8 fake GPUs and 40 processes on them."""
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(PROCESSES)]
    spec = {
        "gpus": 8,
        "trace": "flat",
        "processes": [[p.pid, GIB, i % 8] for i, p in enumerate(sleepers)],
    }
    try:
        yield fake_nvml_env(sub_env, spec), [p.pid for p in sleepers]
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


def test_once_prints_one_table_without_a_terminal(machine) -> None:
    env, pids = machine
    proc = run_gpuwatch("--once", env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    gpu_rows = [line for line in out.splitlines() if "NVIDIA Fake" in line]
    assert len(gpu_rows) == 8, out
    assert all("/80.0G" in row and "°C" in row and " W" in row for row in gpu_rows), out
    assert "attributes to no process" in out
    listed = {line.split()[0] for line in out.splitlines() if line.split()[:1]}
    assert set(map(str, pids)) <= listed, out
    assert "\x1b" not in out  # no terminal: no escape codes


def test_once_json_is_one_document(machine) -> None:
    env, pids = machine
    proc = run_gpuwatch("-1", "--json", env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["source"] == "NVML"
    assert [g["index"] for g in doc["gpus"]] == list(range(8))
    for g in doc["gpus"]:
        assert g["used"] > 0 and g["total"] == 80 * GIB
        assert {"util", "temp", "power", "torch_reserved", "torch_allocated", "phases"} <= set(g)
    by_pid = {p["pid"]: p for p in doc["processes"]}
    assert set(pids) <= set(by_pid)
    row = by_pid[pids[0]]
    assert row["gpu_mem"] == GIB and row["device"] == "GPU 0" and row["command"]
    assert {"user", "sm", "cpu", "rss", "elapsed", "rank", "phase"} <= set(row)
    assert len(doc["unattributed"]) == 8


def test_once_takes_phases_from_the_running_gpuwatch(machine, tmp_path: Path) -> None:
    env, _ = machine
    release = tmp_path / "release"
    owner = subprocess.Popen(
        [sys.executable, "-m", "gpuwatch", "record", "--out", str(tmp_path / "o.gpuwatch")],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    script = None
    try:
        assert owner.stderr is not None
        assert "recording to" in owner.stderr.readline()
        script = subprocess.Popen([sys.executable, "-c", HOLD, "oncephase", str(release)], env=env)
        doc: dict = {}
        for _ in range(60):  # until the script's phase has reached the owner
            proc = run_gpuwatch("--once", "--json", env=env, timeout=60)
            assert proc.returncode == 0, proc.stderr
            doc = json.loads(proc.stdout)
            if any(p["phase"] == "oncephase" for p in doc["processes"]):
                break
        assert doc["source"] == f"gpuwatch pid {owner.pid}"
        (row,) = [p for p in doc["processes"] if p["pid"] == script.pid]
        assert row["phase"] == "oncephase" and row["device"] == "host"
        text = run_gpuwatch("-1", env=env, timeout=60).stdout
        assert f"gpuwatch pid {owner.pid}" in text and "oncephase" in text
    finally:
        release.touch()
        if script is not None:
            script.wait(30)
        owner.send_signal(2)
        owner.communicate(timeout=60)


@pytest.mark.parametrize(
    "args",
    [("--json",), ("--once", "--record", "x.gpuwatch"), ("-1", "--readonly"), ("-1", "bogus")],
)
def test_bad_input_is_one_line_and_exit_2(machine, args: tuple[str, ...]) -> None:
    env, _ = machine
    proc = run_gpuwatch(*args, env=env, timeout=60)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stdout == ""
