"""Each rank's predicted peak per phase against that rank's truth (issue 26), on the CPU.

Every case trains the 12-block MLP of ``ranks_cases`` with AdamW for two steps as real
ranks (gloo, spawned processes) or as rank 0 of an 8-rank job (the fake process group),
with ``gpuwatch.watch`` describing it; the truth is torch.profiler's allocator events
(``profmem``). Target: every phase of every step on every rank within 10%.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ranks_cases import BLOCKS, DIM, LORA_RANK, run_case, table  # noqa: E402

from gpuwatch.predict import predict  # noqa: E402

pytestmark = pytest.mark.torch

TOLERANCE = 0.10


PHASES = {"forward", "backward", "clip", "optimizer.step", "zero_grad"}
ZERO_PHASES = {"forward", "backward", "optimizer.step"}  # engine.step clips and zeroes


def _check(name: str, phases_expected: set[str] = PHASES) -> list[dict]:
    results = run_case(name, steps=2)  # the first step and a steady one
    bad = []
    for r in results:
        rows = table(r)
        phases = {p for _, p, _, _ in rows}
        assert phases == phases_expected
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
    # At the loss the root's parameters (embedding, norm, LM head) are unsharded, and the
    # last layer's all-gather output is still alive: it is freed only when the root's
    # forward ends, after a loss computed inside the model.
    expected = units[0]["unsharded_bytes"] + units[-1]["unsharded_bytes"]
    assert p.phases["forward", False].peak["fsdp_unsharded"] == expected


def test_fsdp2_lora_reduces_only_the_adapters() -> None:
    """A LoRA unit gathers its frozen base but reduce-scatters only the adapters' gradients
    (issue 39, item 1: the frozen parameters were counted as gradients to reduce)."""
    results = _check("fsdp2-lora")
    for r in results:
        p = predict(r["facts"])
        trainable = r["facts"]["params"]["trainable_bytes"]
        for first in (True, False):
            bd = p.phases["backward", first].peak
            assert bd.get("gradients", 0) <= trainable
            # At most two units' unsharded adapter gradients (this one and the previous
            # one's reduce-scatter input), never a unit's frozen base.
            unit = r["facts"]["parallel"]["fsdp"]["unit_list"][1]
            assert bd.get("fsdp_reduce", 0) <= 2 * unit["trainable_unsharded_bytes"]


def test_fsdp2_lora_one_rank_of_eight() -> None:
    (result,) = _check("fsdp2-lora-fake8")
    units = result["facts"]["parallel"]["fsdp"]["unit_list"]
    lora = 2 * LORA_RANK * DIM * 4  # lora_a and lora_b, fp32
    assert all(u["trainable_unsharded_bytes"] == lora for u in units if u["name"] != "(root)")


def test_fsdp2_one_unit_of_several_modules() -> None:
    """``fully_shard([model.norm, model.output])`` is one unit (issue 39, item 2: it was
    listed once per module)."""
    results = _check("fsdp2-shared-unit")
    for r in results:
        fsdp = r["facts"]["parallel"]["fsdp"]
        names = [u["name"] for u in fsdp["unit_list"]]
        # The blocks and norm+output; the root holds no parameters of its own: no unit.
        assert fsdp["units"] == len(names) == BLOCKS + 1
        assert names.count("norm") == 1 and "output" not in names
        params = BLOCKS * 2 * (DIM * DIM + DIM) + 2 * DIM + DIM * DIM + DIM
        assert sum(u["unsharded_bytes"] for u in fsdp["unit_list"]) == 4 * params


@pytest.mark.parametrize("name", ["fsdp1", "fsdp1-grad-op"])
def test_fsdp1_two_ranks(name: str) -> None:
    """FSDP1's flat parameters (in torch 2.13 a plain ``Parameter`` marked
    ``_is_flat_param``) are found, the forward's peak is not measured over them, and
    FULL_SHARD and SHARD_GRAD_OP are predicted as units (issue 39, item 3)."""
    results = _check(name)
    for r in results:
        fsdp = r["facts"]["parallel"]["fsdp"]
        assert fsdp["version"] == 1 and fsdp["units"] == len(fsdp["unit_list"]) == BLOCKS
        assert "forward_peak" not in r["facts"]["activations"]  # sharded: not measured
        p = predict(r["facts"])
        assert p.layout.modelled and not any("not modelled" in n for n in p.notes)
        assert r["unsettled"] == 0


def test_zero2_two_ranks() -> None:
    pytest.importorskip("deepspeed")
    results = _check("zero2", ZERO_PHASES)
    for r in results:
        zero = r["facts"]["parallel"]["zero"]
        assert r["facts"]["parallel"]["strategy"] == "zero"
        assert zero["stage"] == 2 and zero["partition_count"] == 2
        assert zero["reduce_bucket_size"] == zero["allgather_bucket_size"] == 1 << 20
        # This rank's fp32 master partition: half of the 25.2 M parameters (padded).
        whole = 4 * BLOCKS * 2 * (DIM * DIM + DIM)
        assert whole // 2 <= zero["master_bytes"] < whole // 2 + 4096
        p = predict(r["facts"])
        assert p.layout.modelled
        assert p.phases["backward", False].peak["zero_buckets"] == 4 << 20


def test_zero2_overlap_comm_two_ranks() -> None:
    pytest.importorskip("deepspeed")
    (r, _) = _check("zero2-overlap", ZERO_PHASES)
    assert r["facts"]["parallel"]["zero"]["overlap_comm"] is True


def test_zero1_two_ranks() -> None:
    """ZeRO-1's gradient copy (``grads_in_partition``) is made at the backward's end, at
    the reduction of this rank's first parameter: on rank 0 while every gradient but the
    first bucket's is still whole, on rank 1 after its first half is freed (issue 39,
    item 6: rank 0's backward read 0.85)."""
    pytest.importorskip("deepspeed")
    results = _check("zero1", ZERO_PHASES)
    whole = 4 * BLOCKS * 2 * (DIM * DIM + DIM)  # fp32 gradients, bytes
    for r in results:
        zero = r["facts"]["parallel"]["zero"]
        # The first block's weight and bias are both in rank 0's partition; rank 1's
        # begins with the gradients of the first half (weights and biases, no padding).
        assert zero["grads_before_partition"] == r["rank"] * whole // 8
        assert whole // 2 <= 4 * zero["grads_in_partition_numel"] < whole // 2 + whole // 24
        bd = predict(r["facts"]).phases["backward", False].peak
        if r["rank"] == 0:  # the copy less the first bucket: 1M elements, fp32
            assert bd["gradients"] == whole + 4 * zero["grads_in_partition_numel"] - (4 << 20)
        else:
            assert bd["gradients"] == whole


