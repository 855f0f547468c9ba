"""The Processes tab's rows through a RowCache: a refresh reuses what did not change and
builds again what did, the same rows as without the cache, and keeps no process that left."""

from __future__ import annotations

import time
from dataclasses import asdict

from gpuwatch.analysis import processes as pr
from gpuwatch.protocol import Message
from gpuwatch.session import Device, Session, gpu_key

GIB = 1 << 30


def _session() -> tuple[Session, str]:
    s = Session()
    key = gpu_key("GPU-rows-0")
    s.add_device(Device(key, "gpu", index=0, name="GPU 0", uuid="GPU-rows-0", total=80 * GIB))
    wall = time.time()
    for pid, user in ((100, "alice"), (200, "bob")):
        s.set_proc_info(
            pid,
            {"name": "python", "user": user, "cmdline": ["python", f"{user}.py"],
             "visible": True, "uid": 1000, "ppid": 1, "started": wall - 60.0},
        )  # fmt: skip
    s.ingest(Message(kind="hello", pid=100, seq=0, t=time.monotonic_ns(), body={"rank": 3}))
    s.ingest(
        Message(
            kind="phase",
            pid=100,
            seq=1,
            t=time.monotonic_ns(),
            body={"event": "begin", "name": "forward", "id": 1, "depth": 0},
        )
    )
    return s, key


def _snapshot(s: Session, key: str, cpu: float, pids: tuple[int, ...] = (100, 200)) -> None:
    s.add_gpu_processes(
        key,
        time.monotonic_ns(),
        [(pid, pid * GIB // 100, 0, 50.0, 10.0, cpu, GIB) for pid in pids],
    )


def _plain(rows: list[pr.ProcRow]) -> list[dict]:
    return [{k: v for k, v in asdict(r).items() if k != "elapsed"} for r in rows]


def test_a_refresh_reuses_the_rows_that_did_not_change() -> None:
    s, key = _session()
    cache = pr.RowCache()
    _snapshot(s, key, cpu=5.0)
    first = pr.rows(s, None, cache)
    assert [(r.pid, r.cpu, r.rank, r.phase) for r in first] == [
        (100, 5.0, 3, "forward"),
        (200, 5.0, None, None),
    ]
    again = pr.rows(s, None, cache)
    assert all(a is b for a, b in zip(first, again, strict=True))  # nothing built again
    assert again[0].elapsed is not None and again[0].elapsed >= first[0].elapsed

    # A new list with one figure changed: that row is built again, with the new figure.
    s.add_gpu_processes(
        key,
        time.monotonic_ns(),
        [(100, GIB, 0, 50.0, 10.0, 5.0, GIB), (200, 2 * GIB, 0, 50.0, 10.0, 9.0, GIB)],
    )
    third = pr.rows(s, None, cache)
    assert third[0] is first[0]
    assert third[1] is not first[1] and third[1].cpu == 9.0
    assert _plain(third) == _plain(pr.rows(s, None))  # as without a cache

    # A new description (a new dict) is a new row; so is a new phase seen on the old one.
    s.set_proc_info(100, {**s.proc_info[100], "user": "carol"})
    fourth = pr.rows(s, None, cache)
    assert fourth[0] is not third[0] and fourth[0].user == "carol"
    s.ingest(
        Message(
            kind="phase",
            pid=100,
            seq=2,
            t=time.monotonic_ns(),
            body={"event": "begin", "name": "attention", "id": 2, "depth": 1},
        )
    )
    assert pr.rows(s, None, cache)[0].phase == "attention"


def test_a_process_that_left_the_list_leaves_the_cache() -> None:
    s, key = _session()
    cache = pr.RowCache()
    _snapshot(s, key, cpu=1.0)
    pr.rows(s, None, cache)
    assert set(cache.rows) == {(key, 100), (key, 200)}
    _snapshot(s, key, cpu=1.0, pids=(200,))
    rows = pr.rows(s, None, cache)
    # pid 100 is instrumented: still listed, as a process on the host, from its own row.
    assert [(r.pid, r.device_key) for r in rows] == [(200, key), (100, "host")]
    assert set(cache.rows) == {(key, 200), ("host", 100)}


def test_a_cursor_in_the_past_reads_that_list() -> None:
    s, key = _session()
    cache = pr.RowCache()
    _snapshot(s, key, cpu=1.0)
    then = time.monotonic_ns()
    _snapshot(s, key, cpu=2.0)
    assert [r.cpu for r in pr.rows(s, None, cache)] == [2.0, 2.0]
    assert [r.cpu for r in pr.rows(s, then, cache)] == [1.0, 1.0]
    assert [r.cpu for r in pr.rows(s, None, cache)] == [2.0, 2.0]


def test_a_hostile_childrens_list_names_only_pids() -> None:
    """A recording's description is hostile: its ``children`` name pids or nothing."""
    s, key = _session()
    _snapshot(s, key, cpu=1.0, pids=(200,))
    s.set_proc_info(300, {"name": "worker", "ppid": 200, "visible": True})
    hostile: list = ["300", -5, 2.5, None, [300], *range(10_000, 10_100), 300]
    s.set_proc_info(200, {**s.proc_info[200], "children": hostile})
    tree = pr.tree(s, pr.rows(s))
    assert [(r.pid, r.depth, r.listed) for r in tree if r.pid in (200, 300)] == [
        (200, 0, True)
    ]  # 300 is past the first 64 entries: not shown
    s.set_proc_info(200, {**s.proc_info[200], "children": [300, "x", 10_001]})
    tree = pr.tree(s, pr.rows(s))
    assert [(r.pid, r.depth, r.listed) for r in tree if r.pid in (200, 300)] == [
        (200, 0, True),
        (300, 1, False),
    ]  # 10_001 is described nowhere: no row
