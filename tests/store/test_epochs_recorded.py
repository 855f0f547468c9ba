"""A recording keeps every model a process described (its facts epochs) and its notebook:
a replay and ``info`` predict and explain each phase from the model that ran it; an older
file (one model) and a hand-edited one open as they can."""

from __future__ import annotations

import itertools
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli

from gpuwatch import predict as pr
from gpuwatch.analysis.explain import CATEGORY_KEYS
from gpuwatch.analysis.predicted import predictions
from gpuwatch.predict._shape import ModelShape, facts_from_shape
from gpuwatch.protocol import Message
from gpuwatch.session import Session
from gpuwatch.session.process import MAX_EPOCHS, FactsEpoch
from gpuwatch.store import load
from gpuwatch.store.writer import SessionWriter, save_session

PID = 4242
MS = 10**6
T0 = 1_000_000_000_000
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
SWITCH = T0 + 100 * MS
NOTEBOOK = "/home/u/work/train.ipynb"
# Measured peaks (MiB): backward's highest on the small model, the step's on the big one.
SMALL_PEAKS = {"forward": 5, "backward": 80, "optimizer.step": 10}
BIG_PEAKS = {"forward": 5, "backward": 40, "optimizer.step": 99}


def _peaks(span: pr.Span) -> dict[str, int]:
    return SMALL_PEAKS if span.t0 < SWITCH else BIG_PEAKS


class _Run:
    """A notebook kernel's messages into a session: two steps per model, peaks measured
    (the first model's backward and the second's step highest)."""

    def __init__(self, s: Session) -> None:
        self.s = s
        self.seq = 0
        self.ids = 0

    def msg(self, kind: str, t: int, **body: Any) -> None:
        self.s.ingest(Message(kind=kind, pid=PID, seq=self.seq, t=t, body=body))
        self.seq += 1

    def steps(self, t: int, steps: range, peaks: dict[str, int]) -> None:
        for step in steps:
            for name, ms in (("forward", 10), ("backward", 10), ("optimizer.step", 5)):
                self.ids += 1
                self.msg("phase", t, event="begin", name=name, id=self.ids, step=step)
                t += ms * MS
                self.msg("phase", t, event="end", name=name, id=self.ids, step=step, dev=0,
                         allocated=1 << 20, reserved=1 << 30,
                         peak_allocated=peaks[name] << 20, peak_reserved=1 << 30)  # fmt: skip
                t += MS


def _expected(s: Session) -> dict[tuple[str, int, int], pr.SpanPeak]:
    spans = pr.spans_from_columns(s.processes[PID].phases.snapshot(), s.names)
    out = {}
    for facts, group, first in (
        (SMALL, [x for x in spans if x.t0 < SWITCH], 0),
        (BIG, [x for x in spans if x.t0 >= SWITCH], 2),
    ):
        for p in pr.span_peaks(pr.predict(facts), group, first_step=first):
            out[p.span.name, p.span.t0, p.span.t1] = p
    return out


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[Session, Path]:
    """The live session and its recording, written as the recorder writes: a sync while
    the first model runs, then the rest."""
    s = Session(t_origin=T0)
    s.live = False
    run = _Run(s)
    path = tmp_path / "nb.gpuwatch"
    writer = SessionWriter(path, s)
    run.msg("hello", T0, argv=["ipykernel_launcher.py", "-f", "k.json"], notebook=NOTEBOOK)
    run.msg("facts", T0 + MS, facts=SMALL)
    run.steps(T0 + 10 * MS, range(2), SMALL_PEAKS)
    writer.sync()
    run.msg("facts", SWITCH, facts=BIG)
    run.steps(SWITCH + 10 * MS, range(2, 4), BIG_PEAKS)
    writer.close()
    return s, path


def test_every_model_and_the_notebook_read_back(recorded: tuple[Session, Path]) -> None:
    live, path = recorded
    replay = load(path)
    p, q = live.processes[PID], replay.processes[PID]
    assert p.facts_log == (FactsEpoch(T0 + MS, 0, SMALL), FactsEpoch(SWITCH, 1, BIG))
    assert q.facts_log == p.facts_log
    assert q.facts == BIG and q.facts_log[-1].facts is q.facts
    assert q.short_label == p.short_label == "train.ipynb"
    # A replay predicts anew: each span from the model that ran it.
    line = predictions(replay).line(q)
    assert line is not None
    assert line.span_peaks(0, 2**62) == _expected(replay) == _expected(live)


