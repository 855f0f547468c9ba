"""A session holding one of every fact a recording stores, and a comparison of sessions.

GPU rows are added to the session directly (no NVML here); script messages go through the
real protocol encoder and validator, so they are exactly what a receiver would ingest.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from gpuwatch import protocol
from gpuwatch.session import Device, Session, Table, gpu_key

T0 = 1_000_000_000_000
MS = 1_000_000
GIB = 1 << 30
UUID0 = "GPU-1111aaaa-0000-0000-0000-000000000000"
UUID1 = "GPU-2222bbbb-0000-0000-0000-000000000000"


class Script:
    """Sends validated protocol messages for one fake process into a session."""

    def __init__(self, session: Session, pid: int) -> None:
        self.session = session
        self.pid = pid
        self.seq = 0

    def send(self, kind: str, t: int, **body: Any) -> None:
        data = protocol.encode(kind, self.pid, self.seq, t, 0, body)
        self.seq += 1
        self.session.ingest(protocol.decode(data))


def add_gpu(session: Session, uuid: str, index: int) -> str:
    """Register an NVML GPU; returns its key."""
    key = gpu_key(uuid)
    session.add_device(
        Device(key, "gpu", index=index, name="NVIDIA H100", uuid=uuid, total=80 * GIB)
    )
    return key


def gpu_row(t: int, used: int | None, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "t": t,
        "used": used,
        "free": None if used is None else 80 * GIB - used,
        "total": 80 * GIB,
        "reserved": 512 << 20,
        "util_gpu": 50.0,
        "util_mem": 20.0,
        "temp": 60.0,
        "power": 300.5,
        "power_limit": 700.0,
        "clock_sm": 1980.0,
        "clock_mem": 2619.0,
    }
    row.update(extra)
    return row


def populated_session(steps: int = 5) -> Session:
    """A session with every kind of fact, ``steps`` training steps on one GPU process."""
    s = Session(t_origin=T0, wall_offset=1_700_000_000 * 10**9)
    s.ensure_host("testhost", 64 * GIB)
    k0 = add_gpu(s, UUID0, 0)
    k1 = add_gpu(s, UUID1, 1)
    gpu_script = Script(s, 4242)
    cpu_script = Script(s, 4343)
    gpu_script.send(
        "hello",
        T0,
        argv=["train.py", "--steps", str(steps)],
        hostname="testhost",
        wall_ns=1,
        rank=0,
        world_size=1,
        torch="2.5.0",
        devices=[{"index": 0, "uuid": UUID0[4:], "name": "NVIDIA H100", "total": 80 * GIB}],
        facts={"params": 1234, "optimizer": {"class": "AdamW", "foreach": True}},
    )
    cpu_script.send("hello", T0 + MS, argv=["cpu.py"], hostname="testhost", wall_ns=2)
    s.set_proc_info(4242, {"name": "python", "user": "me", "cmdline": "train.py", "visible": True})
    t = T0 + 10 * MS
    alloc = GIB
    phase_id = 0
    for step in range(steps):
        for name in ("forward", "backward", "optimizer.step"):
            phase_id += 1
            gpu_script.send(
                "phase", t, event="begin", name=name, id=phase_id, step=step, dev=0,
                allocated=alloc, reserved=2 * GIB,
            )  # fmt: skip
            if name == "forward":
                phase_id += 1
                gpu_script.send(
                    "phase", t + MS, event="begin", name="attn", id=phase_id, parent=phase_id - 1,
                    depth=1, step=step, dev=0, allocated=alloc, reserved=2 * GIB,
                )  # fmt: skip
                gpu_script.send(
                    "phase", t + 3 * MS, event="end", name="attn", id=phase_id, depth=1,
                    step=step, dev=0, allocated=alloc + GIB // 4, reserved=2 * GIB,
                    peak_allocated=alloc + GIB // 2, peak_reserved=2 * GIB,
                )  # fmt: skip
                open_id = phase_id - 1
            else:
                open_id = phase_id
            t += 10 * MS
            alloc += GIB // 8 if name == "forward" else -GIB // 16
            gpu_script.send(
                "phase", t, event="end", name=name, id=open_id, step=step, dev=0,
                allocated=alloc, reserved=2 * GIB + step * MS, peak_allocated=alloc + GIB // 3,
                peak_reserved=3 * GIB,
            )  # fmt: skip
            cpu_script.send("phase", t - 5 * MS, event="begin", name="data", id=phase_id)
            cpu_script.send("phase", t - 2 * MS, event="end", name="data", id=phase_id)
        gpu_script.send("memory", t + MS, dev=0, allocated=alloc, reserved=2 * GIB)
        gpu_script.send("mark", t + 2 * MS, text=f"step {step} done", step=step)
    gpu_script.send(
        "oom", t + 3 * MS, requested=GIB, free=0, total=80 * GIB, phase="forward",
        message="CUDA out of memory", dev=0, allocated=alloc, reserved=2 * GIB,
    )  # fmt: skip
    gpu_script.send("mark", t + 4 * MS, text="checkpoint saved", level="warning")
    # A phase that never ends (the script was killed inside it).
    gpu_script.send(
        "phase", t + 5 * MS, event="begin", name="eval", id=10_000, dev=0, allocated=alloc,
        reserved=2 * GIB,
    )  # fmt: skip
    cpu_script.send("bye", t + 6 * MS, exit_code=0)
    end = t + 10 * MS
    for i, ts in enumerate(range(T0, end, 5 * MS)):
        s.add_gpu_sample(k0, gpu_row(ts, 3 * GIB + (i % 7) * (64 << 20)))
        s.add_gpu_sample(k1, gpu_row(ts, None if i % 5 == 0 else 1 * GIB, temp=float("nan")))
        s.add_host_sample({"t": ts, "total": 64 * GIB, "used": 20 * GIB + i, "available": 1})
        s.add_rss(4242, ts, 900 << 20)
        s.add_rss(4343, ts + 1, (300 << 20) + i)
        if i % 4 == 0:
            s.add_gpu_processes(k0, ts, [(4242, 3 * GIB, 0), (999, None, 1)])
            s.add_gpu_processes(k1, ts, [])
    s.count_reject("json")
    s.count_reject("json")
    s.count_reject("version", 4242)  # its sender known: counted for the process too
    s.note("NVML sampling is not available in this build: host only")
    s.set_device_state(k1, "lost", "fell off the bus")
    s.sampler_rate["host"] = 10.0
    return s


def table_arrays(table: Table) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in table.snapshot().items()}


def assert_tables_equal(a: Table, b: Table, what: str) -> None:
    ca, cb = table_arrays(a), table_arrays(b)
    assert list(ca) == list(cb), what
    for name in ca:
        np.testing.assert_array_equal(ca[name], cb[name], err_msg=f"{what}.{name}")


def assert_sessions_equal(live: Session, loaded: Session) -> None:
    """Everything the dashboard draws from is the same in both sessions."""
    assert loaded.t_origin == live.t_origin and loaded.wall_offset == live.wall_offset
    assert loaded.names == live.names
    assert {k: dataclasses.asdict(d) for k, d in loaded.devices.items()} == {
        k: dataclasses.asdict(d) for k, d in live.devices.items()
    }
    assert_tables_equal(live.host, loaded.host, "host")
    assert set(loaded.gpu) == set(live.gpu)
    for key in live.gpu:
        assert_tables_equal(live.gpu[key], loaded.gpu[key], f"gpu[{key}]")
        assert_tables_equal(live.gpu_procs[key], loaded.gpu_procs[key], f"gpu_procs[{key}]")
    assert set(loaded.processes) == set(live.processes)
    for pid, p in live.processes.items():
        q = loaded.processes[pid]
        for kind in ("torch", "peaks", "rss", "phases"):
            assert_tables_equal(getattr(p, kind), getattr(q, kind), f"{pid}.{kind}")
        names = ("hello", "facts", "devices", "dropped", "gaps", "rejected", "ended", "exit_code")
        for name in names:
            assert getattr(q, name) == getattr(p, name), f"{pid}.{name}"
        assert q.max_span == p.max_span and q.max_segment == p.max_segment
        assert {k: dataclasses.asdict(o) for k, o in q.open.items()} == {
            k: dataclasses.asdict(o) for k, o in p.open.items()
        }
    assert loaded.marks == live.marks
    assert loaded.ooms == live.ooms
    assert loaded.rejects == live.rejects
    assert loaded.notes == live.notes
    assert loaded.proc_info == live.proc_info
    assert loaded.sampler_rate == live.sampler_rate
    assert loaded.time_range() == live.time_range()


def as_schema_1(path: Path) -> None:
    """Rewrite a recording as gpuwatch wrote it before codec 2: every chunk one stream,
    ``meta.schema`` 1 (what a file from an older gpuwatch holds)."""
    import sqlite3

    from gpuwatch.store import _codec
    from gpuwatch.store._schema import layout_dtypes

    with sqlite3.connect(path) as db:
        layouts = {
            sid: layout_dtypes(tuple(tuple(c) for c in json.loads(columns)))
            for sid, columns in db.execute("SELECT id, columns FROM series")
        }
        chunks = db.execute("SELECT rowid, series, n, codec, data FROM chunks").fetchall()
        for rowid, sid, n, codec, blob in chunks:
            cols = _codec.decode(blob, n, layouts[sid], codec)
            old = _codec.encode(cols, layouts[sid], 0, n, codec=_codec.STREAM)
            db.execute(
                "UPDATE chunks SET codec = ?, data = ? WHERE rowid = ?",
                (_codec.STREAM, old, rowid),
            )
        db.execute("UPDATE meta SET value = '1' WHERE key = 'schema'")
