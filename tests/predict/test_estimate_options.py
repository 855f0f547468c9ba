"""``gpuwatch estimate``'s options as predict/ takes them (issue 52's config route).

Each option is checked where it lands: the facts the plan builds, the prediction, what
the answer says it assumed, and the verdict it can back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import run_gpuwatch

from gpuwatch.notebook import plan as notebook_plan
from gpuwatch.predict import (
    EstimateError,
    ModelShape,
    Options,
    Plan,
    estimate,
    options_from_keywords,
    rank_estimate,
    table,
)
from gpuwatch.predict._plan import parse_fsdp_units

SHAPE = dict(layers=4, hidden=256, heads=4, vocab=8192, arch="llama", kv_heads=2)
LLAMA = ModelShape(**SHAPE, intermediate=688, tied=False, max_positions=128)  # type: ignore[arg-type]


def _config(tmp_path: Path, **more: Any) -> str:
    config = {
        "model_type": "llama",
        "vocab_size": 8192,
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "tie_word_embeddings": False,
        **more,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_keywords_are_parsed_as_the_command_line_parses_them() -> None:
    o = options_from_keywords({"params": "7B", "lora_rank": 16, "checkpointing": True})
    assert (o.params, o.lora_rank, o.checkpointing) == (7_000_000_000, 16, True)
    assert options_from_keywords({"offload": False, "seq": None}) == Options()
    with pytest.raises(EstimateError, match="unknown option --trace"):
        options_from_keywords({"trace": "m:f"})
    with pytest.raises(EstimateError, match="--batch"):
        options_from_keywords({"batch": "many"})
    with pytest.raises(EstimateError, match="--precision 'fp8'"):
        estimate(Options(params=10**6, precision="fp8"))


def test_fsdp_units_name_the_parts_around_the_root() -> None:
    assert parse_fsdp_units("embed,layers,[norm,head]") == ("embed", "layers", "norm+head")
    for bad in ("layers,layers", "[layers,head]", "body", ""):
        with pytest.raises(ValueError, match="--fsdp-units"):
            parse_fsdp_units(bad)
    units = ("embed", "layers", "norm+head")
    facts = rank_estimate(Plan(LLAMA, seq=128, layout="fsdp", world=8, fsdp_units=units)).facts
    listed = facts["parallel"]["fsdp"]["unit_list"]
    names = [u["name"] for u in listed]
    assert names == ["(root)", "embed", "layers.0", "layers.1", "layers.2", "layers.3", "norm+head"]
    sizes = {u["name"]: u["unsharded_bytes"] for u in listed}
    # bf16-mixed: fp32 weights gathered as they are.
    assert sizes["(root)"] == 0 and sizes["embed"] == 4 * 8192 * 256
    assert sizes["norm+head"] == 4 * (256 + 8192 * 256)
    assert all(u["reshard_after_forward"] for u in listed[1:])


def test_the_default_units_keep_embedding_norm_and_head_in_the_root() -> None:
    listed = rank_estimate(Plan(LLAMA, seq=128, layout="fsdp", world=8)).facts["parallel"]
    root = listed["fsdp"]["unit_list"][0]
    assert root["name"] == "(root)" and not root["reshard_after_forward"]
    assert root["unsharded_bytes"] == 4 * (2 * 8192 * 256 + 256)


def test_mixed_precision_policy_gathers_in_bf16_and_holds_fp32_shards(tmp_path: Path) -> None:
    result = estimate(
        Options(
            config=_config(tmp_path),
            gpus="2x80GiB",
            layout="fsdp",
            mp_policy="bf16",
            batch=2,
            seq=64,
        )
    )
    assert any("MixedPrecisionPolicy" in a for a in result["assumed"])
    plan = Plan(LLAMA, seq=64, layout="fsdp", world=2, precision="fp32")
    policy = rank_estimate(
        Plan(LLAMA, seq=64, layout="fsdp", world=2, precision="fp32", param_dtype="bf16")
    )
    fsdp = policy.facts["parallel"]["fsdp"]
    assert (fsdp["param_dtype"], fsdp["reduce_dtype"]) == ("bfloat16", None)
    plain = rank_estimate(plan).facts["parallel"]["fsdp"]["unit_list"]
    for a, b in zip(fsdp["unit_list"], plain, strict=True):
        assert 2 * a["unsharded_bytes"] == b["unsharded_bytes"]
        assert a["sharded_bytes"] == b["sharded_bytes"]
    with pytest.raises(EstimateError, match="--mp-policy needs --layout"):
        estimate(Options(config=_config(tmp_path), mp_policy="bf16"))


def test_fsdp1_is_a_layout_of_its_own() -> None:
    for layout, strategy in (("fsdp1", "FULL_SHARD"), ("fsdp1-grad-op", "SHARD_GRAD_OP")):
        facts = rank_estimate(Plan(LLAMA, seq=64, layout=layout, world=4)).facts
        par = facts["parallel"]
        assert par["strategy"] == "fsdp1" and par["fsdp"]["strategy"] == strategy


def test_a_loss_outside_the_model_copies_the_shifted_logits(tmp_path: Path) -> None:
    base = dict(batch=2, seq=64, precision="fp32", device="cpu")
    inside = rank_estimate(Plan(LLAMA, **base)).prediction  # type: ignore[arg-type]
    outside = rank_estimate(Plan(LLAMA, loss="outside", **base)).prediction  # type: ignore[arg-type]
    grew = (
        outside.phases["forward", False].peak["temporaries"]
        - (inside.phases["forward", False].peak["temporaries"])
    )
    assert grew == 2 * 63 * 8192 * 4  # logits[:, :-1].contiguous(), fp32
    result = estimate(Options(config=_config(tmp_path), loss="outside"))
    assert any("logits shifted by one" in a for a in result["assumed"])
    with pytest.raises(EstimateError, match="--loss outside"):
        estimate(Options(params=10**6, loss="outside"))


def test_a_frozen_base_under_autocast_has_no_amp_copies() -> None:
    lora = rank_estimate(Plan(LLAMA, batch=2, seq=64, lora_rank=8)).prediction
    full = rank_estimate(Plan(LLAMA, batch=2, seq=64)).prediction
    adapters = 2 * 4 * 8 * (256 + 256 + 256 + 128)  # bf16 copies of A and B, q and v
    assert lora.phases["forward", False].peak["amp_copies"] <= adapters
    assert full.phases["forward", False].peak["amp_copies"] > 1 << 20


def test_the_configs_torch_dtype_is_loras_frozen_base(tmp_path: Path) -> None:
    config = _config(tmp_path, torch_dtype="bfloat16")
    lora = estimate(Options(config=config, lora_rank=8))
    assert any("torch_dtype" in a for a in lora["assumed"])
    assert lora["phases"]["forward"]["amp_copies"] == 0  # bf16 weights: no autocast
    said = estimate(Options(config=config, lora_rank=8, precision="bf16-mixed"))
    assert not any("torch_dtype" in a for a in said["assumed"])
    full = estimate(Options(config=config))  # a full fine-tune keeps its default
    assert not any("torch_dtype" in a for a in full["assumed"])


def test_device_cpu_plans_a_run_on_this_machine(tmp_path: Path) -> None:
    result = estimate(Options(config=_config(tmp_path), device="cpu", batch=2, seq=64))
    assert any("--device cpu" in a for a in result["assumed"])
    facts = rank_estimate(Plan(LLAMA, device="cpu")).facts
    assert {g["device"] for g in facts["params"]["groups"]} == {"cpu"}


def test_params_alone_gives_a_lower_bound_and_no_verdict_it_cannot_back() -> None:
    roomy = estimate(Options(params=10**9, gpus="4xA100-80GB", layout="fsdp"))
    assert not roomy["activations_known"]
    fit = roomy["fit"]
    assert fit["fits"] is None and fit["changes"] == [] and fit["max_batch"] is None
    text = table(roomy)
    assert "CANNOT SAY" in text and "peak: at least" in text and ">= " in text
    assert not any("one unit, the whole model" in n for n in roomy["notes"])
    assert any("FSDP units unknown" in n for n in roomy["notes"])
    short = estimate(Options(params=7 * 10**9, gpus="1x24GiB"))
    assert short["fit"]["fits"] is False  # the states alone exceed it: that is backed
    assert "DOES NOT FIT" in table(short)


def _columns(text: str, row: str) -> dict[str, str]:
    """One row of the table, cell by cell under each phase's heading."""
    lines = text.splitlines()
    head = next(line for line in lines if line.rstrip().endswith("eval"))
    line = next(line for line in lines if line.startswith(row + " "))
    cells, at = {}, 0
    for phase in head.split():
        end = head.index(phase, at) + len(phase)
        cells[phase], at = line[at:end].strip(), end
    return cells


