"""The session: columnar tables, min/max decimation, phase spans and their peaks."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from gpuwatch import protocol
from gpuwatch.protocol import Message
from gpuwatch.session import MISSING_INT, Device, Session, Table, gpu_key, norm_uuid
from gpuwatch.session.decimate import column_edges, minmax, segment_max, value_at
from gpuwatch.session.messages import HANDLERS
from gpuwatch.session.ports import HostSampled, Noted


def test_table_grows_and_slices() -> None:
    t = Table([("t", "i8"), ("v", "f4"), ("n", "i8")], capacity=16)
    for i in range(1000):
        t.append({"t": i * 10, "v": i / 2, "n": None if i % 7 == 0 else i})
    t.extend({"t": [10_000, 10_010], "v": [1, 2], "n": [3, 4]})
    assert len(t) == 1002
    cols = t.between(100, 150)
    assert cols["t"].tolist() == [100, 110, 120, 130, 140, 150]
    assert t.snapshot()["n"][0] == MISSING_INT
    assert t.last() == {"t": 10_010, "v": 2.0, "n": 4}
    assert t.at(105)["t"] == 100
    assert t.at(-1) is None
    assert t.span() == (0, 10_010)


def test_table_concurrent_appends_stay_consistent() -> None:
    t = Table([("t", "i8"), ("v", "i8")], capacity=16)

    def writer(offset: int) -> None:
        for i in range(5000):
            t.append((i, offset + i))

    threads = [threading.Thread(target=writer, args=(k * 10**6,)) for k in range(4)]
    for th in threads:
        th.start()
    for _ in range(200):
        snap = t.snapshot()
        assert len(snap["t"]) == len(snap["v"])
    for th in threads:
        th.join()
    assert len(t) == 20000


def test_minmax_keeps_a_single_sample_spike_at_every_zoom() -> None:
    n = 100_000
    t = np.arange(n, dtype=np.int64) * 10_000_000  # 100 Hz for 1000 s
    v = np.full(n, 5.0)
    v[54_321] = 80.0  # one 10 ms excursion
    for width in (10, 100, 400, 1000, 5000):
        lo, hi = minmax(t, v, 0, int(t[-1]), width)
        assert np.nanmax(hi) == 80.0
        assert np.nanmin(lo) == 5.0
        assert np.count_nonzero(hi == 80.0) >= 1
    # Zoomed in around the spike, it lands in the right column.
    t0, t1 = int(t[54_300]), int(t[54_340])
    lo, hi = minmax(t, v, t0, t1, 40)
    assert hi[21] == 80.0


def test_minmax_never_averages() -> None:
    t = np.array([0, 1, 2, 3], dtype=np.int64)
    v = np.array([0.0, 10.0, 0.0, 10.0])
    lo, hi = minmax(t, v, 0, 4, 1, hold=False)
    assert (lo[0], hi[0]) == (0.0, 10.0)


def test_minmax_step_hold_fills_gaps_and_stops_at_last_sample() -> None:
    t = np.array([0, 100], dtype=np.int64)
    v = np.array([1.0, 2.0])
    lo, hi = minmax(t, v, 0, 200, 20)
    assert np.all(lo[1:10] == 1.0)  # held between the samples
    assert hi[10] == 2.0
    assert np.all(np.isnan(hi[11:]))  # nothing drawn after the newest sample
    lo, hi = minmax(t, v, -100, 0, 10)
    assert np.all(np.isnan(hi[:9]))  # nothing before the first sample


def test_minmax_skips_unknown_values() -> None:
    t = np.arange(4, dtype=np.int64)
    v = np.array([1.0, np.nan, np.nan, 3.0])
    lo, hi = minmax(t, v, 0, 4, 4, hold=False)
    assert lo[0] == 1.0 and np.isnan(lo[1]) and hi[3] == 3.0


def test_segment_max_spreads_a_peak_over_its_segment() -> None:
    start = np.array([0, 100, 200], dtype=np.int64)
    end = np.array([100, 200, 300], dtype=np.int64)
    vals = np.array([5, 50, 7], dtype=np.int64)
    out = segment_max(start, end, vals, 0, 300, 30)
    assert out[15] == 50 and out[5] == 5 and out[25] == 7
    assert np.nanmax(segment_max(start, end, vals, 0, 300, 1)) == 50
    assert np.all(np.isnan(segment_max(start, end, vals, 1000, 2000, 10)))


def test_segment_max_matches_each_column_by_hand() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(1, 30))
        edges = np.cumsum(rng.integers(0, 20, 2 * n))
        start, end = edges[0::2].astype(np.int64), edges[1::2].astype(np.int64)
        vals = rng.integers(0, 10**12, n)
        vals[rng.random(n) < 0.3] = MISSING_INT  # unknown: as if the segment were absent
        t0 = int(rng.integers(-10, int(edges[-1]) + 5))
        t1 = t0 + int(rng.integers(1, 300))
        width = int(rng.integers(1, 25))
        out = segment_max(start, end, vals, t0, t1, width)
        cuts = column_edges(t0, t1, width)
        for col in range(width):
            over = (end >= cuts[col]) & (start <= cuts[col + 1]) & (vals != MISSING_INT)
            if over.any():
                assert out[col] == vals[over].max()
            else:
                assert np.isnan(out[col])


def test_value_at_is_step_hold() -> None:
    t = np.array([10, 20], dtype=np.int64)
    v = np.array([1.0, 2.0])
    assert value_at(t, v, 5) is None
    assert value_at(t, v, 15) == 1.0
    assert value_at(t, v, 25) == 2.0


def _msg(kind: str, t: int, seq: int, **body) -> Message:
    return Message(kind=kind, pid=99, seq=seq, t=t, body=body)


def test_nested_phase_peaks_come_from_every_boundary_inside() -> None:
    s = Session()
    s.add_device(Device(gpu_key("GPU-abc"), "gpu", index=0, uuid="abc", total=80))
    s.ingest(_msg("hello", 0, 0, devices=[{"index": 0, "uuid": "abc", "name": "X"}]))
    fig = dict(dev=0, reserved=100)
    seq = iter(range(1, 100))
    s.ingest(
        _msg(
            "phase",
            10,
            next(seq),
            event="begin",
            name="step",
            id=1,
            depth=0,
            allocated=10,
            peak_allocated=11,
            peak_reserved=100,
            **fig,
        )
    )
    s.ingest(
        _msg(
            "phase",
            20,
            next(seq),
            event="begin",
            name="forward",
            id=2,
            depth=1,
            parent=1,
            allocated=10,
            peak_allocated=12,
            peak_reserved=100,
            **fig,
        )
    )
    s.ingest(
        _msg(
            "phase",
            30,
            next(seq),
            event="end",
            name="forward",
            id=2,
            depth=1,
            parent=1,
            allocated=40,
            peak_allocated=70,
            peak_reserved=100,
            **fig,
        )
    )
    s.ingest(
        _msg(
            "phase",
            40,
            next(seq),
            event="end",
            name="step",
            id=1,
            depth=0,
            allocated=20,
            peak_allocated=45,
            peak_reserved=100,
            **fig,
        )
    )
    proc = s.processes[99]
    cols = proc.phases.snapshot()
    names = [s.names[i] for i in cols["name"]]
    assert names == ["forward", "step"]
    assert cols["peak_alloc"].tolist() == [70, 70]  # forward's peak is inside step too
    assert cols["alloc0"].tolist() == [10, 10] and cols["alloc1"].tolist() == [40, 20]
    # The peak segments: each boundary's peak covers the time since the previous one.
    peaks = proc.peaks.snapshot()
    assert peaks["t0"].tolist() == [10, 10, 20, 30]
    assert peaks["t1"].tolist() == [10, 20, 30, 40]
    hi = proc.peak_window(gpu_key("abc"), "peak_allocated", 0, 50, 50)
    assert np.nanmax(hi[20:31]) == 70
    assert s.phase_at(proc, 25) == "forward"
    assert s.phase_at(proc, 35) == "step"
    assert s.phase_at(proc, 45) is None


def test_unmatched_end_and_sequence_gaps() -> None:
    s = Session()
    s.ingest(_msg("phase", 5, 0, event="end", name="forward", id=9))
    s.ingest(_msg("mark", 6, 5, text="after a gap"))
    proc = s.processes[99]
    assert len(proc.phases) == 0
    assert proc.gaps == 4


def test_uuid_mapping_and_torch_only_devices() -> None:
    assert norm_uuid("GPU-ABC-123") == "abc-123" == norm_uuid("abc-123")
    s = Session()
    s.add_device(Device(gpu_key("GPU-aaa"), "gpu", index=1, uuid="GPU-aaa", total=10))
    # torch index 0 is NVML index 1 (CUDA_VISIBLE_DEVICES=1); index 1 is unknown to NVML.
    s.ingest(
        _msg(
            "hello",
            0,
            0,
            devices=[
                {"index": 0, "uuid": "aaa", "name": "A", "total": 10},
                {"index": 1, "uuid": "bbb", "name": "B", "total": 20},
            ],
        )
    )
    proc = s.processes[99]
    assert proc.devices == {0: "gpu:aaa", 1: "gpu:bbb"}
    assert s.devices["gpu:bbb"].source == "torch"
    assert s.processes_on("gpu:aaa") == [proc]


@pytest.mark.parametrize("bad", [RuntimeError("listener broke"), KeyError("x")])
def test_a_failing_listener_is_counted_and_noted_once_never_raised(bad: Exception) -> None:
    s = Session()
    seen: list[object] = []

    def broken(event: object) -> None:
        raise bad

    s.subscribe(broken)
    s.subscribe(seen.append)  # a listener after the broken one still hears every fact
    for t in range(3):  # the producer's thread (here: this one) never sees the error
        s.add_host_sample({"t": t, "total": 2, "used": 1, "available": 1})
    assert len(s.host) == 3
    # Three samples and the note that reports the failure: each failed once.
    assert s.listener_failures == 4
    notes = [n for n in s.notes if "listener failed" in n]
    assert notes == [
        f"a session listener failed (test_a_failing_listener_is_counted_and_"
        f"noted_once_never_raised.<locals>.broken: {type(bad).__name__}); "
        "its further failures are counted, not shown"
    ]
    # The note goes out while the first sample's fan-out is under way.
    assert [type(e) for e in seen] == [Noted, HostSampled, HostSampled, HostSampled]
    assert seen[0] == Noted(notes[0])


def test_each_failing_listener_is_noted_once() -> None:
    s = Session()

    class Sink:
        def __call__(self, event: object) -> None:
            raise ValueError("no")

    s.subscribe(Sink())
    s.subscribe(Sink())
    s.note("first")
    assert s.listener_failures >= 2
    assert len([n for n in s.notes if "Sink: ValueError" in n]) == 1  # equal lines: one


def test_minmax_on_int_columns_skips_the_missing_marker() -> None:
    t = np.arange(6, dtype=np.int64)
    v = np.array([5, MISSING_INT, 7, MISSING_INT, MISSING_INT, 2], dtype=np.int64)
    lo, hi = minmax(t, v, 0, 6, 3, hold=False)
    assert lo.tolist() == [5.0, 7.0, 2.0]
    assert hi.tolist() == [5.0, 7.0, 2.0]
    lo, hi = minmax(t, v, 0, 6, 6, hold=False)
    assert np.isnan(lo[1]) and np.isnan(hi[4])


def test_segment_max_matches_a_brute_force_reference() -> None:
    rng = np.random.default_rng(3)
    bounds = np.cumsum(rng.integers(1, 50, 400)).astype(np.int64)
    start, end = bounds[:-1], bounds[1:]
    vals = rng.integers(0, 1000, len(start)).astype(np.int64)
    t0, t1, width = int(bounds[10]), int(bounds[300]), 97
    got = segment_max(start, end, vals, t0, t1, width)
    edges = t0 + np.arange(width + 1) * ((t1 - t0) / width)
    for j in range(width):
        over = (end >= int(edges[j])) & (start <= int(edges[j + 1]))
        assert got[j] == vals[over].max()


def test_value_at_treats_the_missing_marker_as_unknown() -> None:
    t = np.array([10, 20], dtype=np.int64)
    assert value_at(t, np.array([5, MISSING_INT], dtype=np.int64), 25) is None
    assert value_at(t, np.array([5, MISSING_INT], dtype=np.int64), 15) == 5.0


def test_phase_peaks_run_newest_first_within_a_step_too() -> None:
    # Before: steps newest first, but each step's phases oldest first.
    import synthetic

    from gpuwatch.session.peaks import phase_peaks

    s = synthetic.build()
    proc = next(iter(s.processes.values()))
    peaks = phase_peaks(s, proc, gpu_key(synthetic.UUID))
    assert len({p.step for p in peaks}) > 1
    keys = [(p.step, p.t0) for p in peaks]
    assert keys == sorted(keys, reverse=True)


def test_every_message_kind_has_a_handler_and_every_handler_a_kind() -> None:
    assert sorted(HANDLERS) == sorted(protocol.KINDS)
