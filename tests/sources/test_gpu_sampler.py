"""The GPU sampler over the scripted fake NVML: samples, rates, processes and faults."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import psutil
import pynvml
import pytest
from conftest import wait_for

from gpuwatch import protocol
from gpuwatch.session import Session, gpu_key
from gpuwatch.session.ports import DeviceChanged
from gpuwatch.sources.annotations import AnnotationReceiver
from gpuwatch.sources.gpu import GpuSampler, describe_pid
from gpuwatch.sources.nvml import BACKEND_ENV, Nvml
from tests.fake_nvml import FakeNvml, GiB, MiB, default_gpu


@contextmanager
def sampling(fake: FakeNvml, session: Session | None = None, **kw) -> Iterator[GpuSampler]:
    """A started sampler over ``fake``; stopped (and hangs released) on the way out."""
    session = session or Session()
    kw.setdefault("interval", 0.01)
    sampler = GpuSampler(session, nvml=Nvml(fake), **kw)
    assert sampler.start(), session.notes
    try:
        yield sampler
    finally:
        sampler.stop()
        fake.release()


def count(s: Session, index: int) -> int:
    return len(s.gpu[key_of(s, index)])


def key_of(s: Session, index: int) -> str:
    return next(k for k, d in s.devices.items() if d.kind == "gpu" and d.index == index)


def no_such_pid() -> int:
    """A PID that no process has here (as a process in another PID namespace looks)."""
    pid = 4_000_000
    while psutil.pid_exists(pid):
        pid -= 1
    return pid


# ---------------------------------------------------------------------- samples


def test_every_gpu_is_registered_once_and_sampled() -> None:
    traces = [[(i * 100 + k) * MiB for k in range(1, 400)] for i in range(3)]
    fake = FakeNvml([default_gpu(i, used=traces[i], util=(50 + i, 20)) for i in range(3)])
    s = Session()
    t_before = time.monotonic_ns()
    with sampling(fake, s) as sampler:
        assert wait_for(lambda: all(count(s, i) >= 20 for i in range(3)))
        t_after = time.monotonic_ns()
        assert sampler.gpus[0].key == gpu_key(fake.gpus[0].uuid)
    assert sorted(s.gpu) == sorted(gpu_key(g.uuid) for g in fake.gpus)
    for i, gpu in enumerate(fake.gpus):
        dev = s.devices[gpu_key(gpu.uuid)]
        assert (dev.index, dev.name, dev.uuid, dev.bus_id) == (i, gpu.name, gpu.uuid, gpu.bus_id)
        assert (dev.total, dev.state, dev.source) == (gpu.total, "ok", "nvml")
        cols = s.gpu[dev.key].snapshot()
        n = len(cols["t"])
        # Discovery's read (for the total) took the trace's first value; samples follow it.
        assert cols["used"].tolist() == traces[i][1 : n + 1]
        assert (cols["free"] == gpu.total - gpu.reserved - cols["used"]).all()
        assert (cols["reserved"] == gpu.reserved).all()
        assert (np.diff(cols["t"]) > 0).all()
        assert t_before <= cols["t"][0] and cols["t"][-1] <= t_after + 10**9
        last = s.gpu[dev.key].last()
        assert (last["util_gpu"], last["util_mem"], last["temp"]) == (50 + i, 20, 35)
        assert (last["power"], last["power_limit"]) == (60.0, 400.0)
        assert (last["clock_sm"], last["clock_mem"]) == (1410, 1593)
    # Static facts are read once per GPU, not per tick.
    for call in ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo"):
        assert fake.calls[call] == 3, call
    assert fake.calls["nvmlDeviceGetEnforcedPowerLimit"] == 3


def test_achieved_rate_is_published_per_gpu() -> None:
    fake = FakeNvml(2)
    s = Session()
    with sampling(fake, s, interval=0.02):
        assert wait_for(lambda: len(s.sampler_rate) == 2, timeout=5)
        time.sleep(1.2)
        rates = [s.sampler_rate[key_of(s, i)] for i in range(2)]
    assert all(10 < r <= 55 for r in rates), rates  # 50 Hz asked, on a shared machine


def test_interval_below_10_ms_is_refused() -> None:
    with pytest.raises(ValueError):
        GpuSampler(Session(), interval=0.005, nvml=Nvml(FakeNvml(1)))


# ---------------------------------------------------------------------- faults


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED]
)
def test_no_driver_is_one_note_and_the_host_only(code: int) -> None:
    s = Session()
    sampler = GpuSampler(s, nvml=Nvml(FakeNvml(2, init_error=code)))
    assert sampler.start() is False
    sampler.stop()
    assert len(s.notes) == 1
    assert s.notes[0].startswith("no NVIDIA driver found")
    assert s.notes[0].endswith("showing the host only")
    assert "\n" not in s.notes[0]
    assert s.devices == {} and s.gpu == {}


def test_no_binding_is_the_same_note(monkeypatch) -> None:
    monkeypatch.setenv(BACKEND_ENV, "no_such_nvml_binding")
    s = Session()
    sampler = GpuSampler(s)
    assert sampler.start() is False
    sampler.stop()
    assert len(s.notes) == 1 and s.notes[0].startswith("no NVIDIA driver found")


def test_no_gpu_is_a_note() -> None:
    s = Session()
    fake = FakeNvml(0)
    assert GpuSampler(s, nvml=Nvml(fake)).start() is False
    assert s.notes == ["NVML sees no GPU: showing the host only"]
    assert fake.initialised == 0  # shut down again


def test_nvml_failing_after_init_is_a_note_and_shut_down() -> None:
    s = Session()
    fake = FakeNvml(2)
    fake.fail("nvmlDeviceGetCount", pynvml.NVML_ERROR_UNKNOWN)
    assert GpuSampler(s, nvml=Nvml(fake)).start() is False
    assert len(s.notes) == 1 and s.notes[0].startswith("NVML is not usable")
    assert fake.initialised == 0


def test_a_hanging_init_does_not_hold_up_start() -> None:
    fake = FakeNvml(2)
    gate = fake.hang("nvmlInit")
    s = Session()
    sampler = GpuSampler(s, interval=0.01, nvml=Nvml(fake), init_timeout=0.2)
    t = time.monotonic()
    try:
        assert sampler.start() is True
        assert time.monotonic() - t < 1.0
        assert s.devices == {} and "NVML has not answered" in s.notes[0]
        gate.set()  # the driver answers at last: the GPUs appear and are sampled
        assert wait_for(lambda: len(s.gpu) == 2 and all(len(t) > 5 for t in s.gpu.values()))
        assert wait_for(lambda: len(s.sampler_rate) == 2)
    finally:
        sampler.stop()
        fake.release()


def test_unsupported_fields_are_none_and_not_asked_again() -> None:
    fake = FakeNvml(1)
    for call in (
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetTemperature",
    ):
        fake.fail(call, pynvml.NVML_ERROR_NOT_SUPPORTED)
    s = Session()
    with sampling(fake, s):
        assert wait_for(lambda: count(s, 0) >= 10)
    last = s.gpu[key_of(s, 0)].last()
    assert np.isnan(last["power"]) and np.isnan(last["temp"])
    assert last["used"] == 512 * MiB and last["clock_sm"] == 1410
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1
    assert s.devices[key_of(s, 0)].state == "ok"


def test_no_permission_for_processes_keeps_memory_sampling() -> None:
    fake = FakeNvml([default_gpu(0, compute=[(os.getpid(), GiB)])])
    fake.fail("nvmlDeviceGetComputeRunningProcesses_v3", pynvml.NVML_ERROR_NO_PERMISSION)
    s = Session()
    with sampling(fake, s, process_interval=0.05):
        assert wait_for(lambda: fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"] >= 3)
        before = count(s, 0)
        assert wait_for(lambda: count(s, 0) >= before + 10)
    assert len(s.notes) == 1 and "no permission to list GPU processes" in s.notes[0]
    assert s.devices[key_of(s, 0)].state == "ok"
    assert len(s.gpu_procs[key_of(s, 0)]) == 0
    assert s.proc_info == {}


def test_a_gpu_lost_mid_session_stops_alone() -> None:
    fake = FakeNvml(3)
    s = Session()
    with sampling(fake, s):
        assert wait_for(lambda: all(count(s, i) >= 10 for i in range(3)))
        fake.lose(1)
        assert wait_for(lambda: s.devices[key_of(s, 1)].state == "lost")
        frozen = count(s, 1)
        others = [count(s, 0), count(s, 2)]
        assert wait_for(lambda: count(s, 0) >= others[0] + 20 and count(s, 2) >= others[1] + 20)
        assert count(s, 1) == frozen
        assert s.sampler_rate[key_of(s, 1)] == 0.0
        assert wait_for(lambda: s.sampler_rate.get(key_of(s, 0), 0) > 0)
    assert "fell off the bus" in s.devices[key_of(s, 1)].note
    assert [s.devices[key_of(s, i)].state for i in (0, 2)] == ["ok", "ok"]


def test_a_gpu_lost_before_start_is_registered_lost() -> None:
    fake = FakeNvml(2)
    fake.lose(0)
    s = Session()
    with sampling(fake, s):
        assert wait_for(lambda: count(s, 1) >= 5)
    lost = s.devices[key_of(s, 0)]
    assert lost.state == "lost" and len(s.gpu[lost.key]) == 0
    assert s.sampler_rate[lost.key] == 0.0


def test_a_hung_call_stalls_neither_the_other_gpus_nor_stop() -> None:
    fake = FakeNvml(3)
    s = Session()
    sampler = GpuSampler(s, interval=0.01, nvml=Nvml(fake), hang_after=0.2)
    assert sampler.start()
    try:
        assert wait_for(lambda: all(count(s, i) >= 5 for i in range(3)))
        fake.hang("nvmlDeviceGetMemoryInfo_v2", index=1)
        assert wait_for(lambda: s.devices[key_of(s, 1)].state == "error")
        assert "has not returned" in s.devices[key_of(s, 1)].note
        stuck = count(s, 1)
        others = [count(s, 0), count(s, 2)]
        assert wait_for(lambda: count(s, 0) >= others[0] + 20 and count(s, 2) >= others[1] + 20)
        assert count(s, 1) == stuck
        assert wait_for(lambda: s.sampler_rate.get(key_of(s, 1), 1) < 1)
        t = time.monotonic()
        sampler.stop()
        assert time.monotonic() - t < 1.5
        assert fake.calls["nvmlShutdown"] == 0  # not under a call that has not returned
    finally:
        fake.release()


def test_a_gpu_comes_back_when_its_hung_call_returns() -> None:
    fake = FakeNvml(2)
    s = Session()
    sampler = GpuSampler(s, interval=0.01, nvml=Nvml(fake), hang_after=0.2)
    assert sampler.start()
    try:
        assert wait_for(lambda: count(s, 0) >= 5)
        fake.hang("nvmlDeviceGetUtilizationRates", index=0)
        assert wait_for(lambda: s.devices[key_of(s, 0)].state == "error")
        stuck = count(s, 0)
        fake.release()
        assert wait_for(lambda: s.devices[key_of(s, 0)].state == "ok")
        assert wait_for(lambda: count(s, 0) >= stuck + 10)
        # The replaced thread has ended: one sampling thread and the watchdog remain.
        names = lambda: sorted(  # noqa: E731
            t.name for t in threading.enumerate() if t.name.startswith("gpuwatch-nvml")
        )
        assert wait_for(lambda: names() == ["gpuwatch-nvml-1", "gpuwatch-nvml-watch"])
    finally:
        sampler.stop()
        fake.release()
    assert fake.calls["nvmlShutdown"] == 1
    assert not [t for t in threading.enumerate() if t.name.startswith("gpuwatch-nvml")]


def test_a_slow_nvml_shows_in_the_achieved_rate() -> None:
    fake = FakeNvml(2)
    fake.slow("nvmlDeviceGetMemoryInfo_v2", 0.05)  # 2 GPUs x 50 ms: 10 Hz at most
    s = Session()
    with sampling(fake, s, interval=0.01):
        assert wait_for(lambda: key_of(s, 0) in s.sampler_rate, timeout=5)
        time.sleep(1.2)
        rate = s.sampler_rate[key_of(s, 0)]
    assert 2 < rate < 12, rate
    assert s.devices[key_of(s, 0)].state == "ok"  # slow is not hung


def test_repeated_failures_become_a_state_that_clears() -> None:
    fake = FakeNvml(2)
    s = Session()
    states: list[str] = []
    s.subscribe(lambda e: isinstance(e, DeviceChanged) and states.append(e.device.state))
    with sampling(fake, s):
        assert wait_for(lambda: count(s, 0) >= 5)
        fake.fail("nvmlDeviceGetMemoryInfo_v2", pynvml.NVML_ERROR_TIMEOUT, index=0, times=5)
        assert wait_for(lambda: "error" in states)
        assert wait_for(lambda: s.devices[key_of(s, 0)].state == "ok")
        n = count(s, 0)
        assert wait_for(lambda: count(s, 0) >= n + 5)
    assert states[-2:] == ["error", "ok"]


def test_a_failing_secondary_field_blanks_only_that_sample() -> None:
    fake = FakeNvml(1)
    s = Session()
    with sampling(fake, s):
        assert wait_for(lambda: count(s, 0) >= 3)
        fake.fail("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_UNKNOWN, times=1)
        n = count(s, 0)
        assert wait_for(lambda: count(s, 0) >= n + 5)
    cols = s.gpu[key_of(s, 0)].snapshot()
    assert np.isnan(cols["power"]).sum() == 1
    assert (cols["used"] == 512 * MiB).all()  # memory kept in every sample


def test_nvml_going_away_stops_every_gpu_with_a_note() -> None:
    fake = FakeNvml(2)
    s = Session()
    with sampling(fake, s) as sampler:
        assert wait_for(lambda: count(s, 1) >= 3)
        fake.fail("nvmlDeviceGetMemoryInfo_v2", pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        assert wait_for(lambda: all(d.state == "error" for d in s.devices.values()))
        assert wait_for(lambda: not sampler._worker.thread.is_alive())
    assert any(n.startswith("NVML went away") for n in s.notes)


# ---------------------------------------------------------------------- processes


def test_processes_are_joined_with_psutil_and_invisible_ones_kept() -> None:
    me, ghost = os.getpid(), no_such_pid()
    gpu = default_gpu(0, compute=[(me, 3 * GiB), (ghost, GiB)], graphics=[(me, 3 * GiB)])
    fake = FakeNvml([gpu, default_gpu(1)])
    s = Session()
    with sampling(fake, s, process_interval=0.05):
        assert wait_for(lambda: ghost in s.proc_info and all(len(t) for t in s.gpu_procs.values()))
    rows = s.gpu_procs[key_of(s, 0)].snapshot()
    last = rows["t"] == rows["t"][-1]
    got = sorted(zip(rows["pid"][last], rows["used"][last], rows["type"][last], strict=True))
    assert got == sorted([(me, 3 * GiB, 2), (ghost, GiB, 0)])
    mine = psutil.Process(me)
    assert s.proc_info[me] == {
        "name": mine.name(),
        "user": mine.username(),
        "cmdline": mine.cmdline(),
        "visible": True,
        "uid": mine.uids().real,
        "ppid": mine.ppid(),
        "started": mine.create_time(),
    }
    assert s.proc_info[ghost]["visible"] is False
    # The idle GPU's empty list is recorded too ("no processes from here on").
    assert s.gpu_procs[key_of(s, 1)].last()["type"] == -1


def test_per_process_utilisation_cpu_and_rss_are_sampled() -> None:
    """NVML's per-process samples give each listed process its SM %; one with no sample
    since the last list was idle (0 %); the host's CPU % and RSS come from /proc."""
    busy = subprocess.Popen(  # a real process spending CPU: its CPU % is above 0
        [sys.executable, "-c", "while True: pass"]
    )
    idle = subprocess.Popen(["sleep", "600"])  # one spending none: exactly 0
    try:
        me = idle.pid
        fake = FakeNvml(1)
        fake.set_process(0, busy.pid, 2 * GiB, sm=73, mem=21)
        fake.set_process(0, me, GiB)  # listed, never sampled: idle
        s = Session()
        with sampling(fake, s, process_interval=0.3):

            def cpu_known() -> bool:
                rows = s.gpu_procs[key_of(s, 0)].snapshot()
                mine = rows["pid"] == busy.pid
                return bool(mine.any() and np.isfinite(rows["cpu"][mine]).any())

            assert wait_for(cpu_known, timeout=10)
        rows = s.gpu_procs[key_of(s, 0)].snapshot()
        last = rows["t"] == rows["t"][-1]
        by_pid = {int(p): i for i, p in enumerate(rows["pid"]) if last[i]}
        b, m = by_pid[busy.pid], by_pid[me]
        assert (rows["sm"][b], rows["mem_util"][b]) == (73, 21)
        assert rows["sm"][m] == 0
        # Above 0 and at most a core (how much above depends on the shared machine's load).
        assert 0 < rows["cpu"][b] <= 110, rows["cpu"][b]
        assert rows["cpu"][m] == 0
        assert 0 < rows["rss"][b] < 1 << 30
        assert abs(rows["rss"][m] - psutil.Process(me).memory_info().rss) < 64 * MiB
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()


