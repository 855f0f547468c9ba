"""Phases begun and never ended (issue 23, item 5): bounded, counted, and costing each later
event and each commit what changed, not how many are open."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import gpuwatch.store.writer as writer_module
from gpuwatch.protocol import Message
from gpuwatch.session import Session
from gpuwatch.session.openspans import MAX_OPEN, OUTER_DEPTH
from gpuwatch.store import load
from gpuwatch.store.info import format_summary, summarize_opened
from gpuwatch.store.multi import load_many
from gpuwatch.store.writer import SessionWriter

PID = 4242


class Sender:
    """Messages of one process, in order, with increasing times and sequence numbers."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.seq = 0
        self.t = 1_000

    def __call__(self, kind: str, **body) -> None:
        self.seq += 1
        self.t += 1_000
        self.session.ingest(Message(kind=kind, pid=PID, seq=self.seq, t=self.t, body=body))

    def begin(self, sid: int, name: str, depth: int, **peaks) -> None:
        self("phase", event="begin", id=sid, name=name, depth=depth, **peaks)

    def end(self, sid: int, name: str, depth: int, **peaks) -> None:
        self("phase", event="end", id=sid, name=name, depth=depth, **peaks)


def test_open_phases_are_capped_and_the_abandoned_counted() -> None:
    s = Session()
    send = Sender(s)
    send("hello", argv=["train.py"])
    send.begin(0, "train", 0)
    leaked = 20_000
    for i in range(1, leaked + 1):  # begun inside each other, never ended
        send.begin(i, "leak", i)
    proc = s.processes[PID]
    assert len(proc.open) == MAX_OPEN
    assert proc.abandoned == leaked + 1 - MAX_OPEN
    # Later phases, nested under the leak, begin and end normally: every one is recorded.
    sid = leaked + 1
    for step in range(500):
        send.begin(sid, "step", leaked + 1, peak_allocated=step)
        send.begin(sid + 1, "forward", leaked + 2, peak_allocated=step)
        send.end(sid + 1, "forward", leaked + 2, peak_allocated=step + 1)
        send.end(sid, "step", leaked + 1, peak_allocated=step)
        sid += 2
    assert len(proc.phases) == 1000
    # The first step and forward each took a leaked span's place; the rest fit in those.
    assert len(proc.open) == MAX_OPEN - 2
    assert proc.abandoned == leaked + 1 - MAX_OPEN + 2
    # The run's outer phases stay open: the deeper, older ones went first.
    assert all(o.depth < OUTER_DEPTH for o in list(proc.open.values())[:OUTER_DEPTH])
    assert 0 in proc.open and 1 in proc.open


def test_a_flat_leak_abandons_the_oldest() -> None:
    s = Session()
    send = Sender(s)
    for i in range(MAX_OPEN + 10):
        send.begin(i, "leak", 0)
    proc = s.processes[PID]
    assert proc.abandoned == 10
    assert min(proc.open) == 10 and max(proc.open) == MAX_OPEN + 9


