"""Recording at scale: file size, replay's first frame, seeking, and the recorder's CPU.

A generated session of 24 h x 8 GPUs x 10 Hz (about 7 million NVML samples) with what a
DDP job on 8 GPUs would add: one instrumented process per GPU stepping every 2 s through
data / forward / backward / optimizer.step / zero_grad (allocator figures and exact peaks
at every boundary), each process's RSS and the host at 10 Hz, NVML process lists at 1 Hz,
marks and two OOMs. Targets (issue 5):

- file size at most 300 MB;
- ``gpuwatch replay`` start to first frame within 1 s: a fresh interpreter runs what
  ``gpuwatch replay`` runs (``open_replay`` and ``ReplayApp``, headless) and reports when
  the app has drawn its first frame; the time is taken in this process, from before the
  child is started, so interpreter start and imports count;
- seek to a random point within 50 ms: in the same child, once everything is loaded,
  ``Player.seek`` to a random time, then the app's synchronous redraw of every panel and a
  screen refresh; the worst of 30 seeks is compared with the target;
- the recorder at most 2% of one core while writing 100 Hz x 8 GPUs (plus host, RSS and
  8 processes' phases): the recorder thread's CPU time over wall time, plus what its
  listener costs the sampler threads (calls per second x measured cost per call).

Run: python benchmarks/bench_recording.py [--hours 24] [--keep FILE] [--cpu-seconds 30]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from gpuwatch.session import Device, Mark, Oom, Process, Session, gpu_key  # noqa: E402
from gpuwatch.store import Recorder, save_session  # noqa: E402

SECOND = 10**9
GIB = 1 << 30
MIB = 1 << 20
GPUS = 8
HZ = 10
STEP = 2 * SECOND
PHASES = (  # name, start and end within a step (fraction of STEP), activations added
    ("data", 0.00, 0.02, 0.0),
    ("forward", 0.02, 0.35, 18.0),
    ("backward", 0.35, 0.80, -18.0),
    ("optimizer.step", 0.80, 0.95, 0.0),
    ("zero_grad", 0.95, 0.96, 0.0),
)
T0 = 10**15


def _times(rng: np.random.Generator, n: int, period: int, jitter: int) -> np.ndarray:
    t = T0 + np.arange(n, dtype=np.int64) * period
    return t + rng.integers(0, jitter, n)


def generate(hours: float, seed: int = 0) -> Session:
    """The synthetic session (vectorised: a few seconds for 24 h)."""
    rng = np.random.default_rng(seed)
    s = Session(t_origin=T0, wall_offset=1_700_000_000 * SECOND)
    s.live = False
    n = int(hours * 3600 * HZ)
    dur = n * SECOND // HZ
    s.ensure_host("bench-host", 2048 * GIB)
    th = _times(rng, n, SECOND // HZ, 2_000_000)
    used_h = 400 * GIB + np.cumsum(rng.integers(-MIB, MIB + 1, n))
    s.host.extend(
        {"t": th, "total": np.full(n, 2048 * GIB), "used": used_h, "available": 2048 * GIB - used_h}
    )
    steps = int(dur // STEP)
    step_t0 = T0 + np.arange(steps, dtype=np.int64) * STEP
    for g in range(GPUS):
        uuid = f"GPU-{g:08x}-0000-0000-0000-000000000000"
        key = gpu_key(uuid)
        s.add_device(
            Device(key, "gpu", index=g, name="NVIDIA H100 80GB HBM3", uuid=uuid, total=80 * GIB)
        )
        t = _times(rng, n, SECOND // HZ, 3_000_000)
        # Weights, gradients and optimizer state (flat) plus activations through each step.
        frac = ((t - T0) % STEP) / STEP
        act = np.interp(frac, [0, 0.02, 0.35, 0.80, 1.0], [0, 0, 18, 0, 0])
        used = (40 * GIB + (act * GIB).astype(np.int64) + 600 * MIB) // MIB * MIB
        spikes = rng.random(n) < 1e-4
        used[spikes] += rng.integers(1, 8, spikes.sum()) * GIB
        if g == 3:
            used[n // 2] = 80 * GIB - 200 * MIB  # the largest spike of the day
        util = np.clip(rng.normal(85, 10, n), 0, 100).round()
        temp = (62 + 8 * np.sin(np.arange(n) / 36000) + rng.integers(0, 2, n)).round()
        power = rng.integers(350_000, 700_000, n) / 1000
        s.gpu[key].extend(
            {
                "t": t,
                "used": used,
                "free": 80 * GIB - used,
                "total": np.full(n, 80 * GIB),
                "reserved": np.full(n, 512 * MIB),
                "util_gpu": util,
                "util_mem": (util * 0.6).round(),
                "temp": temp,
                "power": power,
                "power_limit": np.full(n, 700.0),
                "clock_sm": np.where(rng.random(n) < 0.01, 1755.0, 1980.0),
                "clock_mem": np.full(n, 2619.0),
            }
        )
        pid = 10_000 + g
        tp = T0 + np.arange(n // HZ, dtype=np.int64) * SECOND
        procs = s.gpu_procs[key]
        procs.extend(
            {
                "t": tp,
                "pid": np.full(len(tp), pid),
                "used": used[::HZ][: len(tp)],
                "type": np.zeros(len(tp), np.int8),
            }
        )
        p = Process(pid, first_t=T0)
        p.hello = {
            "argv": ["train.py", "--ddp"],
            "rank": g,
            "local_rank": g,
            "world_size": GPUS,
            "torch": "2.5.1",
            "devices": [{"index": 0, "uuid": uuid[4:]}],
        }
        p.facts = {"params": 7_000_000_000, "optimizer": {"class": "AdamW", "foreach": True}}
        p.devices = {0: key}
        s.processes[pid] = p
        _phases(s, p, step_t0, rng)
        tr = _times(rng, n, SECOND // HZ, 2_000_000)
        p.rss.extend({"t": tr, "rss": 12 * GIB + np.cumsum(rng.integers(-64, 65, n)) * 4096})
        p.last_t = int(tr[-1])
        for i in range(0, steps, 1000):
            s.marks.append(
                Mark(int(step_t0[i]) + STEP - 1, pid, f"step {i}: eval loss 2.1", step=i)
            )
    for pid, frac in ((10_001, 0.25), (10_005, 0.75)):
        t = T0 + int(dur * frac)
        s.ooms.append(
            Oom(t, pid, {"phase": "forward", "requested": 4 * GIB, "message": "CUDA out of memory"})
        )
    return s


def _phases(s: Session, p: Process, step_t0: np.ndarray, rng: np.random.Generator) -> None:
    steps = len(step_t0)
    k = len(PHASES)
    t0 = (step_t0[:, None] + np.array([int(a * STEP) for _, a, _, _ in PHASES])).ravel()
    t1 = (step_t0[:, None] + np.array([int(b * STEP) for _, _, b, _ in PHASES])).ravel()
    jitter = rng.integers(0, 5_000_000, t0.shape)
    t0, t1 = t0 + jitter, t1 + jitter
    names = np.tile(np.array([s.name_id(name) for name, *_ in PHASES], np.int32), steps)
    step = np.repeat(np.arange(steps, dtype=np.int64), k)
    base = 40 * GIB
    act = np.tile(np.array([0, 0, 18, 0, 0]) * GIB, steps)
    alloc0 = base + act
    alloc1 = base + np.tile(np.array([0, 18, 0, 0, 0]) * GIB, steps)
    peak = np.maximum(alloc0, alloc1) + rng.integers(0, GIB, t0.shape)
    m = steps * k
    p.phases.extend(
        {
            "t1": t1,
            "t0": t0,
            "name": names,
            "step": step,
            "depth": np.zeros(m, np.int16),
            "id": np.arange(m, dtype=np.int64),
            "parent": np.full(m, np.iinfo(np.int64).min),
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
    p.torch.extend(
        {"t": tb, "dev": np.zeros(2 * m), "allocated": ab, "reserved": np.full(2 * m, 64 * GIB)}
    )
    prev = np.concatenate([[tb[0]], tb[:-1]])
    pk = np.repeat(peak, 2)
    p.peaks.extend(
        {
            "t1": tb,
            "t0": prev,
            "dev": np.zeros(2 * m),
            "peak_allocated": pk,
            "peak_reserved": np.full(2 * m, 64 * GIB),
        }
    )
    p.max_span = int((t1 - t0).max())
    p.max_segment = int((tb - prev).max())
    p.last_boundary = int(tb[-1])


# --------------------------------------------------------------------------- replay child

CHILD = r"""
import time
START = time.perf_counter()
import asyncio, os, random, statistics, sys
sys.path.insert(0, {root!r})
from gpuwatch.store.player import open_replay
from gpuwatch.tui.replay import ReplayApp

