"""The typed facts (gpuwatch/facts.py) agree with docs/facts.md and with what is produced."""

from __future__ import annotations

import re
from typing import Any

import pytest
from conftest import ROOT

from gpuwatch import facts as F
from gpuwatch.predict._shape import OPTIMIZERS, ModelShape, facts_from_shape

DOC = (ROOT / "docs" / "facts.md").read_text()


def _doc_fields(heading: str) -> set[str]:
    """The backticked names in the first column of the first table after ``heading``."""
    section = DOC[DOC.index(heading) :]
    rows = re.findall(r"^\| ([^|]+) \|", section[section.index("| field |") :], re.M)
    names: set[str] = set()
    for cell in rows[2:]:
        if not cell.startswith("`"):
            break
        names |= set(re.findall(r"`([a-z_0-9]+)`", cell))
    return names


def test_the_typed_facts_name_the_documented_fields() -> None:
    assert _doc_fields("# Model facts") == set(F.Facts.__annotations__)
    # ``kind`` is the predictor's own: a normalised kind facts may carry.
    assert _doc_fields("## `optimizer`") == set(F.OptimizerFacts.__annotations__) - {"kind"}
    in_norm_row = {"norm_class", "norm_upcast"}  # documented in the ``norm`` row
    assert _doc_fields("## `transformer`") | in_norm_row == set(F.TransformerFacts.__annotations__)
    assert _doc_fields("## `parallel`") == set(F.ParallelFacts.__annotations__)
    assert _doc_fields("## `activations`") == set(F.ActivationFacts.__annotations__)


def _undeclared(value: Any, typed: type, where: str) -> list[str]:
    if not isinstance(value, dict):
        return []
    hints = typed.__annotations__
    out = [f"{where}.{k}" for k in value if k not in hints]
    for key, sub in (
        ("params", F.ParamFacts),
        ("optimizer", F.OptimizerFacts),
        ("transformer", F.TransformerFacts),
        ("batch", F.BatchFacts),
        ("buffers", F.BufferFacts),
    ):
        if key in hints and key in value and typed is F.Facts:
            out += _undeclared(value[key], sub, f"{where}.{key}")
    for bucket in value.get("groups") or [] if typed is F.OptimizerFacts else []:
        out += _undeclared(bucket, F.OptimizerBucket, f"{where}.groups[]")
    return out


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_the_estimated_facts_use_only_typed_fields(optimizer: str) -> None:
    shape = ModelShape(layers=2, hidden=64, heads=4, vocab=100, arch="llama")
    facts = facts_from_shape(shape, batch=2, seq=16, optimizer=optimizer, lora_rank=4)
    assert _undeclared(facts, F.Facts, "facts") == []


def test_the_check_finds_an_undeclared_field() -> None:
    facts = {"params": {"count": 1, "sizes": []}, "optimizer": {"groups": [{"oops": 1}]}}
    assert _undeclared(facts, F.Facts, "f") == ["f.params.sizes", "f.optimizer.groups[].oops"]


def test_the_collected_facts_use_only_typed_fields() -> None:
    # collect_facts assembles plain dicts and returns them as Facts: this holds the two to
    # each other, for a model read from its modules and one read from its config.
    torch = pytest.importorskip("torch")
    from _models import GPT, Llama, lora

    from gpuwatch.instrument._facts import batch_facts, collect_facts

    gpt = GPT(512, 64, 2, 64, 4, "eager", dropout=0.1)
    facts = collect_facts(gpt, torch.optim.AdamW(gpt.parameters(), weight_decay=0.05))
    facts["batch"] = batch_facts((torch.zeros(2, 16, dtype=torch.long),), {})
    assert _undeclared(facts, F.Facts, "gpt") == []
    llama = lora(Llama(512, 2, 64, 4, 2, 176, "sdpa"), 4)
    trainable = [p for p in llama.parameters() if p.requires_grad]
    facts = collect_facts(llama, torch.optim.SGD(trainable, momentum=0.9), amp_dtype=torch.bfloat16)
    assert "errors" not in facts
    assert _undeclared(facts, F.Facts, "llama") == []
