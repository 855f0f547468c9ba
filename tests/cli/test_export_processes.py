"""Per-process utilisation and CPU (issue 38) are recorded, replayed and exported; a
recording made before they were added reads them as unknown."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import synthetic
from conftest import ROOT, run_gpuwatch

from gpuwatch.analysis import processes as pr
from gpuwatch.session import gpu_key
from gpuwatch.store import load, save_session

GIB = synthetic.GIB
OLD = ROOT / "tests" / "data" / "gpt2-small-h100-0b9a063.gpuwatch"  # before SM, CPU, RSS


def _env() -> dict[str, str]:
    return {**os.environ, "HOME": os.environ.get("HOME", "/tmp")}


def _session():
    s = synthetic.build()
    key = gpu_key(synthetic.UUID)
    t = synthetic.end_time()
    s.set_proc_info(
        4321, {"name": "python", "user": "alice", "visible": True, "uid": 1000, "ppid": 7}
    )
    s.add_gpu_processes(key, t - 2 * 10**9, [(4321, 3 * GIB, 0, 80.0, 20.0, 101.5, 2 * GIB)])
    s.add_gpu_processes(key, t - 10**9, [(4321, 3 * GIB, 0, 95.0, 25.0, 99.0, 2 * GIB)])
    s.add_rss(synthetic.PID, t - 10**9, GIB, 12.5)
    return s


def test_recorded_replayed_and_exported(tmp_path: Path) -> None:
    path = save_session(_session(), tmp_path / "run.gpuwatch")
    loaded = load(path)
    snap = loaded.gpu_procs[gpu_key(synthetic.UUID)].snapshot()
    mine = snap["pid"] == 4321
    assert snap["sm"][mine].tolist() == [80.0, 95.0]
    assert snap["cpu"][mine].tolist() == [101.5, 99.0]
    assert snap["rss"][mine].tolist() == [2 * GIB, 2 * GIB]
    assert loaded.proc_info[4321]["uid"] == 1000 and loaded.proc_info[4321]["ppid"] == 7
    # The replay's Processes rows carry them.
    row = next(r for r in pr.rows(loaded, synthetic.end_time()) if r.pid == 4321)
    assert (row.sm, row.cpu, row.rss, row.user) == (95.0, 99.0, 2 * GIB, "alice")
    out = tmp_path / "out"
    done = run_gpuwatch("export", str(path), "--out", str(out), "--format", "jsonl", env=_env())
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (out / "gpu_processes.jsonl").read_text().splitlines()]
    mine_rows = [r for r in rows if r["pid"] == 4321]
    assert [(r["sm"], r["mem_util"], r["cpu"], r["rss"]) for r in mine_rows] == [
        (80.0, 20.0, 101.5, 2 * GIB),
        (95.0, 25.0, 99.0, 2 * GIB),
    ]
    rss = [json.loads(line) for line in (out / "rss.jsonl").read_text().splitlines()]
    assert [r["cpu"] for r in rss if r["t"] == synthetic.end_time() - 10**9] == [12.5]


def test_a_recording_from_before_reads_them_as_unknown(tmp_path: Path) -> None:
    loaded = load(OLD)
    tables = [t.snapshot() for t in loaded.gpu_procs.values()]
    assert any(len(t["pid"]) for t in tables)
    for t in tables:
        assert np.isnan(t["sm"]).all() and np.isnan(t["cpu"]).all()
    out = tmp_path / "out"
    done = run_gpuwatch("export", str(OLD), "--out", str(out), env=_env())
    assert done.returncode == 0, done.stderr
    with open(out / "gpu_processes.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["sm"] == "" and r["cpu"] == "" and r["rss"] == "" for r in rows)
    assert all(r["used"] for r in rows)  # what the file has is still there
