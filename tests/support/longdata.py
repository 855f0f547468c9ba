"""Long sessions made fast: many rows written column-wise, recorded as the recorder records.

A session that keeps only its newest rows (``Session.bound``) is filled a slice at a time
and synced into a real recording after each slice, so tests get files of many chunks in
seconds. One GPU at 100 Hz carries a single one-sample spike; one process runs phases
(with a nested one every step) and reports allocator figures and exact peaks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpuwatch.session import Device, Session, gpu_key, restore
from gpuwatch.store import SessionWriter

T0 = 5 * 10**15
MS = 10**6
SECOND = 10**9
GIB = 1 << 30
UUID = "GPU-0badf00d-0000-0000-0000-000000000000"
KEY = gpu_key(UUID)
PID = 777
MISSING = np.iinfo(np.int64).min
STEP = 200 * MS
PHASES = (("forward", 0, 80), ("backward", 80, 170), ("optimizer.step", 170, 190))


def spike_time(seconds: float, clock: int = 0) -> int:
    """When the one-sample spike of :func:`record` happens (a sample time)."""
    return T0 + clock + int(seconds * 0.618 * 100) * 10 * MS


def new_session(keep: int | None = 2048, clock: int = 0) -> Session:
    """The session, its monotonic clock ``clock`` ns ahead (another host's) at one wall time."""
    s = Session(t_origin=T0 + clock, wall_offset=1_700_000_000 * SECOND - clock)
    s.bound(keep)
    s.ensure_host("longhost", 64 * GIB)
    s.add_device(Device(KEY, "gpu", index=0, name="NVIDIA H100", uuid=UUID, total=80 * GIB))
    restore.process(
        s,
        PID,
        {
            "first_t": T0 + clock,
            "hello": {"argv": ["train.py"], "rank": 0, "world_size": 1},
            "facts": {"params": 1_000_000, "optimizer": {"class": "AdamW", "foreach": True}},
            "devices": {0: KEY},
        },
    )
    return s


def fill(s: Session, start: int, seconds: float, total: float, step0: int) -> int:
    """Add ``seconds`` of rows from ``start`` (the run is ``total`` long); returns steps."""
    n = int(seconds * 100)
    t = start + np.arange(n, dtype=np.int64) * 10 * MS
    used = np.full(n, 20 * GIB, dtype=np.int64) + (np.arange(n) % 7) * (1 << 20)
    used[t == spike_time(total, s.t_origin - T0)] = 70 * GIB
    s.gpu[KEY].extend(
        {
            "t": t,
            "used": used,
            "free": 80 * GIB - used,
            "total": np.full(n, 80 * GIB),
            "reserved": np.zeros(n, np.int64),
            "util_gpu": np.full(n, 50.0),
            "util_mem": np.full(n, 20.0),
            "temp": np.full(n, 60.0),
            "power": np.full(n, 300.0),
            "power_limit": np.full(n, 700.0),
            "clock_sm": np.full(n, 1980.0),
            "clock_mem": np.full(n, 2619.0),
        }
    )
    s.host.extend({"t": t[::10], "total": 64 * GIB, "used": 8 * GIB, "available": 56 * GIB})
    proc = s.processes[PID]
    proc.rss.extend({"t": t[::10] + 1, "rss": np.full(len(t[::10]), 2 * GIB)})
    steps = int(seconds * SECOND // STEP)
    base = start + np.arange(steps, dtype=np.int64) * STEP
    rows = []
    for name, a, b in PHASES:
        rows.append((s.name_id(name), base + a * MS, base + b * MS, 0))
    # A nested phase inside every forward.
    rows.append((s.name_id("attn"), base + 10 * MS, base + 30 * MS, 1))
    t1 = np.concatenate([r[2] for r in rows])
    order = np.argsort(t1, kind="stable")
    t0 = np.concatenate([r[1] for r in rows])[order]
    t1 = t1[order]
    names = np.concatenate([np.full(steps, r[0], np.int32) for r in rows])[order]
    depth = np.concatenate([np.full(steps, r[3], np.int16) for r in rows])[order]
    step = np.concatenate([np.arange(step0, step0 + steps)] * len(rows))[order]
    m = len(t1)
    peak = 30 * GIB + (step % 5) * GIB
    proc.phases.extend(
        {
            "t1": t1,
            "t0": t0,
            "name": names,
            "step": step,
            "depth": depth,
            "id": np.arange(m) + step0 * len(rows),
            "parent": np.full(m, MISSING),
            "dev": np.zeros(m, np.int64),
            "alloc0": np.full(m, 20 * GIB),
            "reserved0": np.full(m, 40 * GIB),
            "alloc1": np.full(m, 21 * GIB),
            "reserved1": np.full(m, 40 * GIB),
            "peak_alloc": peak,
            "peak_reserved": np.full(m, 40 * GIB),
            "error": np.zeros(m, np.int8),
        }
    )
    tb = np.unique(np.concatenate([t0, t1]))
    prev = np.concatenate([[tb[0] if proc.last_boundary is None else proc.last_boundary], tb[:-1]])
    proc.peaks.extend(
        {
            "t1": tb,
            "t0": prev,
            "dev": np.zeros(len(tb), np.int64),
            "peak_allocated": 25 * GIB + (tb // STEP % 3) * GIB,
            "peak_reserved": np.full(len(tb), 40 * GIB),
        }
    )
    unknown = np.full(len(tb), MISSING)
    proc.torch.extend(
        {
            "t": tb,
            "dev": np.zeros(len(tb), np.int64),
            "allocated": 20 * GIB + (tb // STEP % 4) * GIB,
            "reserved": np.full(len(tb), 40 * GIB),
            "inactive_split": unknown,
            "alloc_retries": unknown,
            "alloc_ooms": unknown,
        }
    )
    proc.max_span = max(proc.max_span, int((t1 - t0).max()))
    proc.max_segment = max(proc.max_segment, int((tb - prev).max()))
    proc.last_boundary = int(tb[-1])
    proc.last_t = int(tb[-1])
    return steps


def record(
    path: Path,
    seconds: float = 1200.0,
    slice_s: float = 60.0,
    keep: int | None = 2048,
    chunk_rows: int = 2048,
    clock: int = 0,
) -> Session:
    """Write ``seconds`` of the long session into ``path``, a slice at a time.

    Returns the session that wrote it (holding only its newest rows, or all of them with
    ``keep=None``); ``clock``: see :func:`new_session`.
    """
    s = new_session(keep, clock)
    writer = SessionWriter(path, s, chunk_rows=chunk_rows)
    done, step = 0.0, 0
    while done < seconds:
        part = min(slice_s, seconds - done)
        step += fill(s, T0 + clock + int(done * SECOND), part, seconds, step)
        done += part
        writer.sync()
    writer.close()
    return s
