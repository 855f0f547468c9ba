"""Ranks side by side from a session: the feeder, the marks it makes, and ``gpuwatch info``."""

from __future__ import annotations

import json

import rank_session as rs
from conftest import run_cli
from store_data import GIB, MS, T0, Script

from gpuwatch.analysis.rank_feed import MARK_PREFIX, RankFeed, RankMarks, jobs
from gpuwatch.analysis.rank_table import format_ranks
from gpuwatch.fmt import fmt_short
from gpuwatch.session import Session
from gpuwatch.store import load, save_session


def test_rows_carry_peaks_predictions_used_memory_and_the_faults() -> None:
    s = rs.build()
    [ranks] = RankFeed().tables(s)
    assert [(r.rank, r.host, r.gpu, r.pid, r.step) for r in ranks.rows] == [
        (k, "node1", str(k), rs.PIDS[k], rs.STEPS - 1) for k in range(4)
    ]
    assert [r.used for r in ranks.rows] == [(10 + k) * GIB for k in range(4)]
    assert ranks.rows[0].phases["eval"].peak == 5 * GIB
    assert ranks.rows[1].phases["eval"].peak == 4 * GIB
    assert all(r.phases["eval"].predicted for r in ranks.rows)
    eval_ = ranks.spread("eval")
    assert (eval_.max_rank, eval_.min_rank, eval_.spread_bytes) == (0, 1, GIB)
    assert ranks.spread("forward").spread_bytes == 0
    kinds = {(f.kind, f.rank, f.phase, f.category, f.bytes) for f in ranks.flags}
    assert kinds == {
        ("above_median", 0, "eval", "unexplained", GIB),
        ("stray_context", 2, None, "0", rs.STRAY),
    }
    assert ranks.rows[2].strays == {"0": rs.STRAY}


def test_ranks_on_the_cpu_show_their_predictions() -> None:
    """A CPU rank reports no allocator peaks: its phases still carry the prediction, and
    the table shows it per rank, not ``n/a`` (issue 39, item 8)."""
    s = rs.build(cpu=True, stray=False)
    [ranks] = RankFeed().tables(s)
    for r in ranks.rows:
        assert set(r.phases) == {name for name, _ in rs.PHASES}
        assert all(p.peak is None and p.predicted for p in r.phases.values())
        assert r.predicted
    assert ranks.spreads == () and ranks.flags == ()  # nothing measured: nothing compared
    lines = format_ranks(ranks)
    for r, line in zip(ranks.rows, lines[2:], strict=False):
        *_, predicted, used = line.split()
        assert (predicted, used) == (fmt_short(r.predicted), "n/a")


def test_one_rank_of_a_larger_group_is_named_by_its_facts() -> None:
    """One rank of a world-8 job in one process (torch's fake process group, no launcher's
    RANK): its facts name the group, its label says so."""
    s = Session(t_origin=T0)
    script = Script(s, 4242)
    script.send("hello", T0, argv=["train.py"], hostname="node1")
    facts = rs.facts()
    facts["parallel"] = {"strategy": "fsdp2", "rank": 0, "world_size": 8}
    script.send("facts", T0 + MS, facts=facts)
    assert s.processes[4242].short_label == "rank 0 of 8"
    facts["parallel"] = {"strategy": "fsdp2", "rank": 9, "world_size": 8}  # hostile
    script.send("facts", T0 + 2 * MS, facts=facts)
    assert s.processes[4242].short_label == "pid 4242"


def test_no_faults_when_the_ranks_agree() -> None:
    s = rs.build(stray=False, extra_eval=0)
    [ranks] = RankFeed().tables(s)
    assert ranks.flags == ()


def test_a_rank_behind_is_flagged() -> None:
    s = rs.build(steps={3: 1}, stray=False, extra_eval=0)
    [ranks] = RankFeed().tables(s)
    [flag] = ranks.flags
    assert (flag.kind, flag.rank, flag.bytes) == ("step_behind", 3, 2)


