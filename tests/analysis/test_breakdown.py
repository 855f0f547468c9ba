"""The predicted line (cached per step) and the breakdown bar's arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
import synthetic

from gpuwatch import predict as pr
from gpuwatch.analysis.breakdown import breakdown
from gpuwatch.analysis.predicted import PredictedLine
from gpuwatch.session import gpu_key

GIB = synthetic.GIB
MS = synthetic.MS
KEY = gpu_key(synthetic.UUID)


@pytest.fixture
def session():
    return synthetic.build()


def line_for(session) -> PredictedLine:
    line = PredictedLine(session, session.processes[synthetic.PID])
    assert line.update()
    return line


def test_predicted_line_matches_the_predictor(session) -> None:
    line = line_for(session)
    proc = session.processes[synthetic.PID]
    assert line.first_step == 0
    spans = pr.spans_from_columns(proc.phases.snapshot(), session.names)
    times, values = pr.predicted_curve(line.prediction, spans, first_step=0)
    for t in (150 * MS, 1500 * MS, 2750 * MS, 4100 * MS, 5300 * MS):
        expected = float(np.interp(t, times, values))
        assert line.value_at(t) == pytest.approx(expected, rel=1e-9)


def test_a_window_with_too_many_spans_draws_one_step_per_column() -> None:
    from gpuwatch.analysis import predicted

    session = synthetic.build(steps=40)
    line = line_for(session)
    end = 40 * 1000 * MS
    full = line.window(0, end, 10)
    old = predicted.MAX_SPANS
    predicted.MAX_SPANS = 20  # 200 spans in view: representative steps
    try:
        sampled = line.window(0, end, 10)
    finally:
        predicted.MAX_SPANS = old
    # Every step repeats the same shape, so each column's range is the same.
    np.testing.assert_allclose(sampled[0][1:], full[0][1:], rtol=1e-6)
    np.testing.assert_allclose(sampled[1], full[1], rtol=1e-6)


def test_predicted_window_never_misses_a_vertex(session) -> None:
    line = line_for(session)
    _, v = line.points(0, synthetic.end_time())
    lo, hi = line.window(0, synthetic.end_time(), 37)
    assert np.nanmax(hi) == pytest.approx(v.max())
    assert np.nanmin(lo) == pytest.approx(v.min())


def test_new_facts_reset_the_prediction(session) -> None:
    line = line_for(session)
    before = line.prediction
    proc = session.processes[synthetic.PID]
    proc.facts = dict(proc.facts)  # a new facts message replaces the object
    line.update()
    assert line.prediction is not before


def test_breakdown_without_a_process_list(session) -> None:
    line = line_for(session)
    t = 2750 * MS  # in step 2's optimizer.step, outside the 10 ms spike
    b = breakdown(session, KEY, t, {synthetic.PID: line})
    proc = session.processes[synthetic.PID]
    cols = proc.torch.snapshot()
    i = int(np.searchsorted(cols["t"], t, "right")) - 1
    reserved, held = float(cols["reserved"][i]), float(cols["allocated"][i])
    # The bar splits what the legend shows: the allocator's figures at t (held from
    # optimizer.step's begin). Inside that phase allocated may have been up to its exact
    # peak: the prediction above the held figure is within that headroom, never wrong.
    expected = line.breakdown_at(t)
    peak = session.span_at(proc, t)["peak_alloc"]
    allocated = held
    assert b.reserved == reserved and b.allocated == allocated
    assert b.headroom == peak - held and b.over_predicted == 0
    assert b.cache == reserved - allocated
    # No NVML process list: nothing is known of contexts or other processes, so the used
    # memory beyond torch's reserved is unclaimed (its own segment, never free).
    assert b.other is None and b.context is None
    assert b.unclaimed == pytest.approx(synthetic.CONTEXT * GIB, rel=0.01)
    assert b.predicted == pytest.approx({k: float(v) for k, v in expected.items()})
    assert b.unexplained == pytest.approx(allocated - sum(expected.values()))
    assert b.free == pytest.approx(80 * GIB - b.used)
    parts = dict(b.parts())
    assert parts["cache"] == b.cache and "weights" in parts
    # Every used byte has a segment, and the predicted categories split what is
    # allocated, cut where they reach it (the temporaries are not in the held figure).
    assert sum(parts.values()) == pytest.approx(b.used)
    split = sum(v for k, v in parts.items() if k in expected)
    assert split == pytest.approx(allocated)
    assert parts.get("temporaries", 0) < expected["temporaries"] / 10


def test_breakdown_with_nvml_process_list(session) -> None:
    t = 2750 * MS
    # NVML says: our process uses reserved + 3 GiB, another process 5 GiB.
    proc = session.processes[synthetic.PID]
    cols = proc.torch.snapshot()
    reserved = float(cols["reserved"][int(np.searchsorted(cols["t"], t, "right")) - 1])
    session.add_gpu_processes(
        KEY, t - 50 * MS, [(synthetic.PID, int(reserved + 3 * GIB), 0), (777, 5 * GIB, 0)]
    )
    b = breakdown(session, KEY, t)
    assert b.other == 5 * GIB
    assert b.context == pytest.approx(3 * GIB)
    # What the list leaves out of NVML's used figure (the driver, hidden processes):
    # nothing here, the list claims all of it.
    assert b.unclaimed == max(0.0, b.used - 5 * GIB - reserved - 3 * GIB) == 0
    assert b.predicted == {} and b.unexplained is None
    assert ("allocated", b.allocated) in b.parts()


def test_a_gpu_nobody_instruments_shows_its_used_memory_as_unclaimed() -> None:
    session = synthetic.build(with_process=False)
    b = breakdown(session, KEY, 2750 * MS)
    assert b.reserved is None and b.unclaimed == b.used > 0
    assert dict(b.parts()) == {"unclaimed": b.used}


def test_over_prediction_is_never_scaled_and_is_named(session) -> None:
    line = line_for(session)
    t = 2750 * MS
    b = breakdown(session, KEY, t, {synthetic.PID: line})
    b.predicted = {k: v * 3 for k, v in b.predicted.items()}
    b.unexplained = b.allocated - sum(b.predicted.values())
    assert b.unexplained < 0 and b.over_predicted == -b.unexplained - b.headroom > 0
    parts = dict(b.parts())
    # Filled in order, each at its own size until allocated is reached: never scaled,
    # never past what is allocated.
    assert parts["weights"] == b.predicted["weights"]
    assert sum(parts.get(k, 0) for k in b.predicted) == pytest.approx(b.allocated)
    assert "unexplained" not in parts


def test_the_cache_splits_into_fragmented_and_free(session) -> None:
    from gpuwatch.protocol import Message

    t = synthetic.end_time() + MS
    body = {"dev": 0, "allocated": 40 * GIB, "reserved": 44 * GIB, "inactive_split": GIB}
    session.ingest(Message("memory", synthetic.PID, 10**9, t, body=body))
    b = breakdown(session, KEY, t)
    parts = dict(b.parts())
    assert b.fragmented == GIB
    assert parts["fragmented"] == GIB and parts["cache"] == b.cache - GIB


def test_a_prediction_within_a_phase_s_exact_bounds_is_not_called_wrong(session) -> None:
    # Between boundaries the allocated figure is held: a prediction at the phase's peak
    # (here: the foreach temporaries, midway through optimizer.step) is within what the
    # phase reached, so nothing is over-predicted and the temporaries are drawn.
    line = line_for(session)
    proc = session.processes[synthetic.PID]
    t = 2750 * MS
    span = session.span_at(proc, t)
    assert span["name"] == "optimizer.step"
    b = breakdown(session, KEY, t, {synthetic.PID: line})
    assert b.unexplained < 0 and b.over_predicted == 0
    assert b.allocated + b.headroom == span["peak_alloc"]
    # What the phase reached above the held figure, as predicted: the spike's cause.
    [(name, above)] = b.above()
    assert name == "temporaries" and above == pytest.approx(synthetic.TEMP * GIB, rel=0.1)


def test_a_prediction_above_the_phase_s_exact_peak_is_over_predicted(session) -> None:
    proc = session.processes[synthetic.PID]
    t = 2750 * MS
    peak = session.span_at(proc, t)["peak_alloc"]

    class Above:  # a line that predicts 5 GiB more than the phase ever reached
        def breakdown_at(self, t: int) -> dict[str, int]:
            return {"weights": peak + 5 * GIB}

    b = breakdown(session, KEY, t, {synthetic.PID: Above()})
    assert b.allocated + b.headroom == peak
    assert b.over_predicted == pytest.approx(5 * GIB)
    # And outside any phase the held figure is all there is: no bounds to stretch to.
    gap = 2900 * MS  # after zero_grad, before the next step's data phase
    assert session.span_at(proc, gap) is None
    held = breakdown(session, KEY, gap, {synthetic.PID: Above()})
    cols = proc.torch.snapshot()
    i = int(np.searchsorted(cols["t"], gap, "right")) - 1
    assert held.allocated == float(cols["allocated"][i])


@pytest.mark.parametrize(
    ("parallel", "stays"),
    [
        ({"strategy": "ddp", "ddp": {"gradient_as_bucket_view": False}}, "ddp_buckets"),
        (
            {
                "strategy": "zero",
                "zero": {"stage": 2, "partition_count": 2, "master_bytes": 32 << 20},
            },
            "zero_master",
        ),
    ],
)
def test_below_a_phase_s_peak_the_layout_s_lasting_buffers_stay(parallel, stays) -> None:
    """Between two boundaries below the step's exact peak, what went is the step's own
    temporary, not DDP's buckets or ZeRO's master copy, alive in every phase (they were
    taken first when they sorted after the temporaries)."""
    from gpuwatch.analysis.breakdown import _below_peak

    facts = {
        "params": {"bytes": 64 << 20, "trainable_bytes": 64 << 20},
        "optimizer": {
            "class": "AdamW",
            "impl": "foreach",
            "groups": [{"group": 0, "bytes": 64 << 20, "tensors": 4, "max_tensor_bytes": 16 << 20}],
        },
        "parallel": parallel,
    }
    peak = pr.predict(facts).phases["optimizer.step", False].peak
    assert peak[stays] > 0 and peak["temporaries"] > 0
    left, removed = _below_peak(peak, peak["temporaries"])
    assert removed == {"temporaries": peak["temporaries"]}
    assert left[stays] == peak[stays]
