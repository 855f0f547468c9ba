"""The layout's part of the prediction from ``parallel`` facts, hand-made and hostile."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpuwatch.predict import predict, total

MIB = 2**20
KEYS = [
    "strategy", "ddp", "fsdp", "unit_list", "units", "unsharded_bytes", "sharded_bytes",
    "reshard_after_forward", "param_dtype", "reduce_dtype", "gradient_as_bucket_view",
    "cpu_offload", "mesh_size", "zero", "stage", "partition_numel", "master_bytes",
    "reduce_bucket_size", "overlap_comm", "contiguous_gradients", "dtype",
    "grad_partition_bytes", "persistent_bytes", "stage3_max_live_parameters",
    "stage3_prefetch_bucket_size", "offload_optimizer", "offload_param",
    "stage3_max_reuse_distance", "largest_param_bytes", "grads_before_partition",
    "grads_in_partition_numel",
]  # fmt: skip
values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.sampled_from(["ddp", "fsdp2", "fsdp1", "zero", "tp", "bfloat16", "float32", "cpu"])
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.sampled_from(KEYS), inner),
    max_leaves=30,
)


def _facts(parallel: object) -> dict:
    return {
        "params": {"bytes": 64 * MIB, "trainable_bytes": 64 * MIB},
        "optimizer": {"class": "AdamW", "impl": "for-loop", "groups": []},
        "parallel": parallel,
    }


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS), values, max_size=6))
@example({"strategy": "fsdp2", "fsdp": {"unit_list": [{"unsharded_bytes": 1}] * 100_000}})
@example({"strategy": "fsdp2", "fsdp": {"param_dtype": [], "unit_list": [{}]}})
@example({"strategy": "zero", "zero": {"stage": 3, "reduce_bucket_size": 2**53, "dtype": []}})
@example({"strategy": "zero", "zero": {"stage": True, "partition_numel": -1}})
def test_any_parallel_facts_predict_or_say_why(parallel: dict) -> None:
    p = predict(_facts(parallel))
    assert all(total(pm.peak) >= 0 for pm in p.phases.values())


def test_ddp_buckets_are_a_second_copy_of_the_gradients() -> None:
    p = predict(_facts({"strategy": "ddp", "ddp": {"gradient_as_bucket_view": False}}))
    for pm in p.phases.values():
        assert pm.start["ddp_buckets"] == pm.peak["ddp_buckets"] == 64 * MIB
    assert p.phases["backward", False].end["gradients"] == 64 * MIB
    view = predict(_facts({"strategy": "ddp", "ddp": {"gradient_as_bucket_view": True}}))
    assert view.phases["backward", False].end["gradients"] == 0


def test_fsdp2_units_in_forward_and_backward() -> None:
    units = [{"unsharded_bytes": u * MIB, "sharded_bytes": u * MIB // 4} for u in (8, 16, 8)]
    fsdp = {"units": 3, "unit_list": units, "param_dtype": "bfloat16", "reduce_dtype": "float32"}
    p = predict(_facts({"strategy": "fsdp2", "fsdp": fsdp}))
    # Forward at unit 1: unit 0's all-gather output, unit 1's and its parameters.
    assert p.phases["forward", False].peak["fsdp_unsharded"] == (8 + 2 * 16) * MIB
    back = p.phases["backward", False].peak
    # At unit 1 in backward: its parameters and unit 0's prefetch; its gradients and
    # unit 2's reduce-scatter input, in fp32 (twice the bf16 unit).
    assert back["fsdp_unsharded"] == (16 + 8) * MIB
    assert back["fsdp_reduce"] == 2 * (16 + 8) * MIB
    assert p.layout.modelled and all("not modelled" not in n for n in p.notes)


def test_fsdp2_over_gloo_holds_the_prefetch_twice_in_backward() -> None:
    """Gloo's all-gather allocates a flat output of its own as the prefetch is issued: at
    a LoRA unit's backward (no gradients to speak of) the unit, and the prefetched unit
    twice (issue 52: the LoRA MLP under FSDP2 read 0.90 of the truth without it)."""
    units = [
        {"unsharded_bytes": 8 * MIB, "sharded_bytes": 4 * MIB, "trainable_unsharded_bytes": 0}
    ] * 3
    fsdp = {"units": 3, "unit_list": units}
    for backend, prefetched in (("gloo", 2), ("nccl", 1), ("fake", 1), (None, 1)):
        p = predict(_facts({"strategy": "fsdp2", "fsdp": dict(fsdp, backend=backend)}))
        # Each unit's backward moment: (share of activations, shards done, gathered, reduce).
        gathered = [w[2] for w in p.layout.backward_units]
        assert gathered == [(8 + prefetched * 8) * MIB] * 2 + [8 * MIB], backend


def test_a_layout_not_modelled_says_so_in_one_line() -> None:
    p = predict(_facts({"strategy": "fsdp1", "fsdp": {"version": 1}}))
    assert not p.layout.modelled
    assert sum("not modelled" in n for n in p.notes) == 1


def test_clip_phase_is_what_backward_left_and_the_norms() -> None:
    facts = _facts({"strategy": "ddp", "ddp": {}})
    facts["params"]["groups"] = [
        {"dtype": "float32", "device": "cuda:0", "trainable": True, "tensors": 200},
        {"dtype": "float32", "device": "cuda:0", "trainable": False, "tensors": 50},
    ]
    p = predict(facts)
    clip = p.phases["clip", False]
    # 200 norms and the total norm and coefficient, a 512-byte block each; their stack.
    assert clip.peak["temporaries"] == 200 * 512 + 2 * 512 + 1024
    assert clip.start["gradients"] == clip.end["gradients"] == 64 * MIB
    assert clip.peak["ddp_buckets"] == 64 * MIB
    step = p.phases["optimizer.step", False]
    assert clip.end["optimizer_state"] == step.start["optimizer_state"]


def _zero(stage: int, **extra: object) -> dict:
    """ZeRO facts as ``_layout`` reads them from a 2-rank engine of a 64 MiB fp32 model."""
    zero = {
        "stage": stage,
        "partition_count": 2,
        "reduce_bucket_size": 1 << 20,
        "contiguous_gradients": True,
        "overlap_comm": False,
        "dtype": "float32",
        "master_bytes": 32 * MIB,
        "partition_numel": 8 * MIB,  # 32 MiB of fp32
        **extra,
    }
    return _facts({"strategy": "zero", "zero": zero})


def test_zero2_master_buckets_and_gradient_partition() -> None:
    p = predict(_zero(2))
    assert p.layout.strategy == "zero" and p.layout.modelled
    for pm in p.phases.values():
        assert pm.start["zero_master"] == pm.peak["zero_master"] == 32 * MIB
    back = p.phases["backward", False]
    # The bucket while backward runs; the gradients reduced into the partition as it goes.
    assert back.peak["zero_buckets"] == 4 * MIB and back.end["zero_buckets"] == 0
    assert back.peak["gradients"] <= 32 * MIB and back.end["gradients"] == 32 * MIB
    step = p.phases["optimizer.step", False]
    assert step.peak["gradients"] == 32 * MIB and step.end["gradients"] == 0
    assert p.phases["forward", False].peak["gradients"] == 0
    overlap = predict(_zero(2, overlap_comm=True)).phases["backward", False].peak
    assert overlap["zero_buckets"] == 8 * MIB  # two buffers to overlap the reduction


def test_zero1_keeps_the_whole_gradients_through_backward() -> None:
    facts = _zero(1, grads_before_partition=8 * MIB, grads_in_partition_numel=8 * MIB)
    facts["parallel"]["rank"] = 1
    back = predict(facts).phases["backward", False]
    assert back.peak["gradients"] == 64 * MIB  # the model's own .grad until the epilogue
    assert back.end["gradients"] == 32 * MIB
    # Rank 0's partition comes first: its copy is made once the first bucket's gradients
    # (1 Mi elements) are freed, the rest still whole.
    facts["parallel"]["rank"], facts["parallel"]["zero"]["grads_before_partition"] = 0, 0
    assert predict(facts).phases["backward", False].peak["gradients"] == (64 + 32 - 4) * MIB
    # Facts without where the partition starts: the rank's place among equal partitions.
    del facts["parallel"]["zero"]["grads_before_partition"]
    assert predict(facts).phases["backward", False].peak["gradients"] == (64 + 32 - 4) * MIB
    facts["parallel"]["rank"] = 1
    assert predict(facts).phases["backward", False].peak["gradients"] == 64 * MIB


def test_zero3_gathered_parameters_are_bounded() -> None:
    facts = _zero(
        3,
        grad_partition_bytes=32 * MIB,
        unsharded_bytes=64 * MIB,
        persistent_bytes=MIB,
        stage3_max_live_parameters=2 * MIB,
        stage3_prefetch_bucket_size=MIB,
        stage3_max_reuse_distance=0,
        largest_param_bytes=2 * MIB,
    )
    zero = facts["parallel"]["zero"]
    p = predict(facts)
    fwd = p.phases["forward", False].peak
    assert fwd["zero_gathered"] == 12 * MIB  # nothing reused: (2 Mi + 1 Mi) fp32 elements
    assert fwd["gradients"] == 32 * MIB  # the flat partition, made at construction
    assert fwd["zero_buckets"] == 4 * MIB
    # Reused within 8 Mi elements: the model's last 4 Mi kept, and the module running.
    zero["stage3_max_reuse_distance"] = 8 * MIB
    assert predict(facts).phases["forward", False].peak["zero_gathered"] == 18 * MIB
    # DeepSpeed's default distance (1e9), or live parameters beyond the model: never more
    # than the model less its persistent parameters (already in the weights).
    del zero["stage3_max_reuse_distance"]
    assert predict(facts).phases["forward", False].peak["zero_gathered"] == 63 * MIB
    zero["stage3_max_reuse_distance"], zero["stage3_max_live_parameters"] = 0, 10**9
    assert predict(facts).phases["forward", False].peak["zero_gathered"] == 63 * MIB


def test_zero_offload_is_named_not_modelled() -> None:
    p = predict(_zero(2, offload_optimizer="cpu"))
    assert not p.layout.modelled
    assert sum("offload not modelled" in n for n in p.notes) == 1
