"""Issue 51 item 1: several views of one machine, on the real CLI in tmux over the fake NVML
(8 GPUs, 40 real processes, memory NVML attributes to no process).

Two dashboards and a ``gpuwatch record`` at once: the first owns the socket, the second
and the recorder attach to it as views; a phase an instrumented script opens appears in
both dashboards; when the owner quits, the view takes over (the phase a script opens then
appears in it) and the recorder's file holds the session before and after, replayable.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import fake_nvml_env, wait_for
from support.phasecheck import HOLD
from tmuxhelp import Tmux

from gpuwatch.store import load

pytestmark = pytest.mark.tmux

GIB = 1 << 30
PROCESSES = 40



class ViewsTmux(Tmux):
    """A :class:`Tmux` on a private server named ``views-<pid>-…``."""

    def __init__(self, command: str, env: dict[str, str], width: int, height: int) -> None:
        self.server = f"views-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        script = f"env -u COLUMNS -u LINES {exports} {command}; echo EXIT=$?; sleep 60"
        self._tmux("new-session", "-d", "-s", "main", "-x", str(width), "-y", str(height), script)


def _sleepers(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(["sleep", "600"]) for _ in range(n)]


def spec_for(pids: list[int]) -> dict[str, object]:
    """8 fake GPUs (20 GiB used each) with ``pids`` on them, 1 GiB each: the rest of each
    GPU's memory NVML attributes to no process."""
    return {
        "gpus": 8,
        "trace": "flat",
        "processes": [[pid, GIB, i % 8] for i, pid in enumerate(pids)],
    }


def _env(sub_env: dict[str, str], pids: list[int]) -> dict[str, str]:
    env = fake_nvml_env(sub_env, spec_for(pids))
    keep = ("PYTHONPATH", "GPUWATCH_SOCKET", "GPUWATCH_NVML_BACKEND", "GPUWATCH_FAKE_NVML")
    keep += ("PATH", "HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR", "XDG_STATE_HOME")
    return {k: env[k] for k in keep if k in env} | {"TERM": "xterm-256color"}


def _hold(env: dict[str, str], phase: str, release: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", HOLD, phase, str(release)], env=env)


def test_two_dashboards_and_a_record_at_once_and_the_owner_quitting(
    tmp_path: Path, sub_env: dict[str, str]
) -> None:
    sleepers = _sleepers(PROCESSES)
    shown = _env(sub_env, [p.pid for p in sleepers])
    env = {**sub_env, **{k: v for k, v in shown.items() if k.startswith("GPUWATCH")}}
    exe = shlex.quote(sys.executable)
    owned = tmp_path / "owner.gpuwatch"
    recorded = tmp_path / "record.gpuwatch"
    release = tmp_path / "release"
    owner = view = None
    scripts: list[subprocess.Popen[bytes]] = []
    record = None
    try:
        owner = ViewsTmux(f"{exe} -m gpuwatch --record {owned}", shown, 200, 50)
        assert owner.wait_for_text(f"recording {owned}", 60), owner.screen()
        view = ViewsTmux(f"{exe} -m gpuwatch --no-record", shown, 200, 50)
        assert view.wait_for_text("view of gpuwatch pid", 60), view.screen()
        assert "EXIT=" not in view.screen()
        record = subprocess.Popen(
            [sys.executable, "-m", "gpuwatch", "record", "--out", str(recorded)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert record.stderr is not None
        said = record.stderr.readline()
        assert "through the gpuwatch" in said, said
        scripts.append(_hold(env, "viewsphase", release))
        for term in (owner, view):
            term.keys("3")  # the Processes tab: the instrumented script's phase
            assert term.wait_for_text("viewsphase", 60), term.screen()
        # The same processes in both (the fake NVML lists the 40 sleepers).
        pids = [str(p.pid) for p in sleepers]
        assert wait_for(lambda: any(p in view.screen() for p in pids), 30), view.screen()
        assert any(p in owner.screen() for p in pids), owner.screen()
        owner.keys("q")
        assert owner.wait_for_text("EXIT=0", 60), owner.screen()
        # A view takes over (its own samplers, the socket): this dashboard, or the
        # recorder, which this dashboard then views. A new script reaches it either way.
        taken = ("took over from gpuwatch pid", f"view of gpuwatch pid {record.pid}")
        assert wait_for(lambda: any(t in view.screen() for t in taken), 60), view.screen()
        # Where the dashboard took over, the recorder attaches to it as a view, and a view
        # records from its attach on (a phase begun before it is not replayed to it).
        recorder_owns = taken[1] in view.screen()
        release.touch()
        scripts.append(_hold(env, "afterphase", tmp_path / "release2"))
        assert view.wait_for_text("afterphase", 60), view.screen()
        (tmp_path / "release2").touch()
        for s in scripts:
            s.wait(30)
        record.send_signal(signal.SIGINT)
        _, err = record.communicate(timeout=60)
        assert record.returncode == 0, err
        view.keys("q")
        assert view.wait_for_text("EXIT=0", 60), view.screen()
    finally:
        for t in (owner, view):
            if t is not None:
                t.close()
        if record is not None and record.poll() is None:
            record.kill()
            record.wait()
        for p in scripts + sleepers:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait()
    # The owner's file holds what it saw; the recorder's holds both phases (ended before
    # and after the owner quit), every GPU, and loads as a replay does.
    first = load(owned)
    assert scripts[0].pid in first.processes  # its phase still open when the owner quit
    both = load(recorded)
    assert "viewsphase" in set(both.names)
    if recorder_owns:
        assert "afterphase" in set(both.names)
    assert len([d for d in both.devices.values() if d.kind == "gpu"]) == 8
    assert all(len(t) > 0 for t in both.gpu.values())


def test_readonly_sends_no_signal(tmp_path: Path, sub_env: dict[str, str]) -> None:
    """``--readonly``: the Processes tab's signal keys send nothing, said in one line."""
    sleeper = _sleepers(1)[0]
    shown = _env(sub_env, [sleeper.pid])
    exe = shlex.quote(sys.executable)
    term = None
    try:
        term = ViewsTmux(f"{exe} -m gpuwatch --no-record --readonly", shown, 160, 40)
        assert term.wait_for_text("GPU", 60), term.screen()
        term.keys("3")
        assert term.wait_for_text(str(sleeper.pid), 60), term.screen()
        term.keys("T")
        assert term.wait_for_text("--readonly: no signal is sent", 30), term.screen()
        assert sleeper.poll() is None
        term.keys("q")
        assert term.wait_for_text("EXIT=0", 60), term.screen()
    finally:
        if term is not None:
            term.close()
        sleeper.kill()
        sleeper.wait()
