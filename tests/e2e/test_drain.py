"""Nothing lost, nothing counted twice: per sender, what it sent is recorded or counted.

Real ``gpuwatch record`` processes, real senders (tests/scripts/burst_sender.py, marks at
10k a second), real recordings read back with ``gpuwatch info --json``. gpuwatch is paused
(SIGSTOP) while the burst runs, so that a backlog is certain however loaded the machine:
when gpuwatch stops, what its relay and the kernel still hold must be recorded (or, past
the drain's time limit, counted as lost), and each event the sender could not deliver is
counted once, under one cause. Counts are asserted, never speed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
from conftest import ROOT, no_gpu_env, record_cmd, run_gpuwatch, wait_for

from gpuwatch.store import open_recording

SENDER = str(ROOT / "tests" / "scripts" / "burst_sender.py")
RATE = "10000"  # marks a second


def _env(sock: str | None = None) -> dict[str, str]:
    env = no_gpu_env({**os.environ, "PYTHONPATH": str(ROOT)})
    env.pop("GPUWATCH_SOCKET", None)
    if sock is not None:
        env["GPUWATCH_SOCKET"] = sock
    return env


def _record(out: Path, sock: str, *command: str) -> subprocess.Popen[str]:
    args = record_cmd(str(out), sock)
    return subprocess.Popen(
        [*args, "--", *command] if command else args,
        env=_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _relay(gpuwatch_pid: int) -> psutil.Process:
    """The relay process of a gpuwatch (it reads the socket while gpuwatch is paused)."""
    (relay,) = [
        p
        for p in psutil.Process(gpuwatch_pid).children()
        if "gpuwatch.sources.relay" in " ".join(p.cmdline())
    ]
    return relay


def _command_ended(gpuwatch_pid: int) -> bool:
    """Whether the command of a gpuwatch has ended: gone, or a zombie its paused gpuwatch
    has not reaped."""
    for p in psutil.Process(gpuwatch_pid).children():
        try:
            if SENDER in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.Error:  # a zombie has no command line: ended
            continue
    return True


def _finish(gw: subprocess.Popen[str]) -> str:
    """Wait for gpuwatch to end (killed if it hangs); its stderr."""
    try:
        _, err = gw.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        gw.kill()
        _, err = gw.communicate()
        raise AssertionError(f"gpuwatch did not stop: {err}")
    return err


def _assert_all_counted(out: Path, report_path: Path) -> dict[str, Any]:
    """Per sender: every message it meant to send (its marks, hello and bye) is recorded,
    or counted once: dropped at send, rejected or lost on the way. Returns its counts."""
    report = json.loads(report_path.read_text())
    pid = report["pid"]
    result = run_gpuwatch("info", "--json", str(out), env=_env())
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    (proc,) = [p for p in info["processes"] if p["pid"] == pid]
    rec = open_recording(out)
    try:
        kinds = Counter(e["kind"] for e in rec.events() if e["pid"] == pid)
    finally:
        rec.close()
    got = {
        "marks": kinds["mark"],
        "hello": kinds["hello"],
        "bye": kinds["bye"],
        "dropped": proc["dropped"],
        "lost": proc["gaps"],
        "rejected": proc.get("rejected", 0),
    }
    recorded = got["marks"] + got["hello"] + got["bye"]
    counted = got["dropped"] + got["lost"] + got["rejected"]
    assert recorded + counted == report["marks"] + 2, (got, report)
    assert got["dropped"] == report["dropped"], (got, report)  # what the client knows
    if not any("too late" in note for note in info["notes"]):
        # gpuwatch took everything in time: nothing was lost on the way, and the bye
        # landed (unless the sender dropped it too: a machine too loaded to read on).
        assert (got["lost"], got["hello"]) == (0, 1), (got, report)
        assert got["bye"] == 1 or report["dropped"] > 0, (got, report)
    return got


def test_a_paused_gpuwatch_records_all_its_finished_command_sent(tmp_path, sock_path) -> None:
    # gpuwatch's main process is paused while its command bursts and exits (its relay
    # reads on); resumed, it must record what the relay holds before it closes the file.
    out, report = tmp_path / "run.gpuwatch", tmp_path / "sender.json"
    gw = _record(out, sock_path, sys.executable, SENDER, str(report), RATE, "2")
    try:
        assert wait_for(lambda: Path(f"{report}.started").exists(), timeout=60)
        gw.send_signal(signal.SIGSTOP)
        assert wait_for(report.exists, timeout=60)
        assert wait_for(lambda: _command_ended(gw.pid), timeout=60)
    finally:
        gw.send_signal(signal.SIGCONT)
    err = _finish(gw)
    assert gw.returncode == 0, err
    got = _assert_all_counted(out, report)
    assert got["marks"] > 0


def test_a_sender_that_finished_just_before_sigint_is_recorded(tmp_path, sock_path) -> None:
    # `gpuwatch record` without a command, stopped by SIGINT right after a sender's burst
    # (gpuwatch paused through it, so that its relay holds a backlog when the signal comes).
    out, report = tmp_path / "rec.gpuwatch", tmp_path / "sender.json"
    gw = _record(out, sock_path)
    try:
        assert wait_for(lambda: os.path.exists(sock_path), timeout=60), gw.stderr
        sender = subprocess.Popen(
            [sys.executable, SENDER, str(report), RATE, "2"],
            env=_env(sock_path),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert wait_for(lambda: Path(f"{report}.started").exists(), timeout=60)
        gw.send_signal(signal.SIGSTOP)
        _, sender_err = sender.communicate(timeout=60)
        assert sender.returncode == 0, sender_err
        gw.send_signal(signal.SIGINT)  # handled once it runs again
    finally:
        gw.send_signal(signal.SIGCONT)
    err = _finish(gw)
    assert gw.returncode == 0, err
    got = _assert_all_counted(out, report)
    assert got["marks"] > 0


def test_drops_at_send_are_counted_once(tmp_path, sock_path) -> None:
    # gpuwatch and its relay both paused for a second mid-burst: the socket's queue stays
    # full, and the sender drops what it cannot send. Those drops are the client's to
    # count; they must not also show as lost on the way (sequence gaps).
    out, report = tmp_path / "run.gpuwatch", tmp_path / "sender.json"
    gw = _record(out, sock_path, sys.executable, SENDER, str(report), RATE, "3")
    paused: list[Any] = []
    try:
        assert wait_for(lambda: Path(f"{report}.started").exists(), timeout=60)
        relay = _relay(gw.pid)
        for p in (gw, relay):
            p.send_signal(signal.SIGSTOP)
            paused.append(p)
        time.sleep(1)
    finally:
        for p in paused:
            p.send_signal(signal.SIGCONT)
    err = _finish(gw)
    assert gw.returncode == 0, err
    got = _assert_all_counted(out, report)
    assert got["dropped"] > 0  # the pause did make the sender drop