def test_info_explains_each_phase_with_its_own_model(recorded: tuple[Session, Path]) -> None:
    _, path = recorded
    result = run_cli("info", "--json", str(path))
    assert result.returncode == 0, result.stderr
    (proc,) = json.loads(result.stdout)["processes"]
    assert proc["label"] == "train.ipynb"
    predicted = proc["predicted"]
    want = _expected(load(path))
    small, big = pr.predict(SMALL), pr.predict(BIG)

    def top(name: str, first: bool) -> pr.SpanPeak:
        """The group's span with the highest measured peak (the earliest of equals)."""
        members = [p for p in want.values() if p.span.name == name and p.first_step == first]
        return max(members, key=lambda p: (_peaks(p.span)[name], -p.span.t0))

    # backward's highest peak ran on the small model, the step's on the big one (SGD).
    back, step = top("backward", False), top("optimizer.step", False)
    assert back.span.t0 < SWITCH <= step.span.t0
    for entry, sp in ((predicted["backward"], back), (predicted["optimizer.step"], step)):
        assert entry["categories"] == {k: int(sp.peak.get(k, 0)) for k in CATEGORY_KEYS}
    assert predicted["optimizer.step"]["temporaries"] == big.optimizer.temp_name
    assert small.optimizer.temp_name != big.optimizer.temp_name
    text = run_cli("info", str(path))
    assert text.returncode == 0 and "train.ipynb" in text.stdout


def _edit_body(path: Path, edit: Any) -> None:
    with sqlite3.connect(path) as db:
        (body,) = db.execute("SELECT body FROM processes WHERE pid = ?", (PID,)).fetchone()
        body = json.loads(body)
        edit(body)
        db.execute("UPDATE processes SET body = ? WHERE pid = ?", (json.dumps(body), PID))
    db.close()


def test_a_file_from_before_epochs_reads_as_one_model(recorded: tuple[Session, Path]) -> None:
    _, path = recorded
    _edit_body(path, lambda b: b.pop("facts_log"))
    q = load(path).processes[PID]
    assert q.facts == BIG and q.facts_log == ()
    assert [e.facts for e in q.facts_epochs()] == [BIG]
    assert q.facts_at(T0) == BIG


HOSTILE: dict[str, Any] = {
    "not a list": "[[1, 0, {}]]",
    "empty": [],
    "entries not lists": [7, None, {"a": 1}],
    "last with facts of its own": [[T0, 0, SMALL], [SWITCH, 1, SMALL]],
    "bad numbers": [[T0, True, SMALL], [SWITCH, -4]],
    "start not an int": [["0", 0, SMALL], [1.5, 0, SMALL], [SWITCH, 1]],
    "starts going back": [[SWITCH, 0, SMALL], [T0, 1, SMALL], [SWITCH + 1, 2]],
    "facts not objects": [[T0, 0, [1, 2]], [T0 + 1, 1, "x"], [SWITCH, 2]],
    "too many": [[T0 + i, i, SMALL] for i in range(3 * MAX_EPOCHS)] + [[SWITCH, 99]],
    "huge start": [[2**70, 0, SMALL], [SWITCH, 1]],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_facts_log_opens_as_what_it_can_be(
    case: str, recorded: tuple[Session, Path]
) -> None:
    _, path = recorded
    _edit_body(path, lambda b: b.__setitem__("facts_log", HOSTILE[case]))
    q = load(path).processes[PID]
    assert q.facts == BIG
    log = q.facts_epochs()
    assert 1 <= len(log) <= MAX_EPOCHS and log[-1].facts is q.facts
    assert all(a.start <= b.start for a, b in itertools.pairwise(log))
    assert all(e.epoch is None or (type(e.epoch) is int and e.epoch >= 0) for e in log)
    assert all(e.facts is None or isinstance(e.facts, dict) for e in log)
    line = predictions(load(path)).line(load(path).processes[PID])
    assert line is not None
    line.span_peaks(0, 2**62)  # predicts what it can, never raises


def test_a_process_without_facts_stores_no_log(tmp_path: Path) -> None:
    s = Session(t_origin=T0)
    _Run(s).msg("hello", T0, argv=["x.py"])
    q = load(save_session(s, tmp_path / "r.gpuwatch")).processes[PID]
    assert q.facts is None and q.facts_epochs() == () and q.short_label == f"pid {PID}"
