"""The drill-down's timelines kept across refreshes: each asks only the new steps, and
what it holds equals a whole window asked at once. A scripted Prometheus on a real socket."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from promstub import GiB, PromStub, Stub, gpu_series, merge, rank_series

from gpuwatch.cluster import PromClient
from gpuwatch.cluster.history import OVERLAP, ROLES, Timelines

NS = 1_000_000_000
END = 1_700_000_000.0


@pytest.fixture
def served() -> Iterator[tuple[Stub, PromStub]]:
    s = Stub(
        families=merge(
            gpu_series("node-a", 2, used_gib=40),
            rank_series("node-a", 0, 0, 101, {"forward": 2 * GiB}),
        ),
        ramp=True,
    )
    server = PromStub(s)
    yield s, server
    server.close()


def ranges(s: Stub) -> list[tuple[float, float]]:
    return [
        (float(r.params["start"]), float(r.params["end"]))
        for r in s.requests
        if r.path == "/api/v1/query_range"
    ]


def same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for gpu in a:
        assert a[gpu].keys() == b[gpu].keys()
        for role, (t, v) in a[gpu].items():
            assert np.array_equal(t, b[gpu][role][0]) and np.array_equal(v, b[gpu][role][1])


def test_a_refresh_asks_only_the_new_steps_and_holds_the_whole_window(served) -> None:
    s, server = served
    client = PromClient(server.url)
    kept = Timelines("node-a", [])
    first = kept.update(client, seconds=60, step=1, end=END)
    assert first.error is None and first.lines["0"]["nvml"][0].size == 61
    assert ranges(s) == [(END - 60, END)]
    asked = len(s.requests)
    later = kept.update(client, seconds=60, step=1, end=END + 7.4)
    # Seven new steps and the OVERLAP ones before them, every line in one query; not the
    # window.
    new = ranges(s)[len(ranges(s)) - (len(s.requests) - asked) :]
    assert new == [(END - OVERLAP, END + 7)], new
    query = s.requests[-1].params["query"]
    assert all(f'"gpuwatch_role", "{role}", "", "")' in query for role in ROLES), query
    # What it holds is what a view opened now would ask for at once.
    whole = Timelines("node-a", []).update(client, seconds=60, step=1, end=END + 7.4)
    assert (later.start, later.end) == (whole.start, whole.end) == ((END - 53) * NS, (END + 7) * NS)
    same(later.lines, whole.lines)
    assert later.lines["0"]["nvml"][1][-1] == 40 * GiB + (END + 7) % 1000  # the newest value
    assert [[(r.name, r.t0, r.t1) for r in lane.runs] for lane in later.lanes["0"]] == [
        [(r.name, r.t0, r.t1) for r in lane.runs] for lane in whole.lanes["0"]
    ]


def test_a_failed_refresh_keeps_the_timelines_and_asks_the_gap_next(served) -> None:
    s, server = served
    client = PromClient(server.url)
    kept = Timelines("node-a", [])
    kept.update(client, seconds=60, step=1, end=END)
    s.raw = lambda path, params: (503, b"down for a moment")
    failed = kept.update(client, seconds=60, step=1, end=END + 3)
    assert failed.error is not None and "HTTP 503" in failed.error
    assert failed.error.count("HTTP 503") == 1  # one line for the one query that failed
    assert failed.lines["0"]["nvml"][0][-1] == END * NS  # the old points, kept
    s.raw = None
    asked = len(s.requests)
    back = kept.update(client, seconds=60, step=1, end=END + 5)
    new = ranges(s)[len(ranges(s)) - (len(s.requests) - asked) :]
    assert all(r == (END - OVERLAP, END + 5) for r in new), new  # from the last answer
    whole = Timelines("node-a", []).update(client, seconds=60, step=1, end=END + 5)
    same(back.lines, whole.lines)


def test_a_new_window_asks_it_whole(served) -> None:
    s, server = served
    client = PromClient(server.url)
    kept = Timelines("node-a", [])
    kept.update(client, seconds=60, step=1, end=END)
    longer = kept.update(client, seconds=300, step=1, end=END + 1)
    assert ranges(s)[-1] == (END + 1 - 300, END + 1)
    assert longer.lines["0"]["nvml"][0].size == 301
