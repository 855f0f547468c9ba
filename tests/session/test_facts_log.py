"""Facts epochs: a new model (a notebook's re-run model cell) starts a new set of facts at
its message's time, facts of the same model complete it, and a hostile ``epoch`` changes
nothing but the latest facts. A notebook kernel is labelled by its notebook."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwatch import protocol
from gpuwatch.session import Session
from gpuwatch.session.process import (
    MAX_EPOCHS,
    FactsEpoch,
    Process,
    add_facts,
    notebook_label,
)

PID = 4242
MS = 10**6


class Script:
    """Sends validated protocol messages for one process (encoded and decoded as sent)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.seq = 0

    def send(self, kind: str, t: int, **body: Any) -> None:
        data = protocol.encode(kind, PID, self.seq, t, 0, body)
        self.seq += 1
        self.session.ingest(protocol.decode(data))


def _proc(*messages: tuple[str, int, dict[str, Any]]) -> Process:
    s = Session()
    script = Script(s)
    for kind, t, body in messages:
        script.send(kind, t, **body)
    return s.processes[PID]


def test_a_new_epoch_starts_a_new_model_at_its_time_and_keeps_the_old_one() -> None:
    a = {"epoch": 0, "params": {"count": 10}}
    b = {"epoch": 1, "params": {"count": 20}}
    proc = _proc(("facts", 5 * MS, {"facts": a}), ("facts", 50 * MS, {"facts": b}))
    assert proc.facts == b  # what wants "now" reads the latest
    assert proc.facts_log == (FactsEpoch(5 * MS, 0, a), FactsEpoch(50 * MS, 1, b))
    assert proc.facts_at(1 * MS) == a  # before the first model's facts: the first's
    assert proc.facts_at(5 * MS) == a
    assert proc.facts_at(50 * MS - 1) == a
    assert proc.facts_at(50 * MS) == b
    assert proc.facts_at(10**12) == b


def test_facts_of_the_same_epoch_complete_it_from_its_start() -> None:
    a = {"epoch": 0, "params": {"count": 10}}
    a_batch = {**a, "batch": {"batch": 4}}
    b = {"epoch": 1, "params": {"count": 20}}
    b_acts = {**b, "activations": {"source": "measured", "bytes": 5}}
    proc = _proc(
        ("hello", 1 * MS, {"argv": ["ipykernel_launcher.py"], "facts": a}),
        ("facts", 9 * MS, {"facts": a_batch}),
        ("facts", 50 * MS, {"facts": b}),
        ("facts", 70 * MS, {"facts": b_acts}),
    )
    assert proc.facts_log == (FactsEpoch(1 * MS, 0, a_batch), FactsEpoch(50 * MS, 1, b_acts))
    assert proc.facts_at(60 * MS) is proc.facts  # completed: the later facts, from 50 ms


def test_facts_without_an_epoch_replace_as_before() -> None:
    a, b = {"params": {"count": 10}}, {"params": {"count": 20}}
    proc = _proc(("facts", 5 * MS, {"facts": a}), ("facts", 50 * MS, {"facts": b}))
    assert proc.facts == b
    assert proc.facts_epochs() == (FactsEpoch(5 * MS, None, b),)
    assert proc.facts_at(6 * MS) == b  # one model: the latest facts, everywhere


@pytest.mark.parametrize("hostile", [True, -1, 2**40, "1", 1.5, None, [1], {"n": 1}])
def test_a_hostile_epoch_only_replaces_the_latest_facts(hostile: object) -> None:
    a = {"epoch": 0, "params": {"count": 10}}
    b = {"epoch": 1, "params": {"count": 20}}
    odd = {"epoch": hostile, "params": {"count": 30}}
    proc = _proc(
        ("facts", 5 * MS, {"facts": a}),
        ("facts", 50 * MS, {"facts": b}),
        ("facts", 60 * MS, {"facts": odd}),
    )
    assert proc.facts == odd
    # No new model: the latest one's facts replaced, its number and start kept.
    assert proc.facts_log == (FactsEpoch(5 * MS, 0, a), FactsEpoch(50 * MS, 1, odd))
    c = {"epoch": 2, "params": {"count": 40}}
    add_facts(proc, c, 80 * MS)  # the next real model still starts one
    assert [e.epoch for e in proc.facts_log] == [0, 1, 2]


