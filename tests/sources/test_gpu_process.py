"""GPU sampling in a child process (gpuwatch.sources.gpu_process), NVML served by the fake.

The child is a real Python process reading the fake through ``$GPUWATCH_NVML_BACKEND``;
what it sends reaches a real :class:`Session` here.
"""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import pytest
from conftest import ROOT, fake_nvml_env, wait_for

from gpuwatch.session import Session
from gpuwatch.sources import child
from gpuwatch.sources.gpu_process import GpuProcess


@pytest.fixture
def fake_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's environment (which the child inherits) serving two fake GPUs."""
    for k, v in fake_nvml_env({}, {"gpus": 2, "trace": "flat"}).items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(ROOT)  # tests.fake_nvml is found from the repository's root
    yield


@contextmanager
def sampling(session: Session, **kw: float) -> Iterator[GpuProcess]:
    gpus = GpuProcess(session, **kw)
    try:
        yield gpus
    finally:
        gpus.stop()


def _gpu_children() -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process().children()
        if "gpuwatch.sources.gpu_process" in " ".join(p.cmdline())
    ]


def test_samples_devices_rates_and_notes_arrive_from_the_child(fake_env: None) -> None:
    s = Session()
    with sampling(s, interval=0.02, process_interval=0.1) as gpus:
        assert gpus.start() is True
        assert gpus.fallback is None and gpus.child is not None  # not the thread
        assert wait_for(lambda: len(s.gpu) == 2 and all(len(t) >= 20 for t in s.gpu.values()))
        assert wait_for(lambda: len(s.sampler_rate) == 2 and min(s.sampler_rate.values()) > 10)
        devices = [d for d in s.devices.values() if d.kind == "gpu"]
        assert sorted(d.index for d in devices) == [0, 1]
        assert all(d.total and d.name and d.uuid for d in devices)
        assert any("not this machine's driver" in n for n in s.notes)
        for table in s.gpu.values():
            t = table.snapshot()["t"]
            assert (t[1:] > t[:-1]).all()  # in order, on this process's clock
            assert abs(int(t[-1]) - time.monotonic_ns()) < 5e9
        (child,) = _gpu_children()
    assert not psutil.pid_exists(child.pid) or child.status() == psutil.STATUS_ZOMBIE


