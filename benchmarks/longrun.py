"""A long generated recording: 8 GPUs x 10 Hz with a DDP job on them, written hour by hour.

What a DDP job on 8 GPUs would leave: one instrumented process per GPU stepping every 2 s
through data / forward / backward / optimizer.step / zero_grad (allocator figures and
exact peaks at every boundary), each process's RSS and the host at 10 Hz, NVML process
lists at 1 Hz, a mark every 1000 steps and two OOMs; the largest spike of the run sits on
GPU 3 halfway through. It is written the way the recorder writes: a session that keeps
only its newest rows in memory (``Session.bound``) and a ``SessionWriter`` synced once per
generated hour, so a week is generated in the memory of an hour.

Used by bench_recording.py and bench_merge.py.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from gpuwatch.session import Device, Mark, Oom, Session, gpu_key, restore  # noqa: E402
from gpuwatch.store import SessionWriter  # noqa: E402

SECOND = 10**9
HOUR = 3600 * SECOND
GIB = 1 << 30
MIB = 1 << 20
GPUS = 8
HZ = 10
STEP = 2 * SECOND
PHASES = (  # name, start and end within a step (fraction of STEP)
    ("data", 0.00, 0.02),
    ("forward", 0.02, 0.35),
    ("backward", 0.35, 0.80),
    ("optimizer.step", 0.80, 0.95),
    ("zero_grad", 0.95, 0.96),
)
T0 = 10**15
MISSING = np.iinfo(np.int64).min


def _times(rng: np.random.Generator, t0: int, n: int, period: int, jitter: int) -> np.ndarray:
    return t0 + np.arange(n, dtype=np.int64) * period + rng.integers(0, jitter, n)


def write_recording(path: Path, hours: float, seed: int = 0, label: str = "") -> int:
    """Generate ``hours`` of the job into a new recording at ``path``; returns NVML samples."""
    rng = np.random.default_rng(seed)
    s = Session(t_origin=T0, wall_offset=1_700_000_000 * SECOND)
    s.live = False
    s.bound(16_384)
    s.ensure_host("bench-host", 2048 * GIB)
    keys = []
    for g in range(GPUS):
        uuid = f"GPU-{g:08x}-0000-0000-0000-000000000000"
        keys.append(gpu_key(uuid))
        name = "NVIDIA H100 80GB HBM3"
        s.add_device(Device(keys[-1], "gpu", index=g, name=name, uuid=uuid, total=80 * GIB))
    pids = [10_000 + g for g in range(GPUS)]
    for g, pid in enumerate(pids):
        restore.process(
            s,
            pid,
            {
                "first_t": T0,
                "hello": {
                    "argv": ["train.py", "--ddp"],
                    "rank": g,
                    "local_rank": g,
                    "world_size": GPUS,
                    "torch": "2.5.1",
                    "devices": [{"index": 0, "uuid": keys[g][4:]}],
                },
                "facts": {"params": 7_000_000_000, "optimizer": {"class": "AdamW"}},
                "devices": {0: keys[g]},
            },
        )
    names = np.array([s.name_id(name) for name, *_ in PHASES], np.int32)
    writer = SessionWriter(path, s, label=label or f"benchmark: {hours:g} h x 8 GPUs x 10 Hz")
    total = int(hours * HOUR)
    n_hours = math.ceil(hours)
    host_used = 400 * GIB
    rss = [12 * GIB] * GPUS
    step0 = 0
    samples = 0
    for h in range(n_hours):
        start = T0 + h * HOUR
        dur = min(HOUR, total - h * HOUR)
        n = int(dur * HZ // SECOND)
        th = _times(rng, start, n, SECOND // HZ, 2_000_000)
        host_used += np.cumsum(rng.integers(-MIB, MIB + 1, n))
        s.host.extend({"t": th, "total": np.full(n, 2048 * GIB), "used": host_used, "available": 1})
        host_used = int(host_used[-1])
        steps = int(dur // STEP)
        step_t0 = start + np.arange(steps, dtype=np.int64) * STEP
        for g, key in enumerate(keys):
            samples += n
            _gpu(s, key, rng, start, n, spike=(g == 3 and h == n_hours // 2))
            proc = s.processes[pids[g]]
            tp = start + np.arange(n // HZ, dtype=np.int64) * SECOND
            s.gpu_procs[key].extend(
                {
                    "t": tp,
                    "pid": np.full(len(tp), pids[g]),
                    "used": np.full(len(tp), 40 * GIB),
                    "type": np.zeros(len(tp), np.int8),
                }
            )
            _phases(proc, names, step_t0, step0, rng)
            tr = _times(rng, start, n, SECOND // HZ, 2_000_000)
            walk = rss[g] + np.cumsum(rng.integers(-64, 65, n)) * 4096
            proc.rss.extend({"t": tr, "rss": walk})
            rss[g] = int(walk[-1])
            proc.last_t = int(tr[-1])
            for i in range(-step0 % 1000, steps, 1000):
                s.marks.append(
                    Mark(int(step_t0[i]) + STEP - 1, pids[g], f"step {step0 + i}: eval loss 2.1")
                )
        for pid, frac in ((pids[1], 0.25), (pids[5], 0.75)):
            t = T0 + int(total * frac)
            if start <= t < start + dur:
                body = {"phase": "forward", "requested": 4 * GIB, "message": "CUDA out of memory"}
                s.ooms.append(Oom(t, pid, body))
        step0 += steps
        writer.sync()
    writer.close()
    return samples


def _gpu(s: Session, key: str, rng: np.random.Generator, start: int, n: int, spike: bool) -> None:
    t = _times(rng, start, n, SECOND // HZ, 3_000_000)
    # Weights, gradients and optimizer state (flat) plus activations through each step.
    frac = ((t - T0) % STEP) / STEP
    act = np.interp(frac, [0, 0.02, 0.35, 0.80, 1.0], [0, 0, 18, 0, 0])
    used = (40 * GIB + (act * GIB).astype(np.int64) + 600 * MIB) // MIB * MIB
    spikes = rng.random(n) < 1e-4
    used[spikes] += rng.integers(1, 8, spikes.sum()) * GIB
    if spike:
        used[n // 2] = 80 * GIB - 200 * MIB  # the largest spike of the run
    util = np.clip(rng.normal(85, 10, n), 0, 100).round()
    s.gpu[key].extend(
        {
            "t": t,
            "used": used,
            "free": 80 * GIB - used,
            "total": np.full(n, 80 * GIB),
            "reserved": np.full(n, 512 * MIB),
            "util_gpu": util,
            "util_mem": (util * 0.6).round(),
            "temp": (62 + rng.integers(0, 8, n)).astype(np.float64),
            "power": rng.integers(350_000, 700_000, n) / 1000,
            "power_limit": np.full(n, 700.0),
            "clock_sm": np.where(rng.random(n) < 0.01, 1755.0, 1980.0),
            "clock_mem": np.full(n, 2619.0),
        }
    )


def _phases(
    p, names: np.ndarray, step_t0: np.ndarray, step0: int, rng: np.random.Generator
) -> None:
    steps = len(step_t0)
    k = len(PHASES)
    t0 = (step_t0[:, None] + np.array([int(a * STEP) for _, a, _ in PHASES])).ravel()
    t1 = (step_t0[:, None] + np.array([int(b * STEP) for _, _, b in PHASES])).ravel()
    jitter = rng.integers(0, 5_000_000, t0.shape)
    t0, t1 = t0 + jitter, t1 + jitter
    step = np.repeat(np.arange(step0, step0 + steps, dtype=np.int64), k)
    base = 40 * GIB
    alloc0 = base + np.tile(np.array([0, 0, 18, 0, 0]) * GIB, steps)
    alloc1 = base + np.tile(np.array([0, 18, 0, 0, 0]) * GIB, steps)
    peak = np.maximum(alloc0, alloc1) + rng.integers(0, GIB, t0.shape)
    m = steps * k
    first_id = step0 * k
    p.phases.extend(
        {
            "t1": t1,
            "t0": t0,
            "name": np.tile(names, steps),
            "step": step,
            "depth": np.zeros(m, np.int16),
            "id": np.arange(first_id, first_id + m, dtype=np.int64),
            "parent": np.full(m, MISSING),
            "dev": np.zeros(m, np.int64),
            "alloc0": alloc0,
            "reserved0": np.full(m, 64 * GIB),
            "alloc1": alloc1,
            "reserved1": np.full(m, 64 * GIB),
            "peak_alloc": peak,
            "peak_reserved": np.full(m, 64 * GIB),
            "error": np.zeros(m, np.int8),
        }
    )
    # Every boundary reports allocated/reserved and the exact peak since the previous one.
    tb = np.empty(2 * m, np.int64)
    tb[0::2], tb[1::2] = t0, t1
    ab = np.empty(2 * m, np.int64)
    ab[0::2], ab[1::2] = alloc0, alloc1
    unknown = np.full(2 * m, MISSING)
    p.torch.extend(
        {
            "t": tb,
            "dev": np.zeros(2 * m),
            "allocated": ab,
            "reserved": np.full(2 * m, 64 * GIB),
            "inactive_split": unknown,
            "alloc_retries": unknown,
            "alloc_ooms": unknown,
        }
    )
    prev = np.concatenate([[p.last_boundary or tb[0]], tb[:-1]])
    p.peaks.extend(
        {
            "t1": tb,
            "t0": prev,
            "dev": np.zeros(2 * m),
            "peak_allocated": np.repeat(peak, 2),
            "peak_reserved": np.full(2 * m, 64 * GIB),
        }
    )
    p.max_span = max(p.max_span, int((t1 - t0).max()))
    p.max_segment = max(p.max_segment, int((tb - prev).max()))
    p.last_boundary = int(tb[-1])