def test_the_newest_step_counts_not_the_highest() -> None:
    # Rank 0's eval was high in its first step only: the newest step is what is compared.
    s = rs.build(stray=False, extra_eval=0)
    script = Script(s, rs.PIDS[0])
    script.seq = 10_000
    t0 = T0 + 10 * rs.STEP_MS * MS
    common = {"name": "eval", "id": 999, "depth": 0, "step": 7, "dev": 0}
    script.send("phase", t0, event="begin", allocated=GIB, reserved=GIB, **common)
    script.send(
        "phase", t0 + MS, event="end", allocated=GIB, reserved=GIB, peak_allocated=GIB, **common
    )
    [ranks] = RankFeed().tables(s)
    assert ranks.rows[0].phases["eval"].peak == GIB
    assert ranks.rows[0].step == 7
    assert {f.kind for f in ranks.flags} == {"step_behind"}


def test_jobs_one_after_the_other_and_lone_ranks() -> None:
    s = rs.build(stray=False)
    for pid in rs.PIDS:  # the first launch ended
        s.processes[pid].ended = T0 + rs.STEPS * rs.STEP_MS * MS
    later = rs.build(
        session=s, pids=[6100, 6101, 6102, 6103], stray=False, start=10 * rs.STEP_MS * MS
    )
    groups = jobs(later)
    assert [sorted(p.pid for p in g) for g in groups] == [
        [6100, 6101, 6102, 6103],
        rs.PIDS,
    ]
    lone = rs.build(ranks=(1,))
    assert RankFeed().tables(lone) == []


def test_hostile_hello_values_make_no_rank() -> None:
    s = rs.build(stray=False)
    for pid, (rank, world) in zip(rs.PIDS, [("0", 4), (True, 4), (5, 4), (1, 10**12)], strict=True):
        s.processes[pid].hello.update(rank=rank, world_size=world)
    assert jobs(s) == []


def test_explanations_are_kept_while_a_live_process_changes() -> None:
    s = rs.build()
    s.live = True
    calls: list[int] = []
    now = [100.0]

    def explain(session, proc):
        calls.append(proc.pid)
        from gpuwatch.analysis.explain import explain_process

        return explain_process(session, proc)

    feed = RankFeed(explain=explain, every=5.0, clock=lambda: now[0])
    feed.tables(s)
    assert sorted(calls) == rs.PIDS
    s.processes[rs.PIDS[0]].rev += 1
    feed.tables(s)
    assert len(calls) == 4  # changed, but explained less than 5 s ago
    now[0] += 6
    feed.tables(s)
    assert calls[4:] == [rs.PIDS[0]]  # only the one that changed


def test_marks_are_made_once_and_replayed(tmp_path) -> None:
    s = rs.build(steps={3: 1})
    s.live = True
    # A live session's now is the monotonic clock, the job's times are T0's (1000 s): on
    # a machine up for less than that (a fresh CI machine) the job lay in the future and
    # no rank was found. Its clock stands at the job's end instead.
    end = T0 + rs.STEPS * rs.STEP_MS * MS
    s.now = lambda: end  # type: ignore[method-assign]
    marks = RankMarks()
    made = marks.check(s, t=end)
    assert sorted((m.pid, m.level) for m in made) == [
        (rs.PIDS[2], "warning"),
        (rs.PIDS[3], "warning"),
    ]
    assert marks.check(s) == []  # told once
    texts = sorted(m.text for m in made)
    assert texts[0].startswith(MARK_PREFIX + "rank 2 (pid 5102) holds 300 MiB on GPU 0")
    assert texts[1].startswith(MARK_PREFIX + "rank 3 is at step 0, 2 behind rank 0")
    # The above-median eval is shown, not marked: it needs the phases' peaks.
    assert not any("eval" in t for t in texts)
    s.live = False
    path = save_session(s, tmp_path / "job.gpuwatch")
    replayed = sorted(m.text for m in load(path).every_mark())
    assert replayed == texts


def test_info_has_the_ranks_table_text_and_json(tmp_path) -> None:
    path = save_session(rs.build(), tmp_path / "job.gpuwatch")
    out = run_cli("info", "--json", str(path))
    assert out.returncode == 0, out.stderr
    [job] = json.loads(out.stdout)["ranks"]
    assert job["count"] == 4
    assert job["phases"]["eval"]["max_rank"] == 0
    assert job["phases"]["eval"]["min_rank"] == 1
    assert job["phases"]["eval"]["spread_bytes"] == GIB
    assert {(f["kind"], f["rank"]) for f in job["flags"]} == {
        ("above_median", 0),
        ("stray_context", 2),
    }
    out = run_cli("info", str(path))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "ranks: 4 (world size 4, newest step 2)" in text
    assert "! rank 0 eval peak 5.00 GiB is 1.00 GiB above the median" in text
    assert "! rank 2 (pid 5102) holds 300 MiB on GPU 0, not its own GPU 2" in text
    assert "eval            5.0G (rank 0)  4.0G (rank 1)" in text