def test_no_gpu_is_said_once_and_start_returns_false(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in fake_nvml_env({}, {"init_error": "DRIVER_NOT_LOADED"}).items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(ROOT)
    s = Session()
    before = {p.pid for p in psutil.Process().children()}  # what other tests left running
    with sampling(s) as gpus:
        assert gpus.start() is False
        assert gpus.fallback is None
        assert gpus.child is None
        assert {p.pid for p in psutil.Process().children()} <= before  # reaped: no zombie
        assert [n for n in s.notes if "no NVIDIA driver found" in n] != []
        assert not s.gpu


def test_a_busy_gpuwatch_does_not_delay_the_samples(fake_env: None) -> None:
    """The point of the child: this process's interpreter lock, held for a second at a
    time by a busy thread, costs the sampling nothing (a thread here took one sample a
    second; a loaded machine delays the lock's hand-over the same way)."""
    s = Session()
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            sum(range(1000))

    old = sys.getswitchinterval()
    with sampling(s, interval=0.05) as gpus:
        assert gpus.start() is True
        assert wait_for(lambda: len(s.gpu) == 2 and all(len(t) for t in s.gpu.values()))
        hog = threading.Thread(target=busy, daemon=True)
        sys.setswitchinterval(1.0)  # the lock changes hands once a second at most
        start = time.monotonic_ns()
        try:
            hog.start()
            time.sleep(3.0)
        finally:
            stop.set()
            sys.setswitchinterval(old)
            hog.join()
        end = time.monotonic_ns()
        # The lines the child wrote meanwhile, applied now: each GPU has a sample since.
        assert wait_for(lambda: all(t.snapshot()["t"][-1] > end for t in s.gpu.values()))
        for table in s.gpu.values():
            t = table.snapshot()["t"]
            taken = int(((t >= start) & (t <= end)).sum())
            assert taken >= 0.8 * (end - start) / 50e6, taken  # 20 Hz, not 1 Hz


def test_the_child_exits_when_gpuwatch_dies(tmp_path) -> None:
    """Killed without a word (SIGKILL), gpuwatch leaves no sampler behind."""
    script = (
        "import os, sys, time\n"
        "from gpuwatch.session import Session\n"
        "from gpuwatch.sources.gpu_process import GpuProcess\n"
        "g = GpuProcess(Session(), interval=0.05)\n"
        "assert g.start()\n"
        "print(g.child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    env = fake_nvml_env(dict(os.environ, PYTHONPATH=str(ROOT)), {"gpus": 1})
    gw = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        child = int(gw.stdout.readline())
        assert psutil.pid_exists(child)
        gw.kill()
        gw.wait()
        assert wait_for(lambda: not psutil.pid_exists(child), timeout=10)
    finally:
        if gw.poll() is None:
            gw.kill()
            gw.wait()
        gw.stdout.close()


def test_a_child_that_cannot_run_leaves_sampling_to_a_thread(
    fake_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(child, "_BOOT", "import sys; sys.exit(3)")
    s = Session()
    with sampling(s, interval=0.02) as gpus:
        assert gpus.start() is True
        assert gpus.fallback is not None
        assert wait_for(lambda: len(s.gpu) == 2 and all(len(t) >= 5 for t in s.gpu.values()))
    assert not _gpu_children()


def test_frames_are_what_the_session_applies(fake_env: None) -> None:
    """What the child writes, read raw: READY, then frames of marshalled calls (tag 0), one
    of which says NVML opened; told to drain, it exits cleanly."""
    sampler = child.Child.start("gpuwatch.sources.gpu_process", ["0.05", "1.0"])
    assert sampler is not None
    frames: list[tuple[int, bytes]] = []
    ended: list[bool] = []

    def samples() -> int:
        return sum(c[0] == "sample" for _, p in list(frames) for c in marshal.loads(p))

    def read() -> None:
        ended.append(sampler.read(lambda tag, p: frames.append((tag, p)), 1 << 26, 1 << 16))

    reader = threading.Thread(target=read)
    try:
        assert sampler.wait_ready(30)
        reader.start()
        # Frames come as the child samples: read as they come, until ten samples are in.
        assert wait_for(lambda: samples() >= 10, timeout=30), samples()
        sampler.close_lifeline(drain=True)  # the child stops, writes what it holds, exits
        reader.join(30)
        assert ended == [True]
        assert sampler.reap(10)
    finally:
        sampler.reap(0)
        sampler.close_frames()
    assert {tag for tag, _ in frames} == {0}
    calls = [call for _, payload in frames for call in marshal.loads(payload)]
    kinds = [call[0] for call in calls]
    assert kinds.count("device") == 2 and "opened" in kinds and kinds.count("sample") >= 10
    assert calls[kinds.index("opened")][1] is True
    sample = calls[kinds.index("sample")]
    assert sample[1].startswith("gpu:") and {"t", "used", "total"} <= sample[2].keys()
    assert sampler.proc.returncode == 0


# A child that speaks the frame protocol but sends what no sampler sends: a damaged frame,
# a call of no known kind, a call the session refuses; good calls between them still count.
_BAD_CHILD = """
import marshal, os, struct, sys
F = struct.Struct("<Ii")
def frame(payload, tag=0):
    os.write(1, F.pack(len(payload), tag) + payload)
os.write(1, F.pack(0, 0))
frame(marshal.dumps([("opened", True), ("note", "first")]))
frame(b"not marshal at all")
frame(marshal.dumps([("nonsense", 1), ("note", "second")]))
frame(marshal.dumps([("state",)]))
frame(marshal.dumps([("note", "third")]), tag=7)
frame(marshal.dumps([("note", "fourth")]))
sys.stdin.buffer.read()
"""


def test_what_cannot_be_applied_is_counted_and_said(
    fake_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(child, "_BOOT", _BAD_CHILD)
    s = Session()
    with sampling(s) as gpus:
        assert gpus.start() is True
        assert gpus.fallback is None
        assert wait_for(lambda: "fourth" in s.notes)
        assert gpus.rejected == 4
        said = [n for n in s.notes if "GPU sampling process sent" in n]
        assert len(said) == 1 and "damaged frame" in said[0]
    assert [n for n in s.notes if n in ("first", "second", "fourth")] == [
        "first",
        "second",
        "fourth",
    ]
    assert any("4 frames or calls" in n for n in s.notes)  # the total, once, at the end
