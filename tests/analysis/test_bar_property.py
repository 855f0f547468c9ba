"""The breakdown bar never adds up to more than the GPU holds (issue 25, item 1).

The cursor steps every 20 ms through each H100 sample and through recordings made here
the way the live sources make them (NVML's used memory sampled at 10 Hz and lagging the
allocator, its process list read once a second and stored when it changes, the script's
figures sent at boundaries): a process that exits while NVML still shows its memory, an
OOM whose release NVML sees late, and a fast growth NVML lags. At every step each segment
is >= 0 and all of them sum to at most the device's used memory at the cursor (its total
where that is unknown), and the bar drawn in the real app never runs past its width.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from store_data import Script

from gpuwatch.analysis.breakdown import breakdown
from gpuwatch.analysis.predicted import predictions
from gpuwatch.predict._shape import ModelShape, facts_from_shape
from gpuwatch.session import Device, Session, gpu_key
from gpuwatch.store import load, save_session

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted((ROOT / "samples").glob("*h100*.gpuwatch"))
GIB = 1 << 30
MS = 10**6
STEP = 20 * MS
USED_MAX_AGE = 2 * 10**9  # an NVML sample older than this says nothing of the cursor
UUID = "GPU-0bad0ba2-0000-4000-8000-000000000025"
KEY = gpu_key(UUID)
CONTEXT = 0.5  # GiB each instrumented process holds outside torch
PHASES = (("forward", 0, 300), ("backward", 300, 650), ("optimizer.step", 650, 800))


class Truth:
    """The GPU's real memory per pid over time, in GiB at 1 ms (what NVML reads late)."""

    def __init__(self, ms: int) -> None:
        self.ms = ms
        self.by_pid: dict[int, list[float]] = {}

    def hold(self, pid: int, t0: int, t1: int, gib: float) -> None:
        row = self.by_pid.setdefault(pid, [0.0] * (self.ms + 1))
        for i in range(max(0, t0), min(t1, self.ms + 1)):
            row[i] = gib

    def at(self, ms: int) -> dict[int, float]:
        ms = min(max(ms, 0), self.ms)
        return {pid: row[ms] for pid, row in self.by_pid.items() if row[ms] > 0}


def _gpu(s: Session) -> None:
    s.add_device(
        Device(KEY, "gpu", index=0, name="NVIDIA H100 80GB HBM3", uuid=UUID, total=80 * GIB)
    )


def _nvml(s: Session, truth: Truth, lag: int, rng: random.Random) -> None:
    """Samples as the GPU sampler takes them: used at 10 Hz, read ``lag`` ms late (and a
    little jitter); the process list once a second, stored only when it changes."""
    last = None
    for ms in range(0, truth.ms + 1, 100):
        late = ms - lag - rng.randrange(0, 30)
        used = sum(truth.at(late).values())
        s.add_gpu_sample(KEY, synthetic_row(ms, used))
        if ms % 1000 == 500:
            rows = sorted((pid, int(g * GIB), 0) for pid, g in truth.at(late).items())
            if rows != last:
                last = rows
                s.add_gpu_processes(KEY, ms * MS, rows)


def synthetic_row(ms: int, used_gib: float) -> dict:
    return {
        "t": ms * MS,
        "used": int(used_gib * GIB),
        "free": int((80 - used_gib) * GIB),
        "total": 80 * GIB,
        "reserved": 0,
        "util_gpu": 90.0,
        "util_mem": 50.0,
        "temp": 60.0,
        "power": 400.0,
        "power_limit": 700.0,
        "clock_sm": 1980.0,
        "clock_mem": 2619.0,
    }


def _train(
    s: Session,
    truth: Truth,
    pid: int,
    start: int,
    steps: int,
    weights: float,
    grow: float,
    oom_at: int | None = None,
) -> Script:
    """A script's messages: hello, facts, phases whose reserved grows by ``grow`` GiB in
    its first step (fast: NVML lags it), an OOM at step ``oom_at`` that releases the cache
    (as torch's allocator does before it raises). Fills ``truth`` with its memory."""
    script = Script(s, pid)
    script.send(
        "hello",
        start * MS,
        argv=["train.py"],
        devices=[{"index": 0, "uuid": UUID[4:], "name": "H100", "total": 80 * GIB}],
    )
    shape = ModelShape(layers=32, hidden=2560, heads=32, vocab=50257)
    facts = facts_from_shape(
        shape, batch=3, seq=1024, precision="fp32", optimizer="adamw", impl="foreach"
    )
    script.send("facts", start * MS + MS, facts=facts)
    reserved = weights + 0.1
    sid = 0
    t = start + 10
    truth.hold(pid, start, t, CONTEXT)
    for step in range(steps):
        for name, a, b in PHASES:
            t0, t1 = t + a, t + b
            alloc = weights + (grow if name != "optimizer.step" else grow / 2)
            peak = alloc + (grow / 4 if name == "optimizer.step" else 0)
            if step == 0:
                # Reserved grows through the first forward in three quick jumps.
                for k, frac in enumerate((0.3, 0.7, 1.0)):
                    tk = t0 + 20 + 40 * k
                    r = weights + 0.1 + grow * 1.25 * frac
                    truth.hold(pid, tk, 10**9, CONTEXT + r)
                    script.send(
                        "memory",
                        tk * MS,
                        dev=0,
                        allocated=int(r * 0.8 * GIB),
                        reserved=int(r * GIB),
                    )
                reserved = weights + 0.1 + grow * 1.25
            sid += 1
            body = dict(name=name, id=sid, depth=0, step=step, dev=0)
            script.send(
                "phase",
                t0 * MS,
                event="begin",
                allocated=int(weights * GIB),
                reserved=int(reserved * GIB),
                **body,
            )
            if oom_at == step and name == "forward":
                tk = t0 + 150
                reserved = weights + 0.3
                truth.hold(pid, tk, 10**9, CONTEXT + reserved)
                script.send(
                    "oom",
                    tk * MS,
                    requested=192 * GIB,
                    free=70 * GIB,
                    total=80 * GIB,
                    phase=name,
                    step=step,
                    dev=0,
                    allocated=int(weights * GIB),
                    reserved=int(reserved * GIB),
                )
                grow = 0.0
            script.send(
                "phase",
                t1 * MS,
                event="end",
                allocated=int(alloc * GIB),
                reserved=int(reserved * GIB),
                peak_allocated=int(peak * GIB),
                peak_reserved=int(reserved * GIB),
                **body,
            )
        t += 1000
    return script


