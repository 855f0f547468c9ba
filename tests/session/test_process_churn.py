"""Thousands of short-lived instrumented processes (issue 23, item 6): one that ended keeps
a summary only, and a commit costs what changed, not how many processes were ever seen."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import gpuwatch.store.writer as writer_module
from gpuwatch.protocol import Message
from gpuwatch.session import Session
from gpuwatch.session.settled_table import SettledTable
from gpuwatch.sources.host import HostSampler
from gpuwatch.store.writer import SessionWriter

PROCESSES = 400
PHASES = 30


def _short_script(s: Session, pid: int, t: int) -> int:
    seq = 0

    def send(kind: str, **body) -> None:
        nonlocal seq, t
        seq += 1
        t += 1_000
        s.ingest(Message(kind=kind, pid=pid, seq=seq, t=t, body=body))

    send("hello", argv=["python", "sweep.py", str(pid)])
    for i in range(PHASES):
        send("phase", event="begin", id=i, name="step", depth=0, allocated=1, reserved=2)
        send("phase", event="end", id=i, name="step", depth=0, allocated=1, reserved=2)
    s.add_rss(pid, t, 1 << 20)
    send("bye", exit_code=0)
    return t


def _held(s: Session) -> int:
    """Rows and room for rows the session's process tables hold in memory (a settled
    process's stand-ins hold none: looking at them must not read them back)."""
    tables = [
        getattr(p, k) for p in s.processes.values() for k in ("torch", "peaks", "rss", "phases")
    ]
    return sum(0 if isinstance(t, SettledTable) else t._cap for t in tables)