def test_per_process_utilisation_is_unknown_where_nvml_lacks_it() -> None:
    fake = FakeNvml(1, missing_symbols=["nvmlDeviceGetProcessUtilization"])
    fake.set_process(0, os.getpid(), GiB, sm=50)
    s = Session()
    with sampling(fake, s, process_interval=0.05):
        assert wait_for(lambda: len(s.gpu_procs[key_of(s, 0)]) >= 2)
    rows = s.gpu_procs[key_of(s, 0)].snapshot()
    assert np.isnan(rows["sm"]).all()
    assert fake.calls["nvmlDeviceGetProcessUtilization"] == 1  # never asked again


def test_process_lists_are_read_less_often_than_memory() -> None:
    fake = FakeNvml([default_gpu(0, compute=[(os.getpid(), GiB)]), default_gpu(1)])
    s = Session()
    with sampling(fake, s, process_interval=0.25):
        time.sleep(1.0)
    mem = fake.calls["nvmlDeviceGetMemoryInfo_v2"]
    procs = fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"]
    assert mem >= 40, mem
    assert 2 <= procs <= 2 * 6, procs  # two GPUs, at about 4 Hz each


def test_describe_pid_never_drops_a_pid() -> None:
    assert describe_pid(no_such_pid()) == {
        "name": None,
        "user": None,
        "cmdline": None,
        "visible": False,
    }
    assert describe_pid(os.getpid())["visible"] is True


