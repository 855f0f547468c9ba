"""The layout's part of the prediction from ``parallel`` facts, hand-made and hostile."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpuwatch.predict import predict, total

MIB = 2**20
KEYS = [
    "strategy", "ddp", "fsdp", "unit_list", "units", "unsharded_bytes", "sharded_bytes",
    "reshard_after_forward", "param_dtype", "reduce_dtype", "gradient_as_bucket_view",
    "cpu_offload", "mesh_size",
]  # fmt: skip
values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.sampled_from(["ddp", "fsdp2", "fsdp1", "tp", "bfloat16", "float32"])
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