def test_a_model_that_comes_back_in_time_starts_where_the_last_one_did() -> None:
    proc = Process(PID)
    add_facts(proc, {"epoch": 0, "n": 1}, 50 * MS)
    add_facts(proc, {"epoch": 1, "n": 2}, 10 * MS)  # the script's clock, not ours
    assert [e.start for e in proc.facts_log] == [50 * MS, 50 * MS]
    assert proc.facts_at(50 * MS) == {"epoch": 1, "n": 2}


def test_past_the_bound_the_oldest_but_the_first_are_forgotten() -> None:
    proc = Process(PID)
    for i in range(MAX_EPOCHS + 5):
        add_facts(proc, {"epoch": i}, i * MS)
    log = proc.facts_log
    assert len(log) == MAX_EPOCHS
    assert log[0] == FactsEpoch(0, 0, {"epoch": 0})  # the first is kept
    assert log[1] == FactsEpoch(1 * MS, None, None)  # one stretch, forgotten
    assert [e.epoch for e in log[2:]] == list(range(7, MAX_EPOCHS + 5))
    assert proc.facts_at(0) == {"epoch": 0}
    assert proc.facts_at(3 * MS) is None  # a forgotten model: no other one stands in
    assert proc.facts_at(7 * MS) == {"epoch": 7}
    assert proc.facts_at(10**12) == {"epoch": MAX_EPOCHS + 4} == proc.facts


def test_facts_set_directly_replace_the_latest_model() -> None:
    """Code that sets ``facts`` without :func:`add_facts` (older paths, tests) keeps
    working: those facts are the latest model's."""
    proc = Process(PID, first_t=3)
    proc.facts = {"n": 1}
    assert proc.facts_epochs() == (FactsEpoch(3, None, {"n": 1}),)
    add_facts(proc, {"epoch": 0, "n": 2}, 10)
    add_facts(proc, {"epoch": 1, "n": 3}, 20)
    proc.facts = {"n": 4}
    # The first model had no number: it takes the first one given, from its own start.
    assert proc.facts_epochs() == (
        FactsEpoch(3, 0, {"epoch": 0, "n": 2}),
        FactsEpoch(20, 1, {"n": 4}),
    )
    proc.facts = None
    assert proc.facts_epochs() == () and proc.facts_at(30) is None


# --------------------------------------------------------------------------- notebook


def test_a_notebook_kernel_is_labelled_by_its_notebook() -> None:
    proc = _proc(
        ("hello", 1 * MS, {"argv": ["ipykernel_launcher.py", "-f", "/x/kernel-1.json"]}),
        ("hello", 2 * MS, {"notebook": "/home/u/work/train.ipynb"}),
    )
    assert proc.short_label == proc.label == "train.ipynb"
    proc.hello = {**proc.hello, "notebook": "kernel-3f2a"}
    assert proc.short_label == "kernel-3f2a"
    proc.hello = {**proc.hello, "notebook": "/"}
    assert proc.short_label == f"pid {PID}"  # nothing left of the name: the pid
    proc.hello = {**proc.hello, "notebook": "train.ipynb", "rank": 1, "world_size": 2}
    assert proc.short_label == "rank 1"  # a rank still names it first


def test_a_hostile_notebook_name_is_cleaned_for_display() -> None:
    name = notebook_label("/h/[red]evil\x1b[31m\nname\u202e.ipynb")
    assert name == "[red]evil[31mname.ipynb"  # markup is the views' to escape
    long = notebook_label("/h/" + "a" * 100 + ".ipynb")
    assert long is not None and len(long) == 40 and long.endswith("a.ipynb") and "…" in long
    assert notebook_label("C:\\Users\\u\\nb.ipynb") == "nb.ipynb"
    assert notebook_label("\n\t") is None


def test_the_notebook_field_is_checked_like_any_other() -> None:
    ok = protocol.encode("hello", PID, 0, 1, 0, {"notebook": None})
    assert "notebook" in protocol.decode(ok).body
    for bad in (5, ["a"], "x" * (protocol.MAX_TEXT + 1)):
        data = protocol.encode("hello", PID, 0, 1, 0, {"notebook": bad})
        with pytest.raises(protocol.ProtocolError):
            protocol.decode(data)
    assert protocol.clean("hello", {"notebook": 5, "argv": ["a"]}) == {"argv": ["a"]}
