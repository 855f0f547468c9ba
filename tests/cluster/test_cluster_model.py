"""The cluster model: states kept across refreshes, stale marking, sorts, filter, summary."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st
from promstub import GiB, gpu_series, merge, rank_series

from gpuwatch.cluster import LOST, OK, STALE, Answers, Cluster, Series
from gpuwatch.cluster.history import HostHistory, _lanes
from gpuwatch.cluster.model import FORGET_S
from gpuwatch.cluster.text import bar, report


def answers(families: dict[str, list], at: float = 1000.0, errors: dict | None = None) -> Answers:
    series = {
        name: [Series(labels, ((at, float(v)),)) for labels, v in items]
        for name, items in families.items()
    }
    for name in errors or {}:
        series.pop(name, None)
    return Answers(at, series, dict(errors or {}))


def two_hosts() -> dict[str, list]:
    return merge(gpu_series("node-a", 2, used_gib=70), gpu_series("node-b", 2, used_gib=10))


def test_cells_per_gpu_grouped_by_host() -> None:
    c = Cluster()
    c.apply(answers(two_hosts()))
    assert sorted(c.gpus) == ["node-a:0", "node-a:1", "node-b:0", "node-b:1"]
    assert c.gpus["node-a:1"].used == 71 * GiB and c.gpus["node-a:1"].total == 80 * GiB
    assert all(g.state == OK for g in c.gpus.values())
    assert [h for h, _ in c.cells("host")] == ["node-a", "node-b"]
    assert c.fullest().key == "node-a:1"


def test_a_gone_series_is_stale_with_its_last_figures_kept() -> None:
    c = Cluster()
    c.apply(answers(two_hosts(), at=1000))
    only_a = gpu_series("node-a", 2, used_gib=70)
    c.apply(answers(only_a, at=1001))
    b0 = c.gpus["node-b:0"]
    assert b0.state == STALE and b0.used == 10 * GiB and b0.seen == 1000
    assert c.gpus["node-a:0"].state == OK and c.gpus["node-a:0"].seen == 1001
    assert "2 stale" in c.summary()
    c.apply(answers(two_hosts(), at=1002))  # back: ok again
    assert c.gpus["node-b:0"].state == OK


def test_a_gpu_gone_for_an_hour_leaves_the_view() -> None:
    c = Cluster()
    c.apply(answers(two_hosts(), at=1000))
    only_a = gpu_series("node-a", 2, used_gib=70)
    c.apply(answers(only_a, at=1000 + FORGET_S))
    assert "node-b:0" in c.gpus  # stale, kept
    c.apply(answers(only_a, at=1001 + FORGET_S))
    assert sorted(c.gpus) == ["node-a:0", "node-a:1"]


def test_a_failed_refresh_marks_everything_stale_and_says_why() -> None:
    c = Cluster()
    c.apply(answers(two_hosts()))
    err = "http://p:9090: unreachable (Connection refused)"
    down = {f: err for f in ("gpuwatch_gpu_memory_total_bytes", "gpuwatch_gpu_memory_used_bytes")}
    c.apply(answers({}, at=1005, errors=down))
    assert c.error == err
    assert all(g.state == STALE for g in c.gpus.values())
    assert c.gpus["node-a:0"].used == 70 * GiB  # the last good figure
    assert c.refreshed == 1000
    text = "\n".join(report(c, 1010))
    assert "stale 10s" in text or "stale 10.0s" in text, text


def test_a_rejected_family_is_one_line_and_the_rest_still_refreshes() -> None:
    c = Cluster()
    fam = two_hosts()
    c.apply(answers(fam))
    fam2 = merge(gpu_series("node-a", 2, used_gib=75), gpu_series("node-b", 2, used_gib=10))
    c.apply(answers(fam2, errors={"gpuwatch_process_step": "bad_data: parse error"}))
    assert c.error == "gpuwatch_process_step: bad_data: parse error"
    assert c.gpus["node-a:0"].used == 75 * GiB and c.gpus["node-a:0"].state == OK


def test_a_lost_gpu_and_a_down_target() -> None:
    fam = two_hosts()
    fam["gpuwatch_gpu_up"] = [
        (m, 0 if m["gpu"] == "1" and m["host"] == "node-a" else 1)
        for m, _ in fam["gpuwatch_gpu_up"]
    ]
    fam["gpuwatch_gpu_memory_used_bytes"] = [
        (m, v)
        for m, v in fam["gpuwatch_gpu_memory_used_bytes"]
        if not (m["gpu"] == "1" and m["host"] == "node-a")
    ]
    fam["up"] = [({"instance": "node-b:9400"}, 0), ({"instance": "node-a:9400"}, 1)]
    c = Cluster()
    c.apply(answers(fam))
    assert c.gpus["node-a:1"].state == LOST and c.gpus["node-a:1"].used is None
    assert c.gpus["node-b:0"].state == STALE  # its target does not answer
    assert c.gpus["node-a:0"].state == OK


def test_sorts_and_filter() -> None:
    fam = merge(
        gpu_series("node-a", 2, used_gib=10),
        gpu_series("node-b", 2, used_gib=70),
        rank_series("node-a", 1, 0, 11, {"forward": GiB}),
        rank_series("node-b", 0, 1, 12, {"forward": GiB}),
    )
    fam["gpuwatch_gpu_memory_total_bytes"] = [
        (m, (40 if m["host"] == "node-a" else 80) * GiB)
        for m, _ in fam["gpuwatch_gpu_memory_total_bytes"]
    ]
    c = Cluster()
    c.apply(answers(fam))
    keys = lambda sort, text="": [g.key for _, gs in c.cells(sort, text) for g in gs]  # noqa: E731
    assert keys("host") == ["node-a:0", "node-a:1", "node-b:0", "node-b:1"]
    assert keys("memory") == ["node-b:1", "node-b:0", "node-a:1", "node-a:0"]
    # headroom: node-a 40-11=29, 40-10=30; node-b 80-71=9, 80-70=10
    assert keys("headroom") == ["node-b:1", "node-b:0", "node-a:1", "node-a:0"]
    # grouped by host: a host comes where its first GPU does, its GPUs together
    assert keys("rank") == ["node-a:1", "node-a:0", "node-b:0", "node-b:1"]
    assert keys("host", "rank 1") == ["node-b:0"]
    assert keys("host", "node-a:1") == ["node-a:1"]
    assert keys("host", "FORWARD") == ["node-a:1", "node-b:0"]
    assert keys("host", "nothing-like-this") == []


def test_hostile_labels_are_printable_in_the_text_report() -> None:
    fam = gpu_series("node\x1b[2Jevil\n", 1)
    c = Cluster()
    c.apply(answers(fam))
    text = "\n".join(report(c, time.time()))
    assert "\x1b" not in text
    assert "node\\x1b[2Jevil\\n" in text  # shown as typed, on its one line


def test_bar_eighths() -> None:
    assert bar(0, 4) == "░░░░" and bar(1, 4) == "████" and bar(0.5, 4) == "██░░"
    assert bar(1 / 8 / 4, 4).startswith("▏")


def test_history_window_and_phase_runs() -> None:
    ns = 1_000_000_000
    h = HostHistory("n", 0, 10 * ns, ns)
    import numpy as np

    t = np.arange(0, 10 * ns, ns, dtype=np.int64)
    v = np.arange(10, dtype=np.float64)
    h.lines["0"] = {"nvml": (t, v)}
    lo, hi = h.window("0", "nvml", 0, 10 * ns, 5)
    assert lo.tolist() == [0, 2, 4, 6, 8] and hi.tolist() == [1, 3, 5, 7, 9]
    lo, hi = h.window("0", "nvml", 0, 10 * ns, 20)  # each scrape holds for its step
    assert lo.tolist()[:4] == [0, 0, 1, 1]
    assert np.isnan(h.window("1", "nvml", 0, 10 * ns, 3)[0]).all()
    phase = [
        Series(
            {"gpu": "0", "pid": "5", "rank": "0", "phase": "forward"},
            ((1.0, 1), (2.0, 1), (5.0, 1)),
        ),
        Series({"gpu": "0", "pid": "5", "rank": "0", "phase": "backward"}, ((3.0, 1),)),
    ]
    lanes = _lanes(phase, ns)
    (lane,) = lanes["0"]
    assert lane.label == "rank 0"
    assert [(r.name, r.t0 // ns, r.t1 // ns) for r in lane.runs] == [
        ("forward", 1, 3),
        ("forward", 5, 6),
        ("backward", 3, 4),
    ]


def test_a_job_label_match_shows_the_gpus_of_the_jobs_hosts() -> None:
    from gpuwatch.cluster.model import JOB_LABELS, family_matchers
    from gpuwatch.prometheus import JOB

    assert JOB_LABELS == JOB  # the exporter's job labels, on process series only
    match = [("slurm_job", "=", "12345"), ("job", "=", "gpuwatch")]
    # GPU series carry no job label: the matcher would select none of them.
    assert family_matchers("gpuwatch_gpu_memory_used_bytes", match) == [match[1]]
    assert family_matchers("gpuwatch_process_step", match) == match
    assert family_matchers("gpuwatch_rank_info", match) == match
    # The job's one rank runs on node-b: node-a's GPUs leave the view.
    job = {"slurm_job": "12345"}
    rank = rank_series("node-b", 1, 0, 4242, {"forward": 3 * GiB})
    rank = {k: [({**labels, **job}, v) for labels, v in items] for k, items in rank.items()}
    got = answers(merge(two_hosts(), rank))
    got.by_job = True
    c = Cluster()
    c.apply(got)
    assert sorted(c.gpus) == ["node-b:0", "node-b:1"]
    assert all(g.state == OK for g in c.gpus.values())


def _layout(c: Cluster) -> list[tuple[object, ...]]:
    return [
        (g.key, g.used, g.total, g.up, g.util, g.ranks, g.phase, g.peak, g.state)
        for g in c.gpus.values()
    ] + [(job, r.rows) for job, r in c.jobs.items()]


def test_a_refresh_without_the_slow_families_keeps_what_they_said() -> None:
    from gpuwatch.cluster import SLOW

    info = {"pid": "101", "rank": "0", "host": "node-a", "world_size": "2", "strategy": "fsdp2"}
    every = merge(
        two_hosts(),
        rank_series("node-a", 0, 0, 101, {"forward": 2 * GiB}),
        {"gpuwatch_rank_info": [(info, 1)]},
    )
    fast = {k: v for k, v in every.items() if k not in SLOW}
    both, part = Cluster(), Cluster()
    assert both.wants_slow()  # no GPU yet
    both.apply(answers(every, at=1000))
    part.apply(answers(every, at=1000))
    assert not part.wants_slow()
    both.apply(answers(every, at=1001))
    part.apply(answers(fast, at=1001))  # totals and layouts not asked: kept
    assert _layout(part) == _layout(both)
    assert part.gpus["node-a:0"].total == 80 * GiB
    (row,) = part.jobs[next(iter(part.jobs))].rows
    assert (row.strategy, row.world_size) == ("fsdp2", 2)
    assert not part.wants_slow()
    # A new GPU: its total is asked at once; a new rank: its layout.
    new_gpu = {k: v for k, v in gpu_series("node-c", 1).items() if k not in SLOW}
    part.apply(answers(merge(fast, new_gpu), at=1002))
    assert part.gpus["node-c:0"].total is None and part.wants_slow()
    part.apply(answers(merge(every, gpu_series("node-c", 1)), at=1003))
    assert part.gpus["node-c:0"].total == 80 * GiB and not part.wants_slow()
    part.apply(answers(merge(fast, rank_series("node-b", 1, 1, 202, {})), at=1004))
    assert part.wants_slow()


def test_a_rank_back_after_a_missed_scrape_keeps_its_layout() -> None:
    """A scrape of node-a that timed out drops its rank from one refresh; back in a
    refresh without the slow families, it shows the layout it had (not a blank until the
    next slow refresh), and nothing is asked again for it."""
    from gpuwatch.cluster import SLOW

    def info(host: str, rank: int, pid: int) -> dict:
        return {"pid": str(pid), "rank": str(rank), "host": host, "world_size": "2",
                "strategy": "fsdp2"}  # fmt: skip

    every = merge(
        two_hosts(),
        rank_series("node-a", 0, 0, 101, {"forward": 2 * GiB}),
        rank_series("node-b", 0, 1, 202, {"forward": 2 * GiB}),
        {"gpuwatch_rank_info": [(info("node-a", 0, 101), 1), (info("node-b", 1, 202), 1)]},
    )
    fast = {k: v for k, v in every.items() if k not in SLOW}
    without_a = merge(two_hosts(), rank_series("node-b", 0, 1, 202, {"forward": 2 * GiB}))
    without_a = {k: v for k, v in without_a.items() if k not in SLOW}

    def layouts(c: Cluster) -> list[tuple]:
        return [(r.rank, r.strategy, r.world_size) for j in c.jobs.values() for r in j.rows]

    c = Cluster()
    c.apply(answers(every, at=1000))
    c.apply(answers(without_a, at=1001))
    assert layouts(c) == [(1, "fsdp2", 2)]
    c.apply(answers(fast, at=1002))
    assert layouts(c) == [(0, "fsdp2", 2), (1, "fsdp2", 2)]
    assert not c.wants_slow()
    # Gone longer than the view keeps anything: a new process for all it knows.
    c.apply(answers(without_a, at=1003))
    c.apply(answers(fast, at=1004 + FORGET_S))
    assert layouts(c) == [(0, None, None), (1, "fsdp2", 2)] and c.wants_slow()


def test_a_failed_refresh_without_the_slow_families_says_why_as_one() -> None:
    from gpuwatch.cluster import SLOW
    from gpuwatch.cluster.model import FAMILIES

    c = Cluster()
    c.apply(answers(two_hosts(), at=1000))
    why = "http://p: connection refused"
    c.apply(answers({}, at=1001, errors={f: why for f in FAMILIES if f not in SLOW}))
    assert c.error == why and c.refreshed == 1000  # as a refresh that read nothing
    assert all(g.state == STALE for g in c.gpus.values())


def test_a_refresh_of_one_host_s_figures_changes_nothing_else() -> None:
    c = Cluster()
    c.apply(answers(merge(two_hosts(), rank_series("node-a", 0, 0, 101, {"fwd": GiB})), at=1000))
    jobs, before = dict(c.jobs), {k: (g.state, g.seen) for k, g in c.gpus.items()}
    hot = merge(gpu_series("node-a", 1, used_gib=75), gpu_series("node-b", 2, used_gib=50))
    part = answers(hot, at=1001)
    part.host = "node-a"  # Prometheus answered more than the host: only its cells move
    c.apply(part)
    assert c.gpus["node-a:0"].used == 75 * GiB and c.gpus["node-a:1"].used == 71 * GiB
    assert c.gpus["node-b:0"].used == 10 * GiB
    assert {k: (g.state, g.seen) for k, g in c.gpus.items()} == before  # states as they were
    assert c.jobs == jobs and c.refreshed == 1000 and c.error is None
    failed = answers({}, at=1002, errors={"gpuwatch_gpu_memory_used_bytes": "refused"})
    failed.host = "node-a"
    c.apply(failed)  # the panels say why; the grid's cells stay as they were
    assert c.error is None and all(g.state == OK for g in c.gpus.values())


def test_up_asked_as_not_one_a_gpu_it_does_not_name_is_up() -> None:
    # gpuwatch_gpu_up is asked as ``!= 1`` (NOT_ONE): the answer names the lost GPUs only.
    def refresh(lost: bool, at: float) -> Answers:
        fams = two_hosts()
        up = [(labels, 0) for labels, _ in fams["gpuwatch_gpu_up"][:1]] if lost else []
        fams["gpuwatch_gpu_up"] = up
        if lost:  # a lost GPU has no used figure
            fams["gpuwatch_gpu_memory_used_bytes"] = fams["gpuwatch_gpu_memory_used_bytes"][1:]
        return answers(fams, at=at)

    c = Cluster()
    c.apply(refresh(False, 1000))
    assert all(g.state == OK for g in c.gpus.values())
    c.apply(refresh(True, 1001))
    assert c.gpus["node-a:0"].state == LOST and c.gpus["node-a:0"].used is None
    assert [g.state for k, g in c.gpus.items() if k != "node-a:0"] == [OK] * 3
    c.apply(refresh(False, 1002))  # found again: no up series says it
    assert c.gpus["node-a:0"].state == OK


def _window_by_sample(h: HostHistory, t, v, t0: int, t1: int, n: int):
    """The drill-down's columns worked out one sample at a time (the plain definition)."""
    import numpy as np

    lo, hi = np.full(n, np.nan), np.full(n, np.nan)
    width = (t1 - t0) / n
    for ts, value in zip(t.tolist(), v.tolist(), strict=True):
        a, b = int((ts - t0) // width), int((ts + h.step - 1 - t0) // width)
        if b < 0 or a >= n or value != value:
            continue
        for c in range(max(a, 0), min(b, n - 1) + 1):
            lo[c] = value if lo[c] != lo[c] else min(lo[c], value)
            hi[c] = value if hi[c] != hi[c] else max(hi[c], value)
    return lo, hi


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0, 1e12) | st.just(float("nan")), min_size=0, max_size=60),
    st.integers(1, 400),
    st.integers(1, 5),
    st.integers(-3, 3),
)
def test_history_window_is_the_plain_definition(values, n, step_s, shift) -> None:
    import numpy as np

    ns = 1_000_000_000
    h = HostHistory("n", 0, 60 * ns, step_s * ns)
    t = np.arange(len(values), dtype=np.int64) * step_s * ns
    v = np.array(values, dtype=np.float64)
    h.lines["0"] = {"nvml": (t, v)}
    t0, t1 = shift * 7 * ns, (shift * 7 + 61) * ns
    got = h.window("0", "nvml", t0, t1, n)
    want = _window_by_sample(h, t, v, t0, t1, n)
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a, b, equal_nan=True)