def made_recording(tmp: Path, kind: str, seed: int = 25) -> Path:
    """A recording of one scenario: ``exit``, ``oom`` or ``lag``."""
    rng = random.Random(seed)
    s = Session(t_origin=0, wall_offset=1_700_000_000 * 10**9)
    _gpu(s)
    truth = Truth(8000)
    truth.hold(999, 2000, 6000, 3.0)  # a process gpuwatch does not instrument
    if kind == "exit":
        script = _train(s, truth, 4001, 100, 4, weights=10.7, grow=24.0)
        end = 100 + 10 + 4 * 1000
        script.send("bye", end * MS, exit_code=0)
        # The driver frees its memory 400 ms after the process said goodbye.
        truth.hold(4001, end + 400, 10**9, 0.0)
        _train(s, truth, 4002, 5000, 2, weights=2.0, grow=6.0)
        lag = 60
    elif kind == "oom":
        _train(s, truth, 4003, 100, 6, weights=1.5, grow=20.0, oom_at=3)
        lag = 80
    else:
        _train(s, truth, 4004, 100, 6, weights=10.7, grow=45.0)
        lag = 150
    _nvml(s, truth, lag, rng)
    return save_session(s, tmp / f"{kind}.gpuwatch")


def assert_bar_fits(path: Path) -> int:
    """Step the cursor every 20 ms through ``path``; returns the instants checked."""
    s = load(path)
    lines = predictions(s)
    lines.update()
    first, last = s.time_range()
    checked = 0
    for key, dev in s.devices.items():
        if dev.kind != "gpu" or not s.processes_on(key):
            continue
        table = s.gpu[key]
        for t in range(first, last + 1, STEP):
            b = breakdown(s, key, t, lines)
            row = table.at(t)
            fresh = row is not None and t - int(row["t"]) <= USED_MAX_AGE
            limit = float(row["used"]) if fresh else float(dev.total)
            parts = b.parts()
            for name, v in parts:
                assert v >= 0, f"{path.name} @ {(t - s.t_origin) / 1e9:.2f}s: {name} {v}"
            total = sum(v for _, v in parts)
            assert total <= limit + 1, (
                f"{path.name} @ {(t - s.t_origin) / 1e9:.2f}s: the bar sums to "
                f"{total / GIB:.2f} GiB of {limit / GIB:.2f} used: {parts}"
            )
            checked += 1
    return checked


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_the_bar_never_sums_past_the_device_in_a_sample(sample: Path) -> None:
    assert assert_bar_fits(sample) > 900


@pytest.mark.parametrize("kind", ["exit", "oom", "lag"])
def test_the_bar_never_sums_past_the_device_in_made_recordings(tmp_path, kind: str) -> None:
    assert assert_bar_fits(made_recording(tmp_path, kind)) > 300


def test_an_exited_process_keeps_no_figures(tmp_path) -> None:
    s = load(made_recording(tmp_path, "exit"))
    proc = s.processes[4001]
    after = proc.ended + 200 * MS  # NVML still shows its memory: the driver frees it later
    b = breakdown(s, KEY, after, predictions(s))
    assert b.reserved is None and b.allocated is None and not b.predicted
    assert b.used > 30 * GIB and dict(b.parts()) == {"unsplit": b.used}
    assert b.why.startswith("process list")  # it names it, from before it exited


def test_at_an_oom_the_released_cache_is_not_called_context(tmp_path) -> None:
    s = load(made_recording(tmp_path, "oom"))
    oom = s.ooms[0]
    b = breakdown(s, KEY, oom.t + 20 * MS, predictions(s))
    # The allocator released its cache; NVML's used sample (and the process list) are from
    # before: neither may be split as if current.
    assert b.reserved == pytest.approx(1.8 * GIB, rel=0.01)
    assert b.context is None and b.unsplit > 15 * GIB and "predates" in b.why
    assert b.ages["nvidia-smi"] <= 100 * MS and b.ages["processes"] > 0
