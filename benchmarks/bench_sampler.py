"""Cost of the NVML sampler itself, with the fake NVML (tests/fake_nvml.py).

Two figures, with the issue's targets (issue 3):

1. **Own cost per GPU sample**: CPU time of ``GpuSampler.sample_once`` on this thread,
   divided by GPUs x ticks, minus the fake's own time. The fake's time is measured
   separately by replaying, straight on the fake, exactly the pynvml calls one sample made
   (the benchmark checks the fake's call counters to be sure the replay matches). What
   stays is the wrapper, the sampler, reading pynvml's result structures, and
   ``Session.add_gpu_sample`` (Table append + notify). Target: at most 20 us.
2. **CPU share at 100 Hz x 8 GPUs**: the whole process's CPU time (every thread: sampler,
   watchdog, process lists joined with psutil every second) over wall time while the
   sampler runs on its own thread. Printed raw and with the fake's share taken out.
   Target: at most 5% of one core (judged without the fake's share).

CPU time (not wall time) is measured, so other work on a shared machine does not count.

Run: python benchmarks/bench_sampler.py [--gpus 8] [--hz 100] [--seconds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pynvml  # noqa: E402  (the fake's argument constants)

from gpuwatch.session import Session  # noqa: E402
from gpuwatch.sources.gpu import GpuSampler  # noqa: E402
from gpuwatch.sources.nvml import Nvml  # noqa: E402
from tests.fake_nvml import FakeNvml, default_gpu  # noqa: E402

TARGET_US = 20.0
TARGET_CPU = 5.0

# The pynvml calls one GPU sample makes (the check against the fake's counters keeps this
# honest if the sampler changes).
PER_SAMPLE = (
    ("nvmlDeviceGetMemoryInfo_v2", lambda f, h: f.nvmlDeviceGetMemoryInfo(h, pynvml.nvmlMemory_v2)),
    ("nvmlDeviceGetUtilizationRates", lambda f, h: f.nvmlDeviceGetUtilizationRates(h)),
    (
        "nvmlDeviceGetTemperatureV",
        lambda f, h: f.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU),
    ),
    ("nvmlDeviceGetPowerUsage", lambda f, h: f.nvmlDeviceGetPowerUsage(h)),
    ("nvmlDeviceGetClockInfo", lambda f, h: f.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
    ("nvmlDeviceGetClockInfo", lambda f, h: f.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)),
)


def make_fake(gpus: int, with_processes: bool = False) -> FakeNvml:
    """``gpus`` fake GPUs; optionally each with this process and an invisible PID on it."""
    fake = FakeNvml([default_gpu(i) for i in range(gpus)])
    if with_processes:
        for gpu in fake.gpus:
            gpu.compute = [(os.getpid(), 1 << 30), (3_999_999, 1 << 29)]
    return fake


def fake_seconds_per_sample(fake: FakeNvml, samples: int) -> float:
    """CPU seconds the fake spends on one sample's calls, measured on their own."""
    handles = fake.gpus
    calls = [fn for _, fn in PER_SAMPLE]
    per_gpu = samples // len(handles)
    start = time.thread_time_ns()
    for _ in range(per_gpu):
        for h in handles:
            for fn in calls:
                fn(fake, h)
    return (time.thread_time_ns() - start) / 1e9 / (per_gpu * len(handles))


def own_cost_us(gpus: int, ticks: int = 500, repeats: int = 7) -> tuple[float, float, float]:
    """(own us, total us, fake us) per GPU sample, medians over ``repeats`` runs."""
    fake = make_fake(gpus)
    session = Session()
    sampler = GpuSampler(session, interval=0.01, nvml=Nvml(fake), process_interval=1e9)
    assert sampler.open(), session.notes
    for _ in range(200):  # warm up: first-call fallbacks, table growth
        sampler.sample_once()
    totals, fakes = [], []
    for _ in range(repeats):
        before = Counter(fake.calls)
        start = time.thread_time_ns()
        for _ in range(ticks):
            sampler.sample_once()
        total = (time.thread_time_ns() - start) / 1e9 / (ticks * gpus)
        made = Counter(fake.calls)
        made.subtract(before)
        expected = Counter(name for name, _ in PER_SAMPLE)
        for name in expected:
            expected[name] *= ticks * gpus
        assert +made == expected, f"replay does not match the sampler's calls: {made}"
        totals.append(total)
        fakes.append(fake_seconds_per_sample(fake, ticks * gpus))
    total = statistics.median(totals) * 1e6
    fake_us = statistics.median(fakes) * 1e6
    return total - fake_us, total, fake_us


def cpu_share(gpus: int, hz: float, seconds: float, fake_us: float) -> tuple[float, float, float]:
    """(own %, raw %, achieved Hz per GPU) of one core while sampling on a thread."""
    fake = make_fake(gpus, with_processes=True)
    session = Session()
    sampler = GpuSampler(session, interval=1 / hz, nvml=Nvml(fake), process_interval=1.0)
    assert sampler.start(), session.notes
    time.sleep(0.5)  # settle: first process lists, psutil joins
    counts0 = sum(len(t) for t in session.gpu.values())
    cpu0, wall0 = time.process_time(), time.monotonic()
    time.sleep(seconds)
    cpu1, wall1 = time.process_time(), time.monotonic()
    counts1 = sum(len(t) for t in session.gpu.values())
    sampler.stop()
    wall = wall1 - wall0
    samples_per_s = (counts1 - counts0) / wall
    raw = (cpu1 - cpu0) / wall * 100
    own = raw - samples_per_s * fake_us / 1e6 * 100
    return own, raw, samples_per_s / gpus


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--hz", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()

    own, total, fake_us = own_cost_us(args.gpus)
    ok_us = own <= TARGET_US
    print(
        f"own cost per GPU sample: {own:.1f} us (with the fake: {total:.1f} us; "
        f"fake alone: {fake_us:.1f} us)  target <= {TARGET_US:.0f} us  "
        f"{'PASS' if ok_us else 'FAIL'}"
    )
    share, raw, achieved = cpu_share(args.gpus, args.hz, args.seconds, fake_us)
    ok_cpu = share <= TARGET_CPU
    print(
        f"CPU at {args.hz:.0f} Hz x {args.gpus} GPUs: {share:.2f}% of one core "
        f"(raw, fake included: {raw:.2f}%; achieved {achieved:.1f} Hz per GPU)  "
        f"target <= {TARGET_CPU:.0f}%  {'PASS' if ok_cpu else 'FAIL'}"
    )
    return 0 if ok_us and ok_cpu else 1


if __name__ == "__main__":
    sys.exit(main())