def test_zero3_two_ranks() -> None:
    """ZeRO-3 on two ranks within 10% (issue 39, item 6: 0.55-0.90 of the truth): the
    parameters stay gathered from their forward to their backward under DeepSpeed's
    default reuse distance, and the step flattens the gradient partition into a new fp32
    tensor beside the buffer it was reduced into. The all-gathers' flat buffers do not
    stay: the truth read a few of them high at random while gloo's thread freed them
    unseen (profmem.settle_collectives). Modelled: no note."""
    pytest.importorskip("deepspeed")
    whole = 4 * BLOCKS * 2 * (DIM * DIM + DIM)  # the 25.2 M parameters, fp32
    for r in _check("zero3", ZERO_PHASES):
        facts = r["facts"]
        zero = facts["parallel"]["zero"]
        assert zero["stage"] == 3 and zero["partition_count"] == 2
        assert zero["unsharded_bytes"] == whole  # ds_numel: what an all-gather makes
        assert zero["stage3_max_reuse_distance"] == 10**9  # DeepSpeed's default
        # The weights are this rank's partitions (and the persistent parameters), never
        # the global numel.
        assert facts["params"]["bytes"] < whole // 2 + zero["persistent_bytes"] + 4096
        assert facts["optimizer"]["groups"], "the fp32 partitions the optimizer steps"
        # Listed in the optimizer's groups only during its step: torch's for-loop on the CPU.
        assert facts["optimizer"]["impl"] == "for-loop"
        assert "forward_peak" not in facts["activations"]  # gathered buffers: not measured
        p = predict(facts)
        gathered = whole - zero["persistent_bytes"]
        assert p.phases["forward", False].peak["zero_gathered"] == gathered
        step = p.phases["optimizer.step", False].peak
        assert step["gradients"] == zero["grad_partition_bytes"] + 4 * zero["partition_numel"]
        assert p.layout.modelled and not any("not modelled" in n for n in p.notes)
