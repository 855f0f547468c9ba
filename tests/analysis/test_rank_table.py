"""The ranks model: spreads per phase, the worst rank, and the faults it flags."""

from __future__ import annotations

from gpuwatch.analysis.rank_table import (
    ABOVE_BYTES,
    RankPhase,
    RankRow,
    compare,
    format_ranks,
    phase_key,
)

GIB = 1 << 30
MIB = 1 << 20


def _row(rank: int, peaks: dict[str, int], parts=None, **kw) -> RankRow:
    parts = parts or {}
    phases = {
        name: RankPhase(peak=v, predicted=v - 64 * MIB, parts=parts.get(name, {}))
        for name, v in peaks.items()
    }
    kw.setdefault("host", "node1")
    kw.setdefault("gpu", str(rank))
    kw.setdefault("pid", 1000 + rank)
    return RankRow(rank=rank, phases=phases, **kw)


def _four(eval0: int = 5 * GIB) -> list[RankRow]:
    base = {"forward": 6 * GIB, "backward": 7 * GIB, "optimizer.step": 8 * GIB, "eval": 4 * GIB}
    parts = {"eval": {"weights": 2 * GIB, "activations": 2 * GIB}}
    rows = [_row(r, dict(base), parts) for r in (1, 2, 3)]
    rank0 = dict(base, eval=eval0)
    parts0 = {"eval": {"weights": 2 * GIB, "activations": 2 * GIB, "unexplained": eval0 - 4 * GIB}}
    return [_row(0, rank0, parts0), *rows]


def test_rank_above_the_median_is_flagged_with_the_category_that_differs() -> None:
    ranks = compare(_four())
    spread = ranks.spread("eval")
    assert (spread.max_rank, spread.max_bytes) == (0, 5 * GIB)
    assert (spread.min_rank, spread.min_bytes) == (1, 4 * GIB)
    assert spread.spread_bytes == GIB and spread.median == 4 * GIB and spread.ranks == 4
    [flag] = ranks.flags
    assert (flag.kind, flag.rank, flag.phase, flag.bytes, flag.category) == (
        "above_median",
        0,
        "eval",
        GIB,
        "unexplained",
    )
    assert "rank 0 eval peak 5.00 GiB is 1.00 GiB above the median" in flag.text


def test_the_category_is_the_one_that_makes_the_difference() -> None:
    rows = _four(eval0=4 * GIB)
    heavy = {"eval": {"weights": 2 * GIB, "activations": 3 * GIB}}
    rows[2] = _row(2, {"eval": 5 * GIB}, heavy)
    [flag] = compare(rows).flags
    assert (flag.rank, flag.category) == (2, "activations")


def test_both_thresholds_must_be_crossed() -> None:
    # 20% above but under 256 MiB: noise of a small model.
    small = [_row(r, {"forward": 1 * GIB}) for r in range(3)]
    small.append(_row(3, {"forward": GIB + ABOVE_BYTES - MIB}))
    assert compare(small).flags == ()
    # 300 MiB above but 3% of a large rank: within the spread of a real job.
    large = [_row(r, {"forward": 10 * GIB}) for r in range(3)]
    large.append(_row(3, {"forward": 10 * GIB + 300 * MIB}))
    assert compare(large).flags == ()
    # Past both: flagged, without a category when the feed has no breakdown.
    large[3] = _row(3, {"forward": 12 * GIB})
    [flag] = compare(large).flags
    assert (flag.rank, flag.category) == (3, None)


def test_a_single_rank_is_never_above_itself() -> None:
    ranks = compare([_row(0, {"forward": 9 * GIB})])
    assert ranks.flags == ()
    assert ranks.spread("forward").max_rank == 0


def test_stray_context_and_diverging_steps() -> None:
    rows = _four(eval0=4 * GIB)
    rows = [
        RankRow(**{**r.__dict__, "step": 12 if r.rank != 3 else 9})
        if r.rank != 2
        else RankRow(**{**r.__dict__, "step": 12, "strays": {"0": 512 * MIB}})
        for r in rows
    ]
    ranks = compare(rows)
    kinds = {(f.kind, f.rank) for f in ranks.flags}
    assert kinds == {("stray_context", 2), ("step_behind", 3)}
    stray = next(f for f in ranks.flags if f.kind == "stray_context")
    assert stray.category == "0" and stray.bytes == 512 * MIB
    assert "holds 512 MiB on GPU 0, not its own GPU 2" in stray.text
    behind = next(f for f in ranks.flags if f.kind == "step_behind")
    assert behind.bytes == 3 and "step 9, 3 behind rank 0 (step 12)" in behind.text
    # One step apart is how a synchronous job looks between two samples.
    rows[3] = RankRow(**{**rows[3].__dict__, "step": 11})
    assert {f.kind for f in compare(rows).flags} == {"stray_context"}


def test_json_names_the_worst_and_best_rank_of_every_phase() -> None:
    out = compare(_four()).to_json()
    assert list(out["phases"]) == ["forward", "backward", "optimizer.step", "eval"]
    assert out["phases"]["eval"] == {
        "max_rank": 0,
        "max_bytes": 5 * GIB,
        "min_rank": 1,
        "min_bytes": 4 * GIB,
        "median_bytes": 4 * GIB,
        "spread_bytes": GIB,
        "ranks": 4,
    }
    assert [r["rank"] for r in out["rows"]] == [0, 1, 2, 3]
    assert out["rows"][0]["phases"]["eval"]["parts"]["unexplained"] == GIB
    assert out["flags"][0]["kind"] == "above_median"


def test_text_table_marks_the_flagged_rank() -> None:
    lines = format_ranks(compare(_four()))
    assert lines[0] == "ranks: 4"
    row0 = next(line for line in lines if line.lstrip().startswith("!0"))
    assert "5.0G" in row0
    assert any("5.0G (rank 0)" in line and line.lstrip().startswith("eval") for line in lines)
    assert lines[-1].startswith("  ! rank 0 eval peak")


def test_phase_order_is_the_step_order() -> None:
    names = ["zero_grad", "eval", "custom", "forward", "data", "optimizer.step", "backward"]
    assert sorted(names, key=phase_key) == [
        "data",
        "forward",
        "backward",
        "optimizer.step",
        "zero_grad",
        "eval",
        "custom",
    ]