def test_info_of_a_single_process_has_no_ranks(tmp_path) -> None:
    path = save_session(rs.build(ranks=(0,)), tmp_path / "one.gpuwatch")
    out = run_cli("info", "--json", str(path))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["ranks"] == []
    assert "ranks:" not in run_cli("info", str(path)).stdout


def test_merged_multi_host_replay_is_one_job(tmp_path) -> None:
    a = save_session(rs.build(ranks=(0, 1), hostname="nodea"), tmp_path / "a.gpuwatch")
    b = save_session(rs.build(ranks=(2, 3), hostname="nodeb"), tmp_path / "b.gpuwatch")
    out = run_cli("info", "--json", str(a), str(b))
    assert out.returncode == 0, out.stderr
    [job] = json.loads(out.stdout)["ranks"]
    # Both files were written on this host: the merge names them by file (a, b).
    assert [(r["rank"], r["host"], r["gpu"], r["pid"]) for r in job["rows"]] == [
        (0, "a", "a:0", rs.PIDS[0]),
        (1, "a", "a:1", rs.PIDS[1]),
        (2, "b", "b:2", rs.PIDS[2]),
        (3, "b", "b:3", rs.PIDS[3]),
    ]
    # Rank 2's pid is on b's GPU 0, not a's.
    [stray] = [f for f in job["flags"] if f["kind"] == "stray_context"]
    assert (stray["rank"], stray["category"]) == (2, "b:0")
    assert job["phases"]["eval"]["max_rank"] == 0


def test_info_shows_a_hostile_host_name_escaped(tmp_path) -> None:
    s = rs.build()
    s.processes[rs.PIDS[1]].hello["hostname"] = "evil\x1b]0;pwned\x07"
    path = save_session(s, tmp_path / "job.gpuwatch")
    out = run_cli("info", str(path))
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "evil\\x1b]0;pwned\\x07" in out.stdout


def _fast_job(steps: dict[int, int], scale: dict[int, int] | None = None) -> Session:
    """Two ranks of 10 ms steps (one phase each); ``steps``: how many each has reported,
    ``scale``: a rank whose counter counts ``n`` per step (a counter bug)."""
    s = Session(t_origin=T0)
    s.live = False
    for rank, n in steps.items():
        script = Script(s, rs.PIDS[rank])
        script.send("hello", T0, rank=rank, world_size=2, local_rank=rank)
        for i in range(n):
            step = i * (scale or {}).get(rank, 1)
            common = {"name": "forward", "id": i + 1, "depth": 0, "step": step}
            script.send("phase", T0 + i * 10 * MS, event="begin", **common)
            script.send("phase", T0 + (i * 10 + 8) * MS, event="end", **common)
    return s


def test_steps_compare_at_one_moment_not_as_far_as_each_arrived() -> None:
    # Rank 1's last three steps are still on their way (30 ms): not a rank behind.
    [ranks] = RankFeed().tables(_fast_job({0: 10, 1: 7}))
    assert [r.step for r in ranks.rows] == [6, 6] and ranks.flags == ()
    # Counters that differ at the same moment do diverge.
    [ranks] = RankFeed().tables(_fast_job({0: 10, 1: 10}, scale={0: 2}))
    [flag] = ranks.flags
    assert (flag.kind, flag.rank, flag.bytes) == ("step_behind", 1, 9)


def test_no_stray_when_its_own_gpu_is_unknown() -> None:
    # It sees four GPUs, names none in phases or figures, and has no LOCAL_RANK: GPU 0 may
    # well be its own. A process that sees no GPU and is listed on one is a stray.
    s = rs.build()
    proc = s.processes[rs.PIDS[2]]
    proc.hello.pop("local_rank")
    proc.phases.retain(0)
    proc.torch.retain(0)
    assert len(proc.phases) - proc.phases.first == 0
    row = RankFeed().row(s, proc, phases=False)
    assert row.gpu is None and row.strays == {}
    proc.devices.clear()
    row = RankFeed().row(s, proc, phases=False)
    assert row.strays == {"0": rs.STRAY, "2": 12 * GIB}