async def main():
    t = time.perf_counter()
    player = open_replay({path!r})
    print("OPEN", time.perf_counter() - t, flush=True)
    app = ReplayApp(player, subtitle="bench")
    async with app.run_test(size=(160, 60)) as pilot:
        while app.redraws < 1:
            await pilot.pause()
        await pilot.pause()
        print("FIRST", flush=True)
        loader = player.loader
        t = time.perf_counter()
        while not loader.done:
            await asyncio.sleep(0.05)
        print("LOADED", time.perf_counter() - t, flush=True)
        player.pause()
        first, last = player.bounds()
        rng = random.Random(1)
        data, total = [], []
        for _ in range(30):
            target = rng.randrange(first, last)
            t = time.perf_counter()
            player.seek(target)
            app.redraw()  # every panel fetches and decimates its new window
            data.append(time.perf_counter() - t)
            await pilot.pause()  # and the screen is painted
            total.append(time.perf_counter() - t)
        print("SEEK", max(data), statistics.median(total), max(total), flush=True)
    os._exit(0)  # skip teardown: only the figures matter here

asyncio.run(main())
"""


def measure_replay(path: Path) -> dict[str, float]:
    """Figures from a fresh interpreter that runs ``gpuwatch replay``'s path headless."""
    code = CHILD.format(root=str(ROOT), path=str(path))
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    out: dict[str, float] = {}
    for line in child.stdout:
        word, *values = line.split()
        if word == "FIRST":
            out["first"] = time.perf_counter() - start
        elif word == "OPEN":
            out["open"] = float(values[0])
        elif word == "LOADED":
            out["loaded"] = float(values[0])
        elif word == "SEEK":
            out["seek_data"], out["seek_median"], out["seek_max"] = map(float, values)
    err = child.stderr.read() if child.stderr else ""
    if child.wait() != 0 or "seek_max" not in out:
        raise RuntimeError(f"replay child failed:\n{err}")
    return out


