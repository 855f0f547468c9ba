"""The host's samples carry CPU busy, the load average and swap (issue 38's overview row)."""

from __future__ import annotations

import os

import psutil
from conftest import wait_for

from gpuwatch.session import Session
from gpuwatch.sources import host
from gpuwatch.sources.host import HostSampler

GIB = 1 << 30


def test_host_samples_carry_cpu_load_and_swap(monkeypatch) -> None:
    monkeypatch.setattr(host, "LOAD_INTERVAL", 0.0)  # read anew at every sample
    session = Session()
    sampler = HostSampler(session)
    sampler.sample_once()
    first = session.host.last()
    assert first["cpu"] != first["cpu"]  # NaN: psutil's count starts with the first read
    busy = sum(range(2_000_000))  # some CPU between the two reads
    assert busy
    sampler.sample_once()
    row = session.host.last()
    assert 0.0 <= row["cpu"] <= 100.0
    assert abs(row["load1"] - os.getloadavg()[0]) < 2.0
    swap = psutil.swap_memory()
    assert row["swap_total"] == swap.total
    assert abs(row["swap_used"] - swap.used) < GIB


def test_cpu_load_and_swap_are_read_once_a_second(monkeypatch) -> None:
    calls = []
    real = psutil.swap_memory
    monkeypatch.setattr(psutil, "swap_memory", lambda: calls.append(1) or real())
    session = Session()
    sampler = HostSampler(session)
    for _ in range(5):
        sampler.sample_once()
    assert len(calls) == 1  # held between reads: the tick's memory figure is the point
    assert len(session.host) == 5
    assert len(set(session.host.snapshot()["load1"].tolist())) == 1


def test_a_failing_tick_is_counted_and_said_once(monkeypatch) -> None:
    # /proc unreadable for a while (a container's mount, a kernel hiccup): the thread goes
    # on, and the failures show in the session instead of vanishing.
    real = psutil.virtual_memory
    fails = [5]

    def flaky():
        if fails[0]:
            fails[0] -= 1
            raise OSError(5, "Input/output error")
        return real()

    session = Session()
    sampler = HostSampler(session, interval=0.01)
    sampler.start()
    monkeypatch.setattr(psutil, "virtual_memory", flaky)
    try:
        wait_for(lambda: not fails[0] and len(session.host) > 0, timeout=30)
    finally:
        sampler.stop()
    assert sampler.failed == 5
    assert len(session.host) > 0  # it kept sampling
    said = [n for n in session.notes if "host sample" in n]
    assert len(said) == 2
    assert "OSError" in said[0] and "Input/output error" in said[0]
    assert said[1] == "5 host samples failed in all"
