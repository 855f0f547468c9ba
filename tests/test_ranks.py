"""Each rank's predicted peak per phase against that rank's truth (issue 26), on the CPU.

Every case trains the 12-block MLP of ``ranks_cases`` with AdamW for two steps as real
ranks (gloo, spawned processes) or as rank 0 of an 8-rank job (the fake process group),
with ``gpuwatch.watch`` describing it; the truth is torch.profiler's allocator events
(``profmem``). Target: every phase of every step on every rank within 10%.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ranks_cases import BLOCKS, DIM, run_case, table  # noqa: E402

from gpuwatch.predict import predict  # noqa: E402

pytestmark = pytest.mark.torch

TOLERANCE = 0.10


def _check(name: str) -> list[dict]:
    results = run_case(name, steps=2)  # the first step and a steady one
    bad = []
    for r in results:
        rows = table(r)
        phases = {p for _, p, _, _ in rows}
        assert phases == {"forward", "backward", "clip", "optimizer.step", "zero_grad"}
        for step, phase, truth, pred in rows:
            if abs(pred - truth) > TOLERANCE * truth:
                bad.append(f"rank {r['rank']} step {step} {phase}: {pred / truth:.2f} of the truth")
    assert not bad, f"{name}: " + "; ".join(bad)
    return results


def test_ddp_two_ranks() -> None:
    results = _check("ddp")
    p = predict(results[0]["facts"])
    assert p.layout.strategy == "ddp" and p.layout.modelled
    # A second copy of the gradients, alive from the wrapper's construction on.
    bd = p.phases["forward", True].peak
    assert bd["ddp_buckets"] == results[0]["facts"]["params"]["trainable_bytes"]


def test_ddp_gradient_as_bucket_view() -> None:
    results = _check("ddp-view")
    bd = predict(results[0]["facts"]).phases["backward", False].peak
    assert bd["gradients"] == 0 and bd["ddp_buckets"] > 0  # the gradients are the buckets


def test_fsdp2_two_ranks() -> None:
    results = _check("fsdp2")
    for r in results:
        facts = r["facts"]
        assert facts["parallel"]["fsdp"]["mesh_size"] == 2
        assert "skipped" not in facts["activations"]


def test_fsdp2_without_reshard_after_forward() -> None:
    _check("fsdp2-noreshard")


def test_fsdp2_one_rank_of_eight() -> None:
    (result,) = _check("fsdp2-fake8")
    p = predict(result["facts"])
    # AdamW's two states of this rank's shards (an eighth), and a step scalar per tensor.
    shards = result["facts"]["params"]["bytes"]
    params = BLOCKS * 2 * (DIM * DIM + DIM)
    assert shards == 4 * params // 8  # fp32
    state = p.phases["optimizer.step", False].peak["optimizer_state"]
    assert state == 2 * shards + 4 * BLOCKS * 4  # a step per weight and bias


def test_fsdp2_hugging_face_causal_lm() -> None:
    pytest.importorskip("transformers")
    results = _check("fsdp2-hf")
    units = results[0]["facts"]["parallel"]["fsdp"]["unit_list"]
    # fully_shard's own policy: the root keeps its parameters from forward to backward,
    # the decoder layers reshard.
    assert units[0]["name"] == "(root)" and units[0]["reshard_after_forward"] is False
    assert all(u["reshard_after_forward"] for u in units[1:])
    p = predict(results[0]["facts"])
    # At the loss the root's parameters (embedding, norm, LM head) are unsharded.
    assert p.phases["forward", False].peak["fsdp_unsharded"] == units[0]["unsharded_bytes"]