# --------------------------------------------------------------------------- recorder CPU


def measure_recorder(seconds: float, rate: int = 100) -> tuple[float, float, int]:
    """(recorder thread CPU share, listener CPU share, rows written) at ``rate`` Hz x 8 GPUs."""
    from gpuwatch import protocol

    tmp = Path(tempfile.mkdtemp(prefix="gw-bench-"))
    s = Session()
    s.ensure_host("bench", 64 * GIB)
    keys = []
    for g in range(GPUS):
        uuid = f"GPU-{g:08x}-1111-0000-0000-000000000000"
        keys.append(gpu_key(uuid))
        s.add_device(Device(keys[-1], "gpu", index=g, uuid=uuid, total=80 * GIB))
    rec = Recorder(s, tmp / "cpu.gpuwatch")
    rec.start()
    stop = threading.Event()
    row = {
        "used": 40 * GIB, "free": 40 * GIB, "total": 80 * GIB, "reserved": 512 * MIB,
        "util_gpu": 90.0, "util_mem": 50.0, "temp": 70.0, "power": 500.0,
        "power_limit": 700.0, "clock_sm": 1980.0, "clock_mem": 2619.0,
    }  # fmt: skip

    def nvml() -> None:  # one sampler thread, as the NVML sampler polls all GPUs in turn
        next_t = time.monotonic()
        i = 0
        while not stop.is_set():
            t = time.monotonic_ns()
            for k in keys:
                s.add_gpu_sample(k, {**row, "t": t, "used": 40 * GIB + (i % 50) * MIB})
            if i % rate == 0:
                for n, k in enumerate(keys):
                    s.add_gpu_processes(k, t, [(20_000 + n, 40 * GIB, 0)])
            if i % (rate // 10) == 0:
                s.add_host_sample(
                    {"t": t, "total": 64 * GIB, "used": 10 * GIB, "available": 54 * GIB}
                )
                for n in range(GPUS):
                    s.add_rss(20_000 + n, t, 8 * GIB)
            i += 1
            next_t += 1 / rate
            time.sleep(max(0.0, next_t - time.monotonic()))

    def script(pid: int) -> None:  # each rank: 5 phases per 200 ms step, figures at boundaries
        seq = 0
        sid = 0
        while not stop.is_set():
            for name in ("data", "forward", "backward", "optimizer.step", "zero_grad"):
                for event in ("begin", "end"):
                    body = {"event": event, "name": name, "id": sid, "step": seq // 10, "dev": 0,
                            "allocated": 40 * GIB, "reserved": 60 * GIB}  # fmt: skip
                    if event == "end":
                        body |= {"peak_allocated": 41 * GIB, "peak_reserved": 60 * GIB}
                    s.ingest(protocol.Message("phase", pid, seq, time.monotonic_ns(), 0, body))
                    seq += 1
                sid += 1
                time.sleep(0.04)

    for n in range(GPUS):
        s.ingest(
            protocol.Message(
                "hello", 20_000 + n, 0, time.monotonic_ns(), 0,
                {"argv": ["train.py"], "devices": [{"index": 0, "uuid": keys[n][4:]}]},
            )
        )  # fmt: skip
    threads = [threading.Thread(target=nvml)] + [
        threading.Thread(target=script, args=(20_000 + n,)) for n in range(GPUS)
    ]
    for th in threads:
        th.start()
    wall = time.monotonic()
    cpu0, facts0 = rec.cpu_seconds, s.version
    time.sleep(seconds)
    cpu, facts = rec.cpu_seconds - cpu0, s.version - facts0
    wall = time.monotonic() - wall
    stop.set()
    for th in threads:
        th.join()
    rec.close()
    rows = rec.rows_written
    # The listener runs on the sampler threads: time it alone, for both kinds of call.
    calls = 200_000
    msg = protocol.Message("phase", 1, 0, 0, 0, {"event": "end"})
    rec._active = True
    t = time.perf_counter()
    for _ in range(calls):
        rec._listen("gpu", (keys[0], row))
        rec._listen("message", (msg,))
    per_call = (time.perf_counter() - t) / (2 * calls)
    return cpu / wall, facts / wall * per_call, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--keep", metavar="FILE", help="write the recording here and keep it")
    ap.add_argument("--cpu-seconds", type=float, default=30.0)
    ap.add_argument("--file", metavar="FILE", help="measure this recording (from --keep)")
    args = ap.parse_args()
    results: list[tuple[str, str, bool]] = []

    tmp = Path(tempfile.mkdtemp(prefix="gw-bench-"))
    if args.file:
        path = Path(args.file)
    else:
        t = time.perf_counter()
        session = generate(args.hours)
        gen = time.perf_counter() - t
        samples = sum(len(tab) for tab in session.gpu.values())
        phases = sum(len(p.phases) for p in session.processes.values())
        print(f"generated {samples:,} NVML samples, {phases:,} phases in {gen:.1f} s")
        path = Path(args.keep) if args.keep else tmp / "day.gpuwatch"
        t = time.perf_counter()
        save_session(session, path, label="benchmark: 24 h x 8 GPUs x 10 Hz", overwrite=True)
        print(f"wrote {path} in {time.perf_counter() - t:.1f} s")
        del session
    size = os.path.getsize(path)
    results.append(("file size", f"{size / 1e6:.1f} MB (target <= 300 MB)", size <= 300e6))

    r = measure_replay(path)
    results.append(
        (
            "replay start to first frame",
            f"{r['first'] * 1000:.0f} ms, of which opening the file and loading what the "
            f"first frame needs {r['open'] * 1000:.0f} ms (target <= 1000 ms)",
            r["first"] <= 1.0,
        )
    )
    print(f"(everything loaded {r['loaded']:.2f} s after the first frame, with the app running)")
    results.append(
        (
            "seek to a random point: position and every panel's data",
            f"worst {r['seek_data'] * 1000:.1f} ms of 30 (target <= 50 ms)",
            r["seek_data"] <= 0.05,
        )
    )
    results.append(
        (
            "seek to a random point, screen painted (today's TUI)",
            f"worst {r['seek_max'] * 1000:.1f} ms, median {r['seek_median'] * 1000:.1f} ms "
            "(target <= 50 ms)",
            r["seek_max"] <= 0.05,
        )
    )
    share, listener, rows = measure_recorder(args.cpu_seconds)
    total = share + listener
    results.append(
        (
            "recorder CPU at 100 Hz x 8 GPUs",
            f"{total * 100:.2f}% of one core: thread {share * 100:.2f}% + listener "
            f"{listener * 100:.2f}%, {rows:,} rows (target <= 2%)",
            total <= 0.02,
        )
    )
    for f in tmp.iterdir():
        f.unlink()
    tmp.rmdir()
    print()
    for name, text, ok in results:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {text}")
    return 0 if all(ok for *_, ok in results) else 1


if __name__ == "__main__":
    sys.exit(main())
