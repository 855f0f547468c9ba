"""Each phase predicted from the model that ran it: a notebook that builds a second model
(a new facts epoch) keeps the first model's predictions and explanations for the phases
before it, and a new model's first optimizer step is a first step again."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwatch import predict as pr
from gpuwatch.analysis.explain import CATEGORY_KEYS, explain_process
from gpuwatch.analysis.moment import moment
from gpuwatch.analysis.oom_answer import recorded_plan
from gpuwatch.analysis.predicted import PredictedLine, predictions
from gpuwatch.predict import plan_from_facts
from gpuwatch.predict._shape import ModelShape, facts_from_shape
from gpuwatch.protocol import Message
from gpuwatch.session import Device, Session, gpu_key

PID = 4242
MS = 10**6
GIB = 1 << 30
UUID = "GPU-5f1c0de0-0000-4000-8000-000000000009"
SMALL = {
    **facts_from_shape(ModelShape(2, 64, 4, 512), batch=2, seq=32, precision="fp32"),
    "epoch": 0,
}
BIG = {
    **facts_from_shape(
        ModelShape(4, 256, 4, 2048), batch=4, seq=64, precision="fp32", optimizer="sgd"
    ),
    "epoch": 1,
}
SWITCH = 100 * MS
"""When the second model is described."""

PLAN = (("forward", 10), ("backward", 10), ("optimizer.step", 5), ("zero_grad", 1))
# Measured peaks (MiB) by (phase, step): the highest of each group is in the first
# model's time for forward and backward, in the second's for the step.
MEASURED = {
    ("forward", 0): 90,
    ("forward", 2): 40,
    ("backward", 1): 80,
    ("backward", 3): 60,
    ("optimizer.step", 1): 10,
    ("optimizer.step", 3): 99,
}


def build(second: bool = True) -> Session:
    """Two steps of the small model, then (``second``) two of the big one, steps counted on."""
    s = Session()
    s.live = False
    key = gpu_key(UUID)
    s.add_device(Device(key, "gpu", index=0, name="H100", uuid=UUID, total=80 * GIB))
    seq = iter(range(10_000))

    def msg(kind: str, t: int, **body: Any) -> None:
        s.ingest(Message(kind=kind, pid=PID, seq=next(seq), t=t, body=body))

    msg("hello", 0, argv=["ipykernel_launcher.py"], notebook="/home/u/train.ipynb",
        devices=[{"index": 0, "uuid": UUID[4:], "name": "H100", "total": 80 * GIB}])  # fmt: skip
    msg("facts", 1 * MS, facts=SMALL)
    ids = iter(range(1, 10_000))
    t = 10 * MS
    for step in range(4 if second else 2):
        if step == 2:
            msg("facts", SWITCH, facts=BIG)
            t = SWITCH + 10 * MS
        for name, ms in PLAN:
            sid = next(ids)
            peak = MEASURED.get((name, step), 5) << 20
            msg("phase", t, event="begin", name=name, id=sid, step=step, dev=0,
                allocated=1 << 20, reserved=GIB)  # fmt: skip
            t += ms * MS
            msg("phase", t, event="end", name=name, id=sid, step=step, dev=0, allocated=1 << 20,
                reserved=GIB, peak_allocated=peak, peak_reserved=GIB)  # fmt: skip
            t += 1 * MS
    return s


def expected(s: Session) -> dict[tuple[str, int, int], pr.SpanPeak]:
    """Each span's peak walked by its own model alone: the small one's steps from 0, the
    big one's from its own first step (2)."""
    spans = pr.spans_from_columns(s.processes[PID].phases.snapshot(), s.names)
    before = [sp for sp in spans if sp.t0 < SWITCH]
    after = [sp for sp in spans if sp.t0 >= SWITCH]
    out = {}
    for facts, group, first in ((SMALL, before, 0), (BIG, after, 2)):
        for p in pr.span_peaks(pr.predict(facts), group, first_step=first):
            out[p.span.name, p.span.t0, p.span.t1] = p
    return out


def test_the_models_differ_enough_to_tell_apart() -> None:
    small, big = pr.predict(SMALL), pr.predict(BIG)
    for phase in ("forward", "backward", "optimizer.step"):
        assert pr.total(small.phases[phase, False].peak) < pr.total(big.phases[phase, False].peak)
    assert small.optimizer.temp_name != big.optimizer.temp_name


