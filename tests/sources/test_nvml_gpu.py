"""On a real NVIDIA GPU: every wrapper call answers, NVML's per-call latency, 100 Hz.

Skipped where there is no GPU. Run on a GPU machine with
``python -m pytest -q tests/sources/test_nvml_gpu.py``; the latency table is printed even
without ``-s``. Put the figures in the issue's closing note.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import wait_for

from gpuwatch.session import Session, gpu_key
from gpuwatch.sources.gpu import GpuSampler
from gpuwatch.sources.nvml import NA, Nvml, NvmlDevice

pytestmark = pytest.mark.gpu


def _latency_us(fn: Callable[[], Any], n: int) -> tuple[float, float]:
    """(median, 99th percentile) microseconds per call over ``n`` calls."""
    times = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t) / 1000)
    times.sort()
    return statistics.median(times), times[min(n - 1, int(n * 0.99))]


def _calls(d: NvmlDevice) -> dict[str, Callable[[], Any]]:
    return {
        "memory (v2 or v1)": d.memory,
        "utilization": d.utilization,
        "temperature": d.temperature,
        "power": d.power,
        "clock sm": lambda: d.clock("sm"),
        "clock mem": lambda: d.clock("mem"),
        "processes": d.processes,
        "name": d.name,
        "uuid": d.uuid,
        "bus id": d.bus_id,
        "power limit": d.power_limit,
    }


def test_every_call_answers_and_nvml_latency_is_printed(capsys: pytest.CaptureFixture) -> None:
    nvml = Nvml()
    nvml.init()
    lines = [f"NVML driver {nvml.driver_version()}: per-call latency, median / p99 in us"]
    try:
        for i in range(nvml.device_count()):
            d = nvml.device(i)
            m = d.memory()
            # An idle GPU may use nothing: memory v2 counts the driver's share as reserved.
            assert m is not NA and 0 <= m.used <= m.total and m.total > 0
            assert str(d.uuid()).startswith(("GPU-", "MIG-"))
            lines.append(f"GPU {i} {d.name()} ({d.bus_id()}), memory v2: {m.reserved is not None}")
            for label, fn in _calls(d).items():
                value = fn()  # raises only for the faults the sampler acts on
                med, p99 = _latency_us(fn, 50 if label == "processes" else 300)
                shown = "n/a" if value is NA else str(value)[:40]
                lines.append(f"  {label:<18} {med:9.1f} {p99:9.1f}   {shown}")
    finally:
        nvml.shutdown()
    # A whole sample as the sampler takes it, on this thread.
    sampler = GpuSampler(Session(), interval=0.01, process_interval=1e9)
    assert sampler.open()
    try:
        ticks = 200
        t = time.thread_time_ns()
        for _ in range(ticks):
            sampler.sample_once()
        per = (time.thread_time_ns() - t) / 1000 / (ticks * len(sampler.gpus))
        lines.append(f"one GPU sample (NVML + gpuwatch), CPU time: {per:.1f} us")
    finally:
        sampler.stop()
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def test_sampler_at_10_ms_on_real_gpus(capsys: pytest.CaptureFixture) -> None:
    session = Session()
    sampler = GpuSampler(session, interval=0.01)
    assert sampler.start(), session.notes
    try:
        keys = [k for k, d in session.devices.items() if d.kind == "gpu"]
        assert keys
        assert wait_for(lambda: all(k in session.sampler_rate for k in keys), timeout=5)
        time.sleep(1.5)
        rates = {k: session.sampler_rate[k] for k in keys}
    finally:
        sampler.stop()
    with capsys.disabled():
        shown = ", ".join(f"{k}: {r:.0f} Hz" for k, r in rates.items())
        print(f"\nachieved rate at 10 ms: {shown}")
    for key in keys:
        assert session.devices[key].state == "ok", session.devices[key].note
        assert len(session.gpu[key]) > 0
        assert rates[key] >= 20, "NVML is slow here: see the latency test's figures"


def test_a_cuda_tensor_shows_in_nvml_on_the_gpu_torch_names(capsys: pytest.CaptureFixture) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    torch.cuda.init()
    key = gpu_key(str(torch.cuda.get_device_properties(0).uuid))
    session = Session()
    sampler = GpuSampler(session, interval=0.01, process_interval=0.1)
    assert sampler.start(), session.notes
    try:
        assert key in session.devices, "torch's UUID does not match NVML's"
        assert session.devices[key].source == "nvml"
        # Free blocks an earlier test left in this process's allocator cache would serve a
        # tensor that fits them with no cudaMalloc, and NVML would see nothing new: ask
        # for more than the cache holds free.
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        seen = len(session.gpu[key])
        assert wait_for(lambda: len(session.gpu[key]) > max(5, seen + 2))
        before = session.gpu[key].last()["used"]
        reserved = torch.cuda.memory_reserved(0)
        cached = reserved - torch.cuda.memory_allocated(0)
        x = torch.empty(cached + (512 << 20), dtype=torch.uint8, device="cuda:0")
        torch.cuda.synchronize()
        assert torch.cuda.memory_reserved(0) >= reserved + (512 << 20)
        assert wait_for(lambda: session.gpu[key].last()["used"] >= before + (512 << 20))
        assert wait_for(lambda: len(session.gpu_procs[key]) > 0)
        procs = session.gpu_procs[key].snapshot()
        pids = set(procs["pid"].tolist())
        del x
    finally:
        sampler.stop()
    info = {pid: session.proc_info.get(pid) for pid in pids}
    with capsys.disabled():
        print(f"\nprocesses NVML lists on {key}: {info}")
    if os.getpid() in pids:  # absent when NVML reports another PID namespace's numbers
        assert session.proc_info[os.getpid()]["visible"] is True