def test_ended_processes_keep_a_summary_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = Session()
    s.bound()
    path = tmp_path / "sweep.gpuwatch"
    writer = SessionWriter(path, s)
    t = 1_000_000
    for pid in range(1000, 1000 + PROCESSES):
        t = _short_script(s, pid, t)
        if pid % 50 == 0:
            writer.sync()
    writer.sync()
    # Before: every process kept room for a thousand rows of each table (~140 KB each).
    assert _held(s) == 0
    # Neither does the writer keep their series (before: an archive and an index each).
    assert not [key for key in writer._series if key[0] != "host" and key[0] != "gpu"]
    # What they did is still known: from their tallies, and their rows from the file.
    proc = s.processes[1000 + PROCESSES // 2]
    assert sum(proc.tally.count.values()) == PHASES
    assert len(proc.phases) == PHASES
    assert proc.phases.rows(0, PHASES)["t1"].tolist() == sorted(
        proc.phases.rows(0, PHASES)["t1"].tolist()
    )
    assert s.span_at(proc, int(proc.phases.rows(3, 4)["t0"][0])) is not None
    assert not isinstance(proc.phases, SettledTable)  # reading its rows read it back...
    writer.sync()
    assert isinstance(proc.phases, SettledTable)  # ...until the next commit
    assert len(proc.phases) == PHASES and proc.phases.span() is not None

    # A commit looks at none of them again: no body made (the sampling rates are one),
    # no row written for them.
    made = 0
    real = writer_module.dumps

    def counting(obj):
        nonlocal made
        made += 1
        return real(obj)

    monkeypatch.setattr(writer_module, "dumps", counting)
    before = writer._db.total_changes
    writer.sync()
    assert made <= 2 and writer._db.total_changes == before  # before: 400 bodies made
    monkeypatch.undo()

    # A late message wakes one: it is written again, and its rows still read whole.
    s.ingest(Message(kind="mark", pid=1000, seq=999, t=t + 1, body={"text": "late"}))
    writer.sync()
    writer.close()
    from gpuwatch.store import load

    replay = load(path)
    assert len(replay.processes) == PROCESSES
    assert all(len(p.phases) == PHASES for p in replay.processes.values())
    assert replay.processes[1000].last_seq == 999


def test_a_process_gone_without_a_bye_is_settled_too(tmp_path: Path) -> None:
    s = Session()
    s.bound()
    writer = SessionWriter(tmp_path / "killed.gpuwatch", s)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a real pid that no longer exists: killed, or its bye lost
    messages = [("hello", {"argv": ["x"]})] + [
        ("phase", {"event": e, "id": 1, "name": "step", "depth": 0}) for e in ("begin", "end")
    ]
    for seq, (kind, body) in enumerate(messages, 1):
        s.ingest(Message(kind=kind, pid=child.pid, seq=seq, t=1_000 * seq, body=body))
    writer.sync()
    proc = s.processes[child.pid]
    assert proc.ended is None and proc.phases._cap > 0  # no bye: it might still run
    HostSampler(s).sample_once()  # the real sampler, asking the real kernel
    assert proc.gone is not None
    writer.sync()
    assert _held(s) == 0
    writer.close()
    from gpuwatch.store import load

    assert load(tmp_path / "killed.gpuwatch").processes[child.pid].gone == proc.gone


def test_an_instrumented_process_is_described_for_the_processes_tab() -> None:
    """NVML lists only processes on a GPU: the command gpuwatch started, on the CPU or not
    yet on its device, is described by the host sampler (its user, name, command line)."""
    import getpass
    import os

    s = Session()
    s.ingest(Message(kind="hello", pid=os.getpid(), seq=1, t=1_000, body={"argv": ["x"]}))
    HostSampler(s).sample_once()
    info = s.proc_info[os.getpid()]
    assert info["user"] == getpass.getuser() and info["visible"] is True


def _churn_bytes(s: Session, writer: SessionWriter | None, count: int) -> float:
    """Bytes the session (and its writer) hold per process after ``count`` more short
    scripts ended, measured by tracemalloc."""
    import gc
    import tracemalloc

    t = 1_000_000
    tracemalloc.start()  # before the first ones: what later ones free counts too
    try:
        # The first processes, what any session makes once, and as many ended processes
        # as an unrecorded session keeps whole (KEEP_ENDED): what is measured is what
        # each further one adds.
        for pid in range(100, 200):
            t = _short_script(s, pid, t)
        if writer is not None:
            writer.sync()
        gc.collect()
        before = tracemalloc.take_snapshot()
        for pid in range(1000, 1000 + count):
            t = _short_script(s, pid, t)
            if writer is not None and pid % 50 == 0:
                writer.sync()
        if writer is not None:
            writer.sync()
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    return sum(d.size_diff for d in after.compare_to(before, "filename")) / count


ENDED_BYTES = 3072
"""What an ended process may keep (issue 23: 5,000 of them within 20 MB, with what
memory's own upkeep adds: a settled one kept 3.6 KB here, the RSS grew 9.3 KB a process)."""


def test_an_ended_recorded_process_keeps_a_few_kilobytes(tmp_path: Path) -> None:
    s = Session()
    s.bound()
    writer = SessionWriter(tmp_path / "sweep.gpuwatch", s)
    try:
        per = _churn_bytes(s, writer, 300)
    finally:
        writer.close()
    # Before: 24.7 KB each (tables, archives and indexes of four series, writer state);
    # then 3.6 KB (room for spans and figures it would never have, a hello each); 2.5 KB.
    assert per <= ENDED_BYTES, f"{per:.0f} bytes per ended process"


def test_an_unrecorded_session_keeps_summaries_of_older_ended_processes() -> None:
    from gpuwatch.session.retention import KEEP_ENDED

    s = Session()
    s.bound()  # live, not recording
    per = _churn_bytes(s, None, 600)
    # Before: every ended process kept its rows (up to 16k a table).
    assert per <= ENDED_BYTES, f"{per:.0f} bytes per ended process"
    newest, oldest = s.processes[1000 + 599], s.processes[1000]
    assert len(newest.phases) == PHASES  # the newest ended keep their rows
    assert isinstance(oldest.phases, SettledTable) and sum(oldest.tally.count.values()) == PHASES
    assert len(oldest.phases.snapshot()["t0"]) == 0  # nothing to read back: said so
    assert any(f"newest {KEEP_ENDED}" in n for n in s.notes)


def _swept(path: Path, count: int) -> Path:
    s = Session()
    s.bound()
    writer = SessionWriter(path, s)
    t = 1_000_000
    for pid in range(1000, 1000 + count):
        t = _short_script(s, pid, t)
        if pid % 50 == 0:
            writer.sync()
    writer.close()
    return path


def test_info_of_a_sweep_costs_little_per_process(tmp_path: Path) -> None:
    """``gpuwatch info`` of a recording of many short processes: its peak memory grows
    by what each process's summary and chunk index need, not by a table each."""
    import gc
    import tracemalloc

    from gpuwatch.store.info import summarize_opened
    from gpuwatch.store.multi import load_many

    def peak(path: Path) -> tuple[int, dict]:
        gc.collect()
        tracemalloc.start()
        try:
            opened = load_many([str(path)])
            try:
                info = summarize_opened(opened)
            finally:
                opened.close()
            return tracemalloc.get_traced_memory()[1], info
        finally:
            tracemalloc.stop()

    small, large = _swept(tmp_path / "a.gpuwatch", 50), _swept(tmp_path / "b.gpuwatch", 250)
    peak(small)  # what any info makes once (imports, caches)
    a, _ = peak(small)
    b, info = peak(large)
    assert len(info["processes"]) == 250
    assert all(p["phases"] == {"step": PHASES} for p in info["processes"])
    per = (b - a) / 200
    # 50 KB a process once (tables reserving rows, a layout and an index each), then 29 KB
    # while the loader indexed every series; about 13 KB with a settled process's index
    # kept packed until read (docs/recording.md).
    assert per <= 20_000, f"{per:.0f} bytes per process"


def _sweep_script(s: Session, pid: int, t: int, argv: list[str]) -> int:
    """A short script of a sweep: a hello as the client sends it, phases, a bye."""
    hello = {"argv": list(argv), "hostname": "node1", "wall_ns": t, "rank": None}
    s.ingest(Message(kind="hello", pid=pid, seq=0, t=t, body=hello))
    for i in range(3):
        for seq, event in ((2 * i + 1, "begin"), (2 * i + 2, "end")):
            body = {"event": event, "id": i, "name": "step", "depth": 0}
            s.ingest(Message(kind="phase", pid=pid, seq=seq, t=t + seq, body=body))
    s.ingest(Message(kind="bye", pid=pid, seq=7, t=t + 8, body={"exit_code": 0}))
    return t + 10


def test_a_settled_process_keeps_no_room_of_its_own(tmp_path: Path) -> None:
    """What a settled process holds is what it did: the room its messages could fill
    (open spans and their book, devices, figures) is shared and empty, and what the
    hellos of a sweep share (argv, host, keys) is kept once."""
    from gpuwatch.session.process import EMPTY_MAP

    s = Session()
    s.bound()
    writer = SessionWriter(tmp_path / "sweep.gpuwatch", s)
    t = 1_000
    for pid in range(2000, 2050):
        t = _sweep_script(s, pid, t, ["python", "sweep.py", "--lr", "0.1"])
    writer.sync()
    a, b = s.processes[2000], s.processes[2049]
    for proc in (a, b):
        assert proc.book is None and proc.open is EMPTY_MAP and proc.devices is EMPTY_MAP
        assert proc.tally.peaks is EMPTY_MAP and proc.tally.torch is EMPTY_MAP
        assert dict(proc.tally.count) == {0: 3}  # what it did stays
    assert a.hello == {**b.hello, "wall_ns": a.hello["wall_ns"]}
    assert a.hello["argv"] is b.hello["argv"] and a.hello["hostname"] is b.hello["hostname"]
    assert all(x is y for x, y in zip(a.hello, b.hello, strict=True))  # the keys too
    writer.close()


def test_a_late_message_finds_room_in_a_settled_process(tmp_path: Path) -> None:
    """A settled process a message reaches again takes it whole: a hello naming
    devices, spans with peaks and figures, a count of a rejected datagram."""
    from gpuwatch.session import gpu_key, norm_uuid
    from gpuwatch.store import load

    s = Session()
    s.bound()
    path = tmp_path / "late.gpuwatch"
    writer = SessionWriter(path, s)
    t = _sweep_script(s, 3000, 1_000, ["python", "a.py"])
    writer.sync()
    proc = s.processes[3000]
    assert proc.book is None  # settled and compacted
    s.count_reject("json", 3000)  # revived by a count alone: written again
    writer.sync()
    dev = {"index": 0, "uuid": "GPU-late", "name": "x", "total": 1 << 30}
    messages = [
        ("hello", {"argv": ["python", "a.py"], "devices": [dev]}),
        ("phase", {"event": "begin", "id": 9, "name": "late", "depth": 0, "dev": 0}),
        (
            "phase",
            {
                "event": "end",
                "id": 9,
                "name": "late",
                "depth": 0,
                "dev": 0,
                "allocated": 5,
                "reserved": 8,
                "peak_allocated": 7,
                "peak_reserved": 8,
            },
        ),
    ]
    for seq, (kind, body) in enumerate(messages, 20):
        s.ingest(Message(kind=kind, pid=3000, seq=seq, t=t + seq, body=body))
    assert "internal" not in s.rejects
    late = s.name_id("late")
    key = gpu_key(norm_uuid("GPU-late"))
    assert proc.devices == {0: key} and proc.torch_devs == {0}
    assert proc.tally.count[late] == 1 and proc.tally.peaks[late][1] == 7
    assert proc.tally.torch[0][:2] == (5, 8)
    writer.sync()
    assert proc.book is None  # settled again
    writer.close()
    replay = load(path).processes[3000]
    assert len(replay.phases) == 4 and replay.rejected == 1
    assert replay.devices == {0: key}


def test_the_host_sampler_looks_only_at_processes_that_may_run() -> None:
    """Each tick costs the processes still running, not every one that ever ran."""
    import os

    s = Session()
    t = 1_000
    for pid in range(4000, 4300):  # said bye
        t = _sweep_script(s, pid, t, ["python", "x.py"])
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # gone without a bye
    for pid in (os.getpid(), child.pid):
        s.ingest(Message(kind="hello", pid=pid, seq=0, t=t, body={"argv": ["y"]}))
    sampler = HostSampler(s)
    sampler.sample_once()
    assert [p.pid for p in s.running()] == [os.getpid()]
    assert list(s._running) == [os.getpid()]  # the others were let go of, once looked at
    assert list(sampler._stat._fds) == [os.getpid()]  # the ended one's file is closed
    assert sampler.gone(child.pid) and not sampler.gone(os.getpid())
    assert s.processes[child.pid].gone is not None
    assert len(s.processes[os.getpid()].rss) == 1
    s.ingest(Message(kind="bye", pid=os.getpid(), seq=1, t=t + 1, body={}))
    sampler.sample_once()
    assert s.running() == [] and len(sampler._stat) == 0  # no file kept once it ended


def test_the_ranks_of_a_live_session_come_from_its_hellos() -> None:
    """A look at the ranks (each second, live) costs the ranked processes only."""
    from gpuwatch.analysis.rank_feed import jobs

    s = Session()
    t = 1_000
    for pid in range(5000, 5200):
        t = _sweep_script(s, pid, t, ["python", "x.py"])
    for rank in (0, 1):
        body = {"argv": ["train.py"], "rank": rank, "local_rank": rank, "world_size": 2}
        s.ingest(Message(kind="hello", pid=6000 + rank, seq=0, t=t, body=body))
    assert [p.pid for p in s.ranked()] == [6000, 6001]
    assert [[p.pid for p in job] for job in jobs(s)] == [[6000, 6001]]
    # A later hello that names no rank takes it out.
    s.ingest(Message(kind="hello", pid=6001, seq=1, t=t + 1, body={"rank": None}))
    assert [p.pid for p in s.ranked()] == [6000]
    assert [[p.pid for p in job] for job in jobs(s)] == [[6000]]


def test_the_ranks_of_a_replay_are_found_by_a_look_at_each(tmp_path: Path) -> None:
    from gpuwatch.analysis.rank_feed import jobs
    from gpuwatch.store import load, save_session

    s = Session()
    for rank in (0, 1):
        body = {"argv": ["train.py"], "rank": rank, "world_size": 2}
        s.ingest(Message(kind="hello", pid=7000 + rank, seq=0, t=1_000, body=body))
    replay = load(save_session(s, tmp_path / "ranks.gpuwatch"))
    assert not replay.live
    assert [[p.pid for p in job] for job in jobs(replay)] == [[7000, 7001]]


def test_an_instrumented_process_gets_its_cpu_beside_its_rss() -> None:
    """The host sampler reads an instrumented process's CPU time once a second and keeps
    its CPU % in the rss table beside each RSS sample (unknown for the first second)."""
    import math
    import time

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        s = Session()
        s.ingest(Message(kind="hello", pid=busy.pid, seq=1, t=1_000, body={"argv": ["x"]}))
        sampler = HostSampler(s)
        sampler.sample_once()
        time.sleep(1.2)
        sampler.sample_once()
        sampler.sample_once()
        rows = s.processes[busy.pid].rss.snapshot()
        assert math.isnan(rows["cpu"][0])
        assert rows["cpu"][1] == rows["cpu"][2] > 30  # held between two reads of it
    finally:
        busy.kill()
        busy.wait()