def test_each_span_is_predicted_from_the_model_in_force_when_it_began() -> None:
    s = build()
    line = predictions(s).line(s.processes[PID])
    assert line is not None
    want = expected(s)
    assert line.span_peaks(0, 10**12) == want
    assert line.prediction is not None and line.prediction_at(0) is not line.prediction
    # The big model's first optimizer.step is a first step: its optimizer had no state.
    firsts = {(p.span.name, p.span.step) for p in want.values() if p.first_step}
    assert ("forward", 2) in firsts and ("optimizer.step", 2) in firsts
    assert ("forward", 3) not in firsts
    assert [e.first_step for e in line.epochs] == [0, 2]


def test_the_curve_follows_each_model_and_steps_between_them() -> None:
    s = build()
    line = predictions(s).line(s.processes[PID])
    assert line is not None
    t, v = line.points(0, 10**12)
    assert (t[1:] >= t[:-1]).all()
    alone = PredictedLine(build(second=False), build(second=False).processes[PID])
    alone.update()
    before = t < SWITCH
    small_max, big_max = v[before].max(), v[~before].max()
    assert small_max < big_max
    # At a moment in each model's time: that model's walk, nothing of the other's.
    spans = pr.spans_from_columns(s.processes[PID].phases.snapshot(), s.names)
    for at in (15 * MS, 40 * MS, SWITCH + 15 * MS, SWITCH + 45 * MS):
        facts, first = (SMALL, 0) if at < SWITCH else (BIG, 2)
        mine = [sp for sp in spans if (sp.t0 < SWITCH) == (at < SWITCH) and sp.t0 <= at]
        want = pr.breakdown_at(pr.predict(facts), mine, at, first_step=first)
        assert line.breakdown_at(at) == want, at
    # Before the big model's first phase: none of its phases to place the moment on.
    assert line.value_at(SWITCH + 5 * MS) is None


def _measured(span: pr.Span) -> int:
    return MEASURED.get((span.name, span.step or 0), 5) << 20


def test_each_phase_is_explained_with_its_own_model() -> None:
    s = build()
    ex = explain_process(s, s.processes[PID])
    assert ex is not None
    want = expected(s)
    sides = set()
    for (name, first), e in ex.phases.items():
        members = [p for p in want.values() if p.span.name == name and p.first_step == first]
        top = max(members, key=lambda p: (_measured(p.span), -p.span.t0))
        assert e.step == top.span.step, (name, first)
        assert e.categories == {k: int(top.peak.get(k, 0)) for k in CATEGORY_KEYS}, (name, first)
        assert e.count == len(members)
        assert e.predicted == max(pr.total(p.peak) for p in members)
        model = pr.predict(SMALL if top.span.t0 < SWITCH else BIG)
        if name == "optimizer.step":
            assert e.temporaries == model.optimizer.temp_name
        sides.add((name, top.span.t0 < SWITCH))
    # Both models explained something: the groups' highest peaks lie on both sides.
    assert ("backward", True) in sides and ("optimizer.step", False) in sides


def test_the_cursor_explains_a_phase_with_the_model_that_ran_it() -> None:
    s = build()
    want = expected(s)
    registry = predictions(s)
    registry.update()
    key = gpu_key(UUID)
    for sp in want.values():
        if sp.span.name != "backward":
            continue
        at = (sp.span.t0 + sp.span.t1) // 2
        m = moment(s, key, at, registry)
        e = m.explained[PID]
        assert e.categories == {k: int(sp.peak.get(k, 0)) for k in CATEGORY_KEYS}


def test_an_oom_is_planned_from_the_model_that_ran_out() -> None:
    s = build()
    body = {"phase": "backward", "requested": GIB}
    s.ingest(Message(kind="oom", pid=PID, seq=9_999, t=30 * MS, body=body))
    oom = s.ooms[-1]
    rec = recorded_plan(s, oom)
    assert rec.recorded == plan_from_facts(SMALL)[0] != plan_from_facts(BIG)[0]


@pytest.mark.parametrize("epochs", [1, 3])
def test_one_model_or_several_give_the_same_line_for_the_same_model(epochs: int) -> None:
    """The same facts sent as new models changes nothing a span predicted from them shows."""
    s = build(second=False)
    proc = s.processes[PID]
    for i in range(1, epochs):
        body = {"facts": {**SMALL, "epoch": i}}
        s.ingest(Message(kind="facts", pid=PID, seq=500 + i, t=200 * MS + i, body=body))
    line = PredictedLine(s, proc)
    line.update()
    assert len(line.epochs) == epochs
    assert line.span_peaks(0, 10**12) == expected(build(second=False))
