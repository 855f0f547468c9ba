"""A device and a phase still open at the last commit read back from the file with every
field they had, and a hostile body's odd values read as unknown, never as a traceback."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path

from gpuwatch.protocol import Message
from gpuwatch.session import Session
from gpuwatch.session.model import Device, OpenSpan
from gpuwatch.store import load
from gpuwatch.store.writer import SessionWriter

PID = 4242


def _recorded_open_span(path: Path) -> OpenSpan:
    """Record a process with one phase left open, every figure of it set, and read it back."""
    s = Session()
    t = 1_000
    for seq, (kind, body) in enumerate(
        [
            ("hello", {"argv": ["train.py"]}),
            ("phase", {"event": "begin", "id": 1, "name": "train", "depth": 0, "step": 6}),
            (
                "phase",
                {
                    "event": "begin",
                    "id": 2,
                    "name": "forward",
                    "depth": 1,
                    "step": 7,
                    "parent": 1,
                    "dev": 3,
                    "allocated": 1_000,
                    "reserved": 2_000,
                    "peak_allocated": 1_500,
                    "peak_reserved": 2_500,
                },
            ),
            ("phase", {"event": "begin", "id": 3, "name": "attn", "depth": 2, "parent": 2}),
            (
                "phase",
                {
                    "event": "end",
                    "id": 3,
                    "name": "attn",
                    "depth": 2,
                    "peak_allocated": 4_000,
                    "peak_reserved": 5_000,
                },
            ),
        ],
        start=1,
    ):
        t += 1_000
        s.ingest(Message(kind=kind, pid=PID, seq=seq, t=t, body=body))
    writer = SessionWriter(path, s)
    writer.close()
    return load(path).processes[PID].open[2]


def test_every_field_of_an_open_span_reads_back(tmp_path: Path) -> None:
    span = _recorded_open_span(tmp_path / "r.gpuwatch")
    got = dataclasses.asdict(span)
    assert {k for k, v in got.items() if v is None} == set()  # each field was recorded
    assert got == {
        "id": 2,
        "name": "forward",
        "t0": 4_000,
        "step": 7,
        "depth": 1,
        "parent": 1,
        "dev": 3,
        "alloc0": 1_000,
        "reserved0": 2_000,
        "peak_alloc": 4_000,  # inside it, the inner phase's end reported these
        "peak_reserved": 5_000,
    }


def test_odd_values_in_an_open_span_read_as_unknown(tmp_path: Path) -> None:
    path = tmp_path / "r.gpuwatch"
    _recorded_open_span(path)
    odd = {
        "step": "7",
        "parent": 1.5,
        "dev": True,
        "alloc0": 2**70,
        "reserved0": None,
        "peak_alloc": [1],
        "peak_reserved": {"x": 1},
        "depth": -4,
    }
    with sqlite3.connect(path) as db:
        for pid, sid, body in db.execute("SELECT pid, id, body FROM open_spans").fetchall():
            db.execute(
                "UPDATE open_spans SET body = ? WHERE pid = ? AND id = ?",
                (json.dumps({**json.loads(body), **odd}), pid, sid),
            )
    db.close()
    span = load(path).processes[PID].open[2]
    assert (span.id, span.name, span.t0, span.depth) == (2, "forward", 4_000, 0)
    assert all(getattr(span, k) is None for k in odd if k != "depth")


def test_every_text_field_of_a_device_reads_back(tmp_path: Path) -> None:
    s = Session()
    texts = {
        "name": "NVIDIA H100",
        "uuid": "GPU-1234",
        "bus_id": "00000000:3B:00.0",
        "state": "lost",
        "note": "fell off the bus",
        "source": "nvml",
    }
    s.add_device(Device("gpu:GPU-1234", "gpu", index=2, total=80 << 30, **texts))
    path = tmp_path / "r.gpuwatch"
    SessionWriter(path, s).close()
    dev = load(path).devices["gpu:GPU-1234"]
    assert {k: getattr(dev, k) for k in texts} == texts
    assert (dev.kind, dev.index, dev.total) == ("gpu", 2, 80 << 30)
