"""Before the run against the run: ``estimate``'s plan from the config alone, per rank.

A small Llama-style causal LM (``ranks_cases._hf_model``) trains for two steps on the
CPU as real gloo ranks or as rank 0 of eight through the fake process group; the truth
is each phase's peak from torch.profiler's allocator events (``profmem``). The plan
knows only the config, the batch and the layout, never the run's facts: it must land
within 10% of every phase of every step on every rank.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from ranks_cases import CASES, HF_BATCH, HF_SEQ, HF_VOCAB, LORA_RANK, run_case  # noqa: E402

from gpuwatch.predict import ModelShape, Plan, rank_estimate, total  # noqa: E402

pytestmark = pytest.mark.torch

TOLERANCE = 0.10

# ranks_cases._hf_model's LlamaConfig, as a config.json would give it.
SHAPE = ModelShape(
    layers=4,
    hidden=256,
    heads=4,
    vocab=HF_VOCAB,
    arch="llama",
    kv_heads=2,
    intermediate=688,
    tied=False,
    max_positions=HF_SEQ,
)

PLANS: dict[str, dict[str, Any]] = {
    "fsdp2-hf": {"layout": "fsdp"},
    "fsdp2-hf-fake8": {"layout": "fsdp"},
    "fsdp2-hf-fake8-ckpt2": {"layout": "fsdp", "checkpointing": True, "checkpoint_every": 2},
    "ddp-hf": {"layout": "ddp"},
    "fsdp2-hf-lora": {"layout": "fsdp", "lora_rank": LORA_RANK, "lora_targets": ("q", "v")},
    "tp-hf": {"layout": "tp=2"},
    "zero2-hf": {"layout": "zero2"},
}
"""Case -> what ``estimate`` is told besides the config and the batch (``--layout``,
``--lora-rank``, ``--lora-targets``)."""


@pytest.mark.parametrize("name", sorted(PLANS))
def test_the_plan_from_the_config_holds_against_each_ranks_truth(name: str) -> None:
    case = CASES[name]
    if case["layout"] == "zero":
        pytest.importorskip("deepspeed")
    plan = Plan(
        SHAPE,
        batch=HF_BATCH,
        seq=HF_SEQ,
        precision="fp32",  # the case trains in fp32, AdamW's CPU default (for-loop)
        impl="for-loop",
        world=case["world"],
        device="cpu",
        **PLANS[name],
    )
    pred = rank_estimate(plan).prediction
    bad, rows = [], 0
    for result in run_case(name, steps=2):
        for key, truth in result["truth"].items():
            step, _, phase = key.partition(":")
            pm = pred.phases.get((phase, step == "1"))
            if pm is None:
                continue
            rows += 1
            got = total(pm.peak)
            print(f"{name} rank {result['rank']} step {step} {phase}: {got / truth:.3f}")
            if abs(got - truth) > TOLERANCE * truth:
                bad.append(f"rank {result['rank']} step {step} {phase}: {got / truth:.3f}")
    assert rows >= 8
    assert not bad, f"{name}: " + "; ".join(bad)