def test_params_alone_leaves_a_for_loop_steps_temporary_unknown() -> None:
    # A count is no tensor sizes: a for-loop step's temporary (the largest tensors') is
    # unknown, never "twice the model" as one tensor of the model's size made it.
    loop = estimate(
        Options(params=7 * 10**9, gpus="4xA100-80GB", layout="fsdp", optimizer_impl="for-loop")
    )
    assert loop["step_temporaries_known"] is False
    for phases in (loop["phases"], loop["first_step"]):
        step = phases["optimizer.step"]
        assert step["temporaries"] == 0  # the lower bound
        # Weights, gradients and states (and clip's norms, a few KiB): no temporary.
        assert 0 <= loop["peak_bytes"] - sum(step.values()) < 2**20
    assert loop["fit"]["fits"] is None and loop["fit"]["changes"] == []
    assert any("optimizer.step's temporaries unknown" in n for n in loop["notes"])
    text = table(loop)
    assert _columns(text, "temporaries")["optimizer.step"] == "unknown"
    assert _columns(text, "total")["optimizer.step"].startswith(">= ")
    assert "the step's temporaries unknown" in text and "CANNOT SAY" in text
    # The known parts alone exceed one GPU: that verdict is backed.
    short = estimate(Options(params=7 * 10**9, gpus="1xA100-80GB", optimizer_impl="for-loop"))
    assert short["fit"]["fits"] is False
    assert short["peak_bytes"] - 16 * 7 * 10**9 < 2**20  # no temporary of twice the model
    # foreach's temporary is its bucket's, which a count gives: known, the model's size.
    each = estimate(Options(params=10**9, optimizer_impl="foreach"))
    assert each["step_temporaries_known"] is True
    assert each["phases"]["optimizer.step"]["temporaries"] == 4 * 10**9
    assert _columns(table(each), "temporaries")["optimizer.step"] != "unknown"


