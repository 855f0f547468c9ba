"""Real processes: ``gpuwatch record`` next to the CPU sample, SIGKILL, info, export, live."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, no_gpu_env, run_gpuwatch, run_sample, start_sample, wait_for
from store_data import populated_session

from gpuwatch.live_sources import LiveSources, SourcesError
from gpuwatch.store import load, open_recording, save_session
from gpuwatch.store.export import TABLES
from gpuwatch.store.sessions import default_recording_path


def _gpuwatch(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuwatch", *args],
        env=env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return run_gpuwatch(*args, env=env)


def _start_recorder(env: dict[str, str], sock_path: str, out: Path) -> subprocess.Popen:
    proc = _gpuwatch(env, "record", "--out", str(out), "--socket", sock_path)
    assert wait_for(lambda: os.path.exists(sock_path) or proc.poll() is not None, 20)
    assert proc.poll() is None, proc.communicate()
    return proc


@pytest.mark.torch
def test_record_the_cpu_sample_then_info_matches(
    tmp_path: Path, sock_path: str, sub_env: dict[str, str]
) -> None:
    out = tmp_path / "sample.gpuwatch"
    # A machine without a GPU, wherever this runs: NVML sees none, nor does the sample's torch.
    env = no_gpu_env(sub_env)
    recorder = _start_recorder(env, sock_path, out)
    steps, every = 8, 4
    # Sleeping between steps lets the 10 Hz RSS sampler see the process during its phases.
    sample = run_sample(
        env, "--steps", str(steps), "--eval-every", str(every), "--step-sleep", "0.05"
    )
    assert sample.returncode == 0, sample.stderr

    def said_bye() -> bool:  # the sample's last datagrams are in the recording
        try:
            return any(p.ended is not None for p in load(out).processes.values())
        except Exception:  # caught mid-write
            return False

    assert wait_for(said_bye, 60, 0.2)
    recorder.send_signal(signal.SIGINT)
    _, err = recorder.communicate(timeout=30)
    assert recorder.returncode == 0, err
    assert "recorded" in err.splitlines()[-1]

    result = _run(sub_env, "info", str(out), "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["complete"] and info["format"] == "gpuwatch-recording"
    assert "CPU recording" in info["label"]
    (proc,) = info["processes"]
    evals = steps // every
    # Every step: data, forward, backward, optimizer.step, zero_grad; each eval holds a data.
    assert proc["phases"] == {
        "backward": steps,
        "data": steps + evals,
        "eval": evals,
        "forward": steps,
        "optimizer.step": steps,
        "zero_grad": steps,
    }
    assert proc["steps"] == steps and proc["last_step"] == steps - 1
    assert proc["argv"][1:5] == ["--steps", str(steps), "--eval-every", str(every)]
    assert proc["rss_max"] > 10 << 20 and proc["end_s"] is not None
    assert info["marks"] == 1 + evals
    assert info["phases"]["forward"]["count"] == steps
    assert info["phases"]["forward"]["rss_max"] > 10 << 20
    assert info["rejected"] == 0 and info["dropped"] == 0
    assert [d["kind"] for d in info["devices"]] == ["host"]
    text = _run(sub_env, "info", str(out))
    assert text.returncode == 0 and "optimizer.step" in text.stdout


@pytest.mark.torch
def test_sigkill_loses_at_most_about_a_second(
    tmp_path: Path, sock_path: str, sub_env: dict[str, str]
) -> None:
    out = tmp_path / "killed.gpuwatch"
    recorder = _start_recorder(sub_env, sock_path, out)
    sample = start_sample(sub_env, "--steps", "100000", "--step-sleep", "0.01")
    try:

        def has_phases() -> bool:
            try:
                return sum(len(p.phases) for p in load(out).processes.values()) > 20
            except Exception:
                return False

        assert wait_for(has_phases, 60, 0.2)
        time.sleep(1.5)
        killed_at = time.monotonic_ns()
        recorder.send_signal(signal.SIGKILL)
        recorder.wait(10)
    finally:
        sample.kill()
        sample.wait(10)
    rec = open_recording(out)
    assert not rec.complete
    assert not rec.writer_alive()
    rec.close()
    session = load(out)
    newest = session.host.span()[1]
    # Commits come about once a second: at most ~1 s (and a scheduling margin) is lost.
    assert killed_at - newest < 1.6e9, (killed_at - newest) / 1e9
    assert sum(len(p.phases) for p in session.processes.values()) > 20
    info = _run(sub_env, "info", str(out), "--json")
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["complete"] is False


def test_export_round_trips_row_counts(tmp_path: Path, sub_env: dict[str, str]) -> None:
    path = save_session(populated_session(4), tmp_path / "e.gpuwatch")
    session = load(path)
    result = _run(sub_env, "export", str(path), "--format", "csv", "--out", str(tmp_path / "csv"))
    assert result.returncode == 0, result.stderr
    procs = list(session.processes.values())
    expected = {
        "gpu": sum(len(t) for t in session.gpu.values()),
        "gpu_processes": sum(len(t) for t in session.gpu_procs.values()),
        "host": len(session.host),
        "torch": sum(len(p.torch) for p in procs),
        "peaks": sum(len(p.peaks) for p in procs),
        "rss": sum(len(p.rss) for p in procs),
        "phases": sum(len(p.phases) for p in procs),
        "open_phases": sum(len(p.open) for p in procs),
        "marks": len(session.marks),
        "ooms": len(session.ooms),
        "processes": len(procs),
        "devices": len(session.devices),
        "rejects": len(session.rejects),
        "notes": len(session.notes),
    }
    assert sorted(p.stem for p in (tmp_path / "csv").iterdir()) == sorted(TABLES)
    for name, count in expected.items():
        with open(tmp_path / "csv" / f"{name}.csv") as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == count, name
        assert count > 0, name  # the fixture has every kind of fact
    with open(tmp_path / "csv" / "gpu.csv") as f:
        rows = list(csv.DictReader(f))
    assert any(r["used"] == "" for r in rows)  # unknown stays unknown, not a number
    jl = _run(sub_env, "export", str(path), "--format", "jsonl", "--table", "phases")
    assert jl.returncode == 0, jl.stderr
    phases = [json.loads(line) for line in jl.stdout.splitlines()]
    assert len(phases) == expected["phases"]
    names = {session.names[int(n)] for p in procs for n in p.phases.snapshot()["name"]}
    assert {p["name"] for p in phases} == names
    assert all(p["duration_s"] >= 0 and p["t1"] >= p["t0"] for p in phases)


def test_live_sources_record_where_asked(tmp_path: Path, sock_path: str) -> None:
    out = tmp_path / "live.gpuwatch"
    sources = LiveSources(socket=sock_path, interval=0.05)
    sources.record_to(out, label="live test")
    sources.start()
    try:
        assert "recording" in sources.describe()
        assert wait_for(lambda: len(sources.session.host) >= 3, 10)
    finally:
        sources.stop()
    loaded = load(out)
    assert len(loaded.host) == len(sources.session.host)
    assert open_recording(out).label == "live test"

    again = LiveSources(socket=sock_path, interval=0.05)
    again.record_to(out)  # exists, and was asked for explicitly: an error, nothing started
    with pytest.raises(SourcesError, match="already exists"):
        again.start()
    optional = LiveSources(socket=sock_path, interval=0.05)
    optional.record_to(out, optional=True)  # the default location: a note, not an error
    optional.start()
    optional.stop()
    assert any("not recording" in n for n in optional.session.notes)
    assert "not recording" in optional.describe()


def test_default_recording_path_is_in_the_user_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    path = default_recording_path()
    assert path.parent == tmp_path / "gpuwatch" / "sessions"
    assert path.suffix == ".gpuwatch"


def test_shipped_sample_recordings_replay() -> None:
    from gpuwatch.resources import data_dir
    from gpuwatch.store.player import open_replay

    paths = sorted(data_dir("samples").glob("*.gpuwatch"))
    assert len(paths) >= 2
    for path in paths:
        assert path.stat().st_size < 1 << 20
        rec = open_recording(path)
        # Each label says what ran, and where: an H100, or a CPU (no GPU).
        assert rec.complete and ("H100" in rec.label or "CPU recording" in rec.label)
        rec.close()
        session = load(path)
        (proc,) = session.processes.values()
        assert len(proc.phases) > 30 and len(proc.rss) > 10 and len(session.host) > 10
        assert bool(session.gpu) == ("H100" in rec.label)
        player = open_replay(path)  # as on a fresh machine: not followed, paused at the start
        assert not player.growing and not player.playing
        assert player.position() == player.bounds()[0]
        player.close()