def _trace_lines(fn: Callable[[], None]) -> int:
    """Python lines run by ``fn`` (a count: the machine's speed does not enter)."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


def _boundary_cost(open_spans: int) -> int:
    s = Session()
    send = Sender(s)
    for i in range(open_spans):
        send.begin(i, "outer", min(i, 3))
    sid = open_spans

    def boundaries() -> None:
        nonlocal sid
        for k in range(50):
            send.begin(sid, "inner", 4, peak_allocated=k, peak_reserved=k)
            send.end(sid, "inner", 4, peak_allocated=k + 1, peak_reserved=k + 1)
            sid += 1

    return _trace_lines(boundaries)


def test_a_boundary_with_peaks_costs_the_same_however_many_spans_are_open() -> None:
    few, many = _boundary_cost(4), _boundary_cost(1000)
    # Before: a loop over every open span at each boundary (1000 spans: ~60x the lines).
    assert many <= few * 1.2, (few, many)


def test_peaks_of_open_spans_match_a_brute_force_reference() -> None:
    rng = random.Random(7)
    s = Session()
    send = Sender(s)
    open_ids: list[int] = []
    expected: dict[int, int | None] = {}  # span id -> its peak so far (the reference)
    ended_expected: list[int | None] = []
    for sid in range(3000):
        pa = rng.choice([None, rng.randrange(1000)])
        peaks = {} if pa is None else {"peak_allocated": pa}
        if open_ids and rng.random() < 0.5:  # end a random open span: not only the newest
            victim = open_ids.pop(rng.randrange(len(open_ids)))
            for i in (*open_ids, victim):
                if pa is not None:
                    expected[i] = pa if expected[i] is None else max(expected[i], pa)
            send.end(victim, "x", 0, **peaks)
            ended_expected.append(expected.pop(victim))
        else:
            for i in open_ids:
                if pa is not None:
                    expected[i] = pa if expected[i] is None else max(expected[i], pa)
            send.begin(sid, "x", 0, **peaks)
            open_ids.append(sid)
            expected[sid] = None
    proc = s.processes[PID]
    got = [
        None if v == writer_module.np.iinfo("i8").min else v
        for v in proc.phases.snapshot()["peak_alloc"].tolist()
    ]
    assert got == ended_expected
    for sid in open_ids:
        assert proc.book.peak_of(proc.open[sid])[0] == expected[sid]


def test_a_commit_writes_the_spans_that_changed_not_all_that_are_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = Session()
    send = Sender(s)
    send("hello", argv=["train.py"])
    for i in range(1000):
        send.begin(i, "leak", 0)
    writer = SessionWriter(tmp_path / "r.gpuwatch", s)
    writer.sync()
    dumped = 0
    real = writer_module.dumps

    def counting(obj):
        nonlocal dumped
        dumped += 1
        return real(obj)

    monkeypatch.setattr(writer_module, "dumps", counting)
    before = writer._db.total_changes
    send.begin(5000, "step", 1, peak_allocated=7)
    writer.sync()
    # One begin: one row written and a handful of bodies made (the process's, the span's).
    # Before: all 1001 spans serialised again, deleted and inserted again.
    assert writer._db.total_changes - before <= 10
    assert dumped <= 5
    before = writer._db.total_changes
    send.end(5000, "step", 1)
    writer.sync()
    assert writer._db.total_changes - before <= 10
    monkeypatch.undo()
    writer.close()
    loaded = load(tmp_path / "r.gpuwatch")
    assert len(loaded.processes[PID].open) == 1000
    assert 5000 not in loaded.processes[PID].open


def test_abandoned_spans_and_open_peaks_reach_the_file_and_info(tmp_path: Path) -> None:
    s = Session()
    send = Sender(s)
    send("hello", argv=["train.py"])
    send.begin(0, "train", 0)
    for i in range(1, MAX_OPEN + 50):
        send.begin(i, "leak", i)
    writer = SessionWriter(tmp_path / "r.gpuwatch", s)
    writer.sync()
    send.begin(99_999, "step", 2, peak_allocated=1)
    send.end(99_999, "step", 2, peak_allocated=123)
    writer.close()
    path = tmp_path / "r.gpuwatch"
    loaded = load(path)
    proc = loaded.processes[PID]
    assert proc.abandoned == 51  # 50 leaked ones, and one more for the step's place
    assert len(proc.open) == MAX_OPEN - 1
    assert proc.open[0].peak_alloc == 123  # the last commit wrote the peaks so far
    opened = load_many([path])
    try:
        info = summarize_opened(opened)
        text = format_summary(info)
    finally:
        opened.close()
    assert info["abandoned_phases"] == 51
    assert info["processes"][0]["abandoned_phases"] == 51
    assert "abandoned 51 phases" in text
