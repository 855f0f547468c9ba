"""Model facts are the script's word: whatever a facts object holds, nothing crashes.

The dashboard's predicted line and the Prometheus exporter predict from the facts each
process sent (or a recording stored). Facts that pass the protocol's checks (JSON of
bounded depth, numbers in range) but make no sense must leave the line empty and say so
in a note, never raise into the app.
"""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpuwatch.analysis.predicted import PredictedLine
from gpuwatch.protocol import Message
from gpuwatch.session import Session

MS = 10**6
KEYS = [
    "params", "optimizer", "buffers", "amp", "checkpointing", "transformer", "batch", "groups",
    "bytes", "count", "dtype", "class", "impl", "layers", "hidden", "heads", "vocab", "seq",
    "enabled", "trainable_bytes", "tensors", "device", "options", "foreach", "lora", "rank",
]  # fmt: skip
values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), inner, max_size=5)
    ),
    max_leaves=25,
)
facts_objects = st.dictionaries(st.sampled_from(KEYS), values, max_size=7)


def _session_with(facts: dict) -> tuple[Session, PredictedLine]:
    s = Session(t_origin=0)
    s.live = False
    pid = 4242
    s.ingest(Message("hello", pid, 0, 1, body={"argv": ["x"], "facts": facts}))
    t, sid = 10 * MS, 0
    for step in range(2):
        for name in ("forward", "backward", "optimizer.step", "zero_grad"):
            sid += 1
            begin = {"event": "begin", "name": name, "id": sid, "parent": None, "depth": 0}
            s.ingest(Message("phase", pid, 2 * sid, t, body={**begin, "step": step}))
            t += 10 * MS
            s.ingest(
                Message("phase", pid, 2 * sid + 1, t, body={**begin, "event": "end", "step": step})
            )
    return s, PredictedLine(s, s.processes[pid])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(facts_objects)
@example({"optimizer": {"class": "AdamW", "groups": 5}})  # found by this test once
@example({"optimizer": {"groups": [{"bytes": "many"}]}, "params": {"bytes": -(2**53)}})
def test_any_facts_leave_the_predicted_line_working_or_empty(facts: dict) -> None:
    _, line = _session_with(facts)
    usable = line.update()
    lo, hi = line.window(0, 100 * MS, 50)
    assert len(lo) == len(hi) == 50
    line.value_at(35 * MS)
    line.breakdown_at(35 * MS)
    line.span_peaks(0, 100 * MS)
    if not usable or line.prediction is None:
        assert line.prediction is None


def test_unusable_facts_are_named_in_a_note(monkeypatch) -> None:
    import gpuwatch.predict as pr

    def broken(facts: dict) -> None:
        raise TypeError("'int' object is not iterable")

    monkeypatch.setattr(pr, "predict", broken)
    session, line = _session_with({"optimizer": {"class": "AdamW", "groups": 5}})
    assert line.update() is False
    assert line.prediction is None
    lo, _ = line.window(0, 100 * MS, 50)
    assert all(v != v for v in lo)  # NaN: nothing drawn
    assert any("model facts cannot be used" in n for n in session.notes)