def test_known_tensor_sizes_plan_the_for_loop_temporary() -> None:
    assert Plan(LLAMA, impl="for-loop").step_temporaries_known
    tensors = ((1000, 300), (200, 100), (50,))
    sized = Plan(None, params=320_050, impl="for-loop", tensors=tensors)
    assert sized.step_temporaries_known
    # _single_tensor_adam: sqrt and denom of the largest, the previous denom alive.
    assert rank_estimate(sized).prediction.phases["optimizer.step", False].peak[
        "temporaries"
    ] == 4 * (2 * 300_000 + 20_000)
    assert not Plan(None, params=320_050, impl="for-loop").step_temporaries_known
    # ZeRO's inner optimizer steps one flat partition: known.
    assert Plan(None, params=10**6, impl="for-loop", layout="zero2", world=2).step_temporaries_known


def test_the_command_line_says_the_step_temporary_is_unknown() -> None:
    r = run_gpuwatch(
        "estimate", "--params", "7e9", "--gpus", "4xA100-80GB", "--layout", "fsdp",
        "--optimizer-impl", "for-loop", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["step_temporaries_known"] is False
    assert out["phases"]["optimizer.step"]["temporaries"] == 0
    assert out["fit"]["fits"] is None


def test_gpuwatch_plan_in_a_cell_asks_predict(tmp_path: Path) -> None:
    shown = notebook_plan(config=_config(tmp_path), gpus="2x80GiB", layout="fsdp")
    assert shown.fits and shown.peak_bytes > 0 and "FITS" in shown.text
    assert notebook_plan(params="1B", gpus="1x80GiB").fits is None
    with pytest.raises(ValueError, match=r"gpuwatch\.plan: unknown option --wings"):
        notebook_plan(wings=2)


def test_the_command_line_takes_the_new_options(tmp_path: Path) -> None:
    r = run_gpuwatch(
        "estimate",
        "--config",
        _config(tmp_path),
        "--gpus",
        "8x80GiB",
        "--layout",
        "fsdp",
        "--fsdp-units",
        "embed,layers,[norm,head]",
        "--loss",
        "outside",
        "--device",
        "cpu",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert any("FSDP units: embed,layers,[norm,head]" in a for a in out["assumed"])
    bad = run_gpuwatch("estimate", "--config", _config(tmp_path), "--fsdp-units", "body")
    assert bad.returncode != 0 and "--fsdp-units" in bad.stderr
