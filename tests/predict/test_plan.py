"""Planning a run before it exists: one rank's facts under a layout, and the answer.

The published figures hold to the byte (ZeRO's table of model states per GPU, Megatron's
per-layer activations under tensor parallelism), each rank's facts go through the live
predictor, and every change the answer proposes is predicted as a run of its own.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuwatch.predict import (
    Plan,
    answer,
    max_batch,
    parse_gpus,
    parse_layout,
    parse_lora_targets,
    predict,
    rank_estimate,
)
from gpuwatch.predict._gpus import GIB, GPUS
from gpuwatch.predict._shape import ModelShape

STATES = ("weights", "gradients", "optimizer_state", "zero_master")

# Rajbhandari et al. 2020 ("ZeRO"), Table 1: model states per GPU in GB for a 7.5 B
# parameter model trained with mixed-precision Adam (K = 12), by data-parallel degree:
# baseline, P_os (stage 1), P_os+g (stage 2), P_os+g+p (stage 3).
ZERO_TABLE = {
    1: (120, 120, 120, 120),
    4: (120, 52.5, 41.3, 30),
    16: (120, 35.6, 21.6, 7.5),
    64: (120, 31.4, 16.6, 1.88),
    256: (120, 30.4, 15.4, 0.47),
    1024: (120, 30.1, 15.1, 0.12),
}

LLAMA = ModelShape(
    layers=8, hidden=512, heads=8, vocab=8000, arch="llama", kv_heads=4, intermediate=1376
)


def _states(plan: Plan) -> float:
    """The most model states a rank holds in any steady phase, in GB (the paper's unit)."""
    p = rank_estimate(plan).prediction
    return (
        max(
            sum(pm.peak.get(c, 0) for c in STATES)
            for (_, first), pm in p.phases.items()
            if not first
        )
        / 1e9
    )


@pytest.mark.parametrize("n", sorted(ZERO_TABLE))
def test_model_states_per_gpu_as_the_zero_paper_tabulates_them(n: int) -> None:
    plan = Plan(None, params=7_500_000_000, optimizer="adam")
    baseline, os_, os_g, os_g_p = ZERO_TABLE[n]
    assert _states(replace(plan, layout="ddp" if n > 1 else "none", world=n)) == baseline
    # DeepSpeed's stage 1 beyond the table: rank 0 copies its gradient partition (bf16)
    # at the backward's end while all but the first bucket's gradients are still whole.
    # Stage 3's step flattens the gradient partition into an fp32 tensor beside its buffer.
    part = -(-7_500_000_000 // n)
    copy, step = max(part - 500_000_000, 0) * 2 / 1e9, part * 4 / 1e9
    for layout, published in (("zero1", os_ + copy), ("zero2", os_g), ("zero3", os_g_p + step)):
        got = _states(replace(plan, layout=layout, world=n))
        assert got == pytest.approx(published, abs=0.051), layout  # the table's rounding


def test_sixteen_bytes_a_parameter_on_one_gpu() -> None:
    plan = Plan(LLAMA, batch=1, seq=128, optimizer="adam")  # step scalars on the host
    count = rank_estimate(plan).facts["params"]["count"]
    assert round(_states(plan) * 1e9) == 16 * count


def test_fsdp_divides_every_state_and_gathers_one_layer_at_a_time() -> None:
    one = rank_estimate(Plan(LLAMA, batch=2, seq=128))
    four = rank_estimate(Plan(LLAMA, batch=2, seq=128, layout="fsdp", world=4))
    p1, p4 = one.facts["params"], four.facts["params"]
    assert p4["bytes"] == -(-p1["bytes"] // 4)
    fsdp = four.facts["parallel"]["fsdp"]
    assert fsdp["units"] == LLAMA.layers + 1  # every layer and the root
    assert sum(u["unsharded_bytes"] for u in fsdp["unit_list"]) == p1["bytes"]
    assert four.prediction.layout.strategy == "fsdp2" and four.prediction.layout.modelled
    step = four.prediction.phases["optimizer.step", False].peak
    assert step["gradients"] == -(-p1["trainable_bytes"] // 4)
    fwd = four.prediction.phases["forward", False].peak
    assert 0 < fwd["fsdp_unsharded"] < p1["bytes"]
    # Without resharding after forward every layer stays gathered into backward.
    kept = rank_estimate(replace(Plan(LLAMA, batch=2, seq=128), layout="fsdp-no-reshard", world=4))
    assert kept.prediction.phases["forward", False].peak["fsdp_unsharded"] > fwd["fsdp_unsharded"]


def test_fsdp_with_lora_reduces_only_the_adapters() -> None:
    """A LoRA unit gathers its frozen base but reduce-scatters only the adapters' gradients
    (issue 39's live rule): the planned units carry their trainable share."""
    plan = Plan(LLAMA, batch=2, seq=128, layout="fsdp", world=4)
    whole = rank_estimate(plan).prediction
    full = whole.phases["backward", False].peak
    lora = rank_estimate(replace(plan, lora_rank=8))
    units = lora.facts["parallel"]["fsdp"]["unit_list"]
    trainable = lora.facts["params"]["trainable_bytes"] * 4  # unsharded, every rank's
    assert 0 < sum(u["trainable_unsharded_bytes"] for u in units) <= trainable + len(units) * 4
    bwd = lora.prediction.phases["backward", False].peak
    assert bwd["fsdp_reduce"] < full["fsdp_reduce"] / 20
    # The base is still gathered, unit by unit, as the whole model's is.
    gathered = [w[2] for w in lora.prediction.layout.backward_units]
    plain = [w[2] for w in whole.layout.backward_units]
    assert all(a >= b > 0 for a, b in zip(gathered, plain, strict=True))


def test_ddp_keeps_a_second_copy_of_the_gradients() -> None:
    r = rank_estimate(Plan(LLAMA, batch=2, seq=128, layout="ddp", world=8))
    fwd = r.prediction.phases["forward", False].peak
    assert fwd["ddp_buckets"] == r.facts["params"]["trainable_bytes"]


def test_tensor_parallel_activations_are_megatrons() -> None:
    # Korthikanti et al. 2022, eq. 2: with tensor parallelism of degree t (no sequence
    # parallelism) a layer keeps s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes at 16 bits.
    b, s, h, a, t = 2, 256, 1024, 16, 4

    def per_layer(layout: str) -> int:
        saved = []
        for layers in (1, 2):
            shape = ModelShape(layers=layers, hidden=h, heads=a, vocab=8192, arch="gpt")
            plan = Plan(
                shape, batch=b, seq=s, precision="fp16", attention="eager", layout=layout, world=t
            )
            plan = replace(plan, dropout={"attn": 0.1, "resid": 0.1})
            saved.append(rank_estimate(plan).prediction.activations_formula or 0)
        return saved[1] - saved[0]

    stats = 2 * 2 * s * b * 4  # LayerNorm's mean and rstd (fp32), outside the paper's count
    sbh = s * b * h
    assert per_layer("none") == sbh * (34 + 5 * a * s / h) + stats
    assert per_layer(f"tp={t}") == sbh * (10 + 24 / t + 5 * a * s / (h * t)) + stats


def test_tensor_parallel_divides_the_matrices_not_the_norms() -> None:
    r = rank_estimate(Plan(LLAMA, batch=1, seq=128, precision="fp32", layout="tp=2", world=2))
    tensors = LLAMA.tensors(128)
    matrices = sum(x * y for x, y in (t for t in tensors if len(t) == 2))
    vectors = sum(t[0] for t in tensors if len(t) == 1)
    assert r.facts["params"]["count"] == matrices // 2 + vectors
    with pytest.raises(ValueError, match="kv heads 4 is not a multiple of 8"):
        rank_estimate(Plan(LLAMA, batch=1, seq=128, layout="tp=8", world=8))


def test_offload_moves_the_optimizer_to_the_host() -> None:
    plan = Plan(LLAMA, batch=1, seq=128, layout="zero3", world=4)
    on = rank_estimate(plan)
    off = rank_estimate(replace(plan, offload=True))
    step = on.prediction.phases["optimizer.step", False].peak
    assert off.host_bytes == step["optimizer_state"] + step["zero_master"]
    assert off.peak_bytes < on.peak_bytes
    with pytest.raises(ValueError, match="--offload needs"):
        rank_estimate(replace(plan, layout="ddp", offload=True))


def test_device_map_plans_a_share_of_the_layers() -> None:
    whole = rank_estimate(Plan(LLAMA, batch=1, seq=128))
    half = rank_estimate(Plan(LLAMA, batch=1, seq=128, layout="device-map", world=2))
    assert half.facts["transformer"]["layers"] == LLAMA.layers // 2
    assert half.peak_bytes < whole.peak_bytes


def test_lora_targets_add_an_adapter_per_role() -> None:
    base = dict(batch=1, seq=128, lora_rank=8)
    qv = rank_estimate(Plan(LLAMA, **base)).facts["params"]["trainable_count"]
    allr = parse_lora_targets("q,k,v,o,mlp")
    every = rank_estimate(Plan(LLAMA, lora_targets=allr, **base)).facts["params"]
    h, f, kv, r, n = 512, 1376, 256, 8, LLAMA.layers
    assert qv == n * r * ((h + h) + (h + kv))
    per = (h + h) + 2 * (h + kv) + (h + h) + 3 * (h + f)
    assert every["trainable_count"] == n * r * per
    with pytest.raises(ValueError, match="unknown 'qq'"):
        parse_lora_targets("q,qq")


def test_the_largest_micro_batch_is_the_boundary() -> None:
    plan = Plan(LLAMA, batch=1, seq=512)
    usable = 2 * GIB
    most = max_batch(plan, usable)
    assert most and most > 1
    assert rank_estimate(replace(plan, batch=most)).peak_bytes <= usable
    assert rank_estimate(replace(plan, batch=most + 1)).peak_bytes > usable


def test_an_answer_that_does_not_fit_offers_changes_that_do() -> None:
    plan = Plan(LLAMA, batch=64, seq=512, layout="ddp", world=4)
    usable = 9 * GIB // 2
    ans = answer(plan, usable, "T4")
    assert not ans.fits and ans.headroom < 0
    assert ans.phase == ans.estimate.prediction.peak_phase
    assert ans.changes and all(c.peak_bytes <= usable for c in ans.changes)
    orders = [c.order for c in ans.changes]
    assert orders == sorted(orders)  # cheapest first
    for c in ans.changes:  # each predicted as a run of its own
        assert rank_estimate(c.plan).peak_bytes == c.peak_bytes
        assert c.cost
    names = [c.what for c in ans.changes]
    assert any("checkpointing" in n for n in names)
    assert any("micro-batch" in n for n in names)


def test_an_answer_that_fits_says_how_much_is_left() -> None:
    plan = Plan(LLAMA, batch=1, seq=128)
    ans = answer(plan, 80 * GIB)
    assert ans.fits and ans.headroom == 80 * GIB - ans.estimate.peak_bytes and not ans.changes


def test_gpus_by_name_or_size() -> None:
    assert parse_gpus("4xA100-80GB").total == GPUS["A100-80GB"] == 80 * GIB
    assert parse_gpus("8 x h100 80gb").count == 8
    g = parse_gpus("2x24GiB")
    assert (g.count, g.total) == (2, 24 * GIB)
    assert parse_gpus("L4").count == 1
    assert parse_gpus("4x80GiB").usable(GIB) == 79 * GIB
    for bad in ("4xB9000", "0xA100-80GB", "x"):
        with pytest.raises(ValueError, match="--gpus"):
            parse_gpus(bad)


def test_layouts_are_normalised_or_refused() -> None:
    assert parse_layout("ZeRO-3") == "zero3"
    assert parse_layout("tp=4") == "tp=4"
    assert parse_layout("fsdp2") == "fsdp"
    for bad in ("tp=1", "tp=x", "pipeline"):
        with pytest.raises(ValueError, match="--layout"):
            parse_layout(bad)


def test_predict_is_the_live_one() -> None:
    r = rank_estimate(Plan(LLAMA, batch=2, seq=128, layout="zero2", world=4))
    assert predict(r.facts).peak_bytes == r.peak_bytes  # the facts alone say it all


def test_qlora_keeps_the_layers_weights_in_four_bits() -> None:
    from gpuwatch.predict._plan import nf4_bytes

    # QLoRA (Dettmers et al. 2023, section 3): 0.5 bytes a weight, plus 8-bit constants
    # per 64 weights and an fp32 one per 256 of those: 0.127 bits a weight.
    n = 64 * 256 * 1000
    assert nf4_bytes(n, 1) - (256 + 16) * 4 == n // 2 + n // 64 + 4 * 1000
    assert 8 * (n // 64 + 4 * 1000) / n == pytest.approx(0.127, abs=1e-3)
    plan = Plan(LLAMA, batch=1, seq=128, lora_rank=8)
    q = rank_estimate(replace(plan, quant="nf4"))
    groups = q.facts["params"]["groups"]
    four = next(g for g in groups if g["dtype"] == "uint8")
    layer = 512 * 512 * 2 + 256 * 512 * 2 + 3 * 512 * 1376  # q, o, k, v, gate, up, down
    assert four["count"] == LLAMA.layers * layer and not four["trainable"]
    weights = q.prediction.phases["forward", False].peak["weights"]
    assert weights == sum(g["bytes"] for g in groups)
    bf16 = rank_estimate(replace(plan, precision="bf16")).facts["params"]["bytes"]
    assert weights == bf16 - 2 * four["count"] + four["bytes"]
    # The activations are bf16's, as bitsandbytes computes in its compute dtype.
    assert (
        q.prediction.activations_formula
        == rank_estimate(replace(plan, precision="bf16")).prediction.activations_formula
    )
    with pytest.raises(ValueError, match="--qlora"):
        rank_estimate(replace(plan, quant="nf4", lora_rank=0))


@pytest.mark.parametrize(
    "layout", ["ddp", "fsdp", "fsdp-no-reshard", "zero1", "zero2", "zero3", "tp=2", "device-map"]
)
def test_planned_facts_are_the_typed_facts_the_live_side_sends(layout: str) -> None:
    from pathlib import Path

    import gpuwatch.facts as F

    facts = rank_estimate(Plan(LLAMA, batch=1, seq=64, lora_rank=4, layout=layout, world=4)).facts
    assert set(facts) <= set(F.Facts.__annotations__)
    assert set(facts["params"]) <= set(F.ParamFacts.__annotations__)
    for g in facts["params"]["groups"]:
        assert set(g) <= set(F.TensorGroup.__annotations__)
    for b in facts["optimizer"]["groups"]:
        assert set(b) <= set(F.OptimizerBucket.__annotations__)
    par = facts.get("parallel", {})
    assert set(par) <= set(F.ParallelFacts.__annotations__)
    # Each layout's own fields are the ones docs/facts.md says instrument/_layout.py reads.
    docs = (Path(__file__).parents[2] / "docs" / "facts.md").read_text()
    for part in ("ddp", "fsdp", "zero", "dtensor"):
        for key in par.get(part, {}):
            assert f"`{key}`" in docs, f"{part}.{key}"
