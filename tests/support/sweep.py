"""A recording of a sweep of short instrumented processes (issue 23, item 6), written by
the real writer from a real Session fed the messages each script sends: tests and
``benchmarks/bench_sweep_reading.py`` read it back."""

from __future__ import annotations

import itertools
from pathlib import Path

from gpuwatch.protocol import Message
from gpuwatch.session import Session
from gpuwatch.store.writer import SessionWriter

PHASES = 20
MS = 10**6


def write_sweep(path: Path, count: int) -> Path:
    """``count`` short scripts one after another on a host sampled between them, each a
    hello, a mark, phases with peaks, RSS samples and a bye (the last one killed: none)."""
    s = Session(t_origin=0, wall_offset=0)
    s.bound()
    s.ensure_host("sweephost", 64 << 30)
    writer = SessionWriter(path, s)
    t = 10 * MS
    for pid in range(1000, 1000 + count):
        seq = itertools.count(1)

        def send(kind: str, pid: int = pid, seq=seq, **body) -> None:
            nonlocal t
            t += MS
            s.ingest(Message(kind=kind, pid=pid, seq=next(seq), t=t, body=body))

        used = (8 << 30) + (pid << 20)
        s.add_host_sample({"t": t, "total": 64 << 30, "used": used, "available": (64 << 30) - used})
        send("hello", argv=["python", "sweep.py", str(pid)])
        send("mark", text=f"process {pid}")
        for i in range(PHASES):
            send("phase", event="begin", id=i, name="step", depth=0)
            peak = (pid % 97 + i) << 20
            send("phase", event="end", id=i, name="step", depth=0, peak_allocated=peak)
            s.add_rss(pid, t, (50 + i) << 20)
        if pid < 1000 + count - 1:
            send("bye", exit_code=0)
        if pid % 50 == 0:
            writer.sync()
    writer.close()
    return path