# ---------------------------------------------------------------------- CUDA_VISIBLE_DEVICES


def _hello(path: str, pid: int, devices: list[dict]) -> None:
    """What an instrumented script sends: its hello, then figures for each torch device."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        t = time.monotonic_ns()
        sock.sendto(protocol.encode("hello", pid, 0, t, 0, {"devices": devices}), path)
        for seq, d in enumerate(devices, start=1):
            body = {"dev": d["index"], "allocated": (d["index"] + 1) * GiB, "reserved": 8 * GiB}
            sock.sendto(protocol.encode("memory", pid, seq, t + seq, 0, body), path)


@pytest.mark.parametrize("hello_first", [False, True])
@pytest.mark.parametrize(
    ("visible", "expected_nvml"),
    [
        # CUDA orders the faster GPUs first (cuda_order below), NVML by PCI bus: CUDA's
        # index 2 is NVML's 2 and CUDA's 0 is NVML's 1.
        ("2,0", [2, 1]),
        # By UUID prefix, then an index into CUDA's order; "7" matches nothing and ends it.
        ("GPU-00000003,0,7,2", [3, 1]),
    ],
)
def test_cuda_visible_devices_maps_scripts_to_nvml_gpus(
    sock_path: str, visible: str, expected_nvml: list[int], hello_first: bool
) -> None:
    fake = FakeNvml(4, cuda_order=[1, 0, 2, 3])
    seen = fake.cuda_devices(visible)  # the GPUs torch numbers 0, 1, ... in the script
    assert [fake.gpus.index(g) for g in seen] == expected_nvml
    pid = os.getpid()  # the "script"; NVML lists it on the GPUs it uses
    for g in seen:
        g.compute.append((pid, 2 * GiB))
    devices = [
        {"index": i, "uuid": fake.torch_uuid(g), "name": g.name, "total": g.total}
        for i, g in enumerate(seen)
    ]
    s = Session()
    rx = AnnotationReceiver(s, sock_path)
    rx.start()
    sampler = GpuSampler(s, interval=0.01, nvml=Nvml(fake), process_interval=0.05)
    try:
        if hello_first:  # the script may be running before the dashboard samples NVML
            _hello(rx.path, pid, devices)
            assert wait_for(lambda: pid in s.processes and len(s.processes[pid].torch) == 2)
        assert sampler.start()
        if not hello_first:
            _hello(rx.path, pid, devices)
        assert wait_for(lambda: pid in s.processes and len(s.processes[pid].torch) == 2)
        keys = [gpu_key(fake.gpus[i].uuid) for i in range(4)]
        assert wait_for(lambda: all(len(s.gpu_procs[keys[i]]) for i in expected_nvml))
    finally:
        sampler.stop()
        rx.stop()
    proc = s.processes[pid]
    assert proc.devices == {0: keys[expected_nvml[0]], 1: keys[expected_nvml[1]]}
    for torch_index, nvml_index in enumerate(expected_nvml):
        key = keys[nvml_index]
        dev = s.devices[key]
        assert (dev.index, dev.source) == (nvml_index, "nvml")  # NVML's index, not torch's
        assert s.processes_on(key) == [proc]
        t0, t1 = s.time_range()
        _, hi = proc.torch_window(key, "allocated", t0, t1 + 1, 10)
        assert np.nanmax(hi) == (torch_index + 1) * GiB  # its own torch device's figures
        assert pid in s.gpu_procs[key].snapshot()["pid"]
    for other in set(range(4)) - set(expected_nvml):
        assert s.processes_on(keys[other]) == []
        assert pid not in s.gpu_procs[keys[other]].snapshot()["pid"]
    assert sorted(s.gpu) == sorted(keys)  # no torch-only twin of any GPU
    assert all(d.source == "nvml" for d in s.devices.values())
