"""``gpuwatch estimate --gpus ... --layout ...`` as a user runs it: the answer, per rank."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

FALCON_7B = ROOT / "samples" / "configs" / "falcon-7b.json"
FALCON_40B = ROOT / "samples" / "configs" / "falcon-40b.json"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("estimate", *args, cwd=ROOT)  # in this process: see test_estimate_cli


def _json(*args: str) -> dict:
    r = _run(*args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_falcon_40b_lora_on_four_a100s_under_fsdp_and_zero3() -> None:
    base = ("--config", str(FALCON_40B), "--seq", "2048", "--lora-rank", "16")
    base += ("--lora-targets", "q,k,v,o", "--gpus", "4xA100-80GB")
    one = _json("--config", str(FALCON_40B), "--seq", "2048", "--gpus", "A100-80GB")
    assert one["parameters"] == 41_303_293_952  # FalconForCausalLM on the meta device
    assert not one["fit"]["fits"]
    for layout in ("fsdp", "zero3"):
        out = _json(*base, "--layout", layout)
        fit = out["fit"]
        assert out["world_size"] == 4 and out["parallel"] == layout
        assert fit["usable_bytes"] == 80 * 2**30 - 2**30
        assert fit["headroom_bytes"] == fit["usable_bytes"] - fit["peak_bytes"]
        assert fit["deciding_phase"] in out["phases"]
        # A rank holds a quarter of the frozen base weights, in the config's torch_dtype
        # (bfloat16) as LoRA recipes load it (issue 52), under either layout.
        elt = 2
        assert any("torch_dtype" in a for a in out["assumed"])
        assert out["rank_parameters"] * elt == pytest.approx(
            out["phases"]["optimizer.step"]["weights"], rel=0.01
        )
        if not fit["fits"]:
            assert fit["changes"], layout
            assert all(c["fits"] and c["cost"] for c in fit["changes"])


def test_the_screen_says_fits_or_not_and_what_would() -> None:
    r = _run("--config", str(FALCON_7B), "--seq", "2048", "--batch", "8", "--gpus", "4xA100-40GB")
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert "on 4 x A100-40GB (ddp)" in text
    assert "DOES NOT FIT" in text
    assert "no micro-batch fits as planned" in text
    assert "what would make it fit, cheapest first:" in text
    assert "cost:" in text
    assert len(text.splitlines()) < 60  # one screen


def test_a_change_it_proposes_fits_when_asked_for() -> None:
    args = ("--config", str(FALCON_7B), "--seq", "2048", "--batch", "8", "--gpus", "4xA100-40GB")
    out = _json(*args)
    first = out["fit"]["changes"][0]
    again = _json(*args, *first["flags"].split())
    assert again["fit"]["fits"]
    assert again["fit"]["peak_bytes"] == first["peak_bytes"]


def test_neox_takes_its_kv_heads() -> None:
    shape = ("--arch", "neox", "--layers", "60", "--hidden", "8192", "--heads", "128")
    mha = _json(*shape, "--vocab", "65024")["parameters"]
    gqa = _json(*shape, "--vocab", "65024", "--kv-heads", "8")["parameters"]
    assert gqa < mha
    assert gqa == pytest.approx(41.8e9, rel=0.005)


def test_heads_need_not_divide_hidden_with_a_head_size() -> None:
    shape = ("--layers", "24", "--hidden", "2048", "--heads", "24", "--vocab", "50257")
    assert _run(*shape).returncode == 2
    out = _json(*shape, "--head-dim", "128", "--seq", "2048")
    h, q, f = 2048, 24 * 128, 4 * 2048
    per_layer = 4 * h + (h * 3 * q + 3 * q) + (q * h + h) + (h * f + f) + (f * h + h)
    assert out["parameters"] == 24 * per_layer + 50257 * h + 2048 * h + 2 * h
    assert out["activations_known"]


OOM = ROOT / "samples" / "gpt2-small-h100-oom.gpuwatch"


def test_from_the_oom_recording_names_a_change_that_fits() -> None:
    out = _json("--from", str(OOM))
    fit, recorded = out["fit"], out["recorded"]
    # The recorded run as it was: what its out-of-memory error asked for does not fit.
    assert recorded["oom"]["phase"] == "forward" and not fit["fits"]
    assert fit["peak_bytes"] == recorded["oom"]["demand_bytes"]
    assert fit["gpu"] == "NVIDIA H100 80GB HBM3" and out["batch"] == 16
    assert fit["changes"] and fit["changes"][0]["fits"]
    # Asked for, the change fits, with the same peak it was offered with.
    first = fit["changes"][0]
    again = _json("--from", str(OOM), *first["flags"].split())
    assert again["fit"]["fits"] and again["fit"]["peak_bytes"] == first["peak_bytes"]
    smaller = _json("--from", str(OOM), "--batch", str(fit["max_batch"]))
    assert smaller["fit"]["fits"]
    assert not _json("--from", str(OOM), "--batch", str(fit["max_batch"] + 1))["fit"]["fits"]


@pytest.mark.parametrize(
    "args",
    [
        ("--from", "/no/such/run.gpuwatch"),
        ("--params", "7B", "--gpus", "4xB9000"),
        ("--params", "7B", "--gpus", "4xA100-80GB", "--layout", "pipeline"),
        ("--params", "7B", "--layout", "zero3"),
        ("--params", "7B", "--gpus", "4xA100-80GB", "--layout", "ddp", "--offload"),
        ("--params", "7B", "--gpus", "4xA100-80GB", "--layout", "tp=4"),
        ("--params", "7B", "--gpus", "2x80GiB", "--reserve", "lots"),
        ("--config", str(FALCON_7B), "--lora-rank", "8", "--lora-targets", "q,zz"),
        ("--config", str(FALCON_7B), "--gpus", "2xA100-80GB", "--layout", "tp=4"),
    ],
)
def test_bad_plans_are_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    r = _run(*args)
    assert r.returncode == 2, r.stdout
    assert r.stderr.strip().count("\n") == 0 and r.stderr.startswith("gpuwatch: ")


def test_falcon_variants_outside_the_closed_form_are_counted_on_the_meta_device(
    tmp_path: Path,
) -> None:
    pytest.importorskip("transformers")
    cfg = json.loads(FALCON_7B.read_text())
    cfg["alibi"] = True  # Falcon-RW's layout: no closed form, transformers builds it
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    out = _json("--config", str(path))
    assert out["parameters"] == 6_921_720_704 and not out["activations_known"]
    assert any("meta device" in a for a in out["assumed"])


def test_info_of_an_oom_recording_offers_the_answer() -> None:
    r = run_cli("info", str(OOM), cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "what would have fitted (gpuwatch estimate --from" in r.stdout
    assert "--checkpointing: peak" in r.stdout
    out = json.loads(run_cli("info", str(OOM), "--json", cwd=ROOT).stdout)
    assert out["oom_answer"]["changes"][0]["fits"]
    clean = run_cli("info", str(ROOT / "samples" / "gpt2-small-h100.gpuwatch"), cwd=ROOT)
    assert "what would have fitted" not in clean.stdout


GEMMA = {
    "architectures": ["GemmaForCausalLM"],
    "model_type": "gemma",
    "hidden_size": 128,
    "intermediate_size": 1024,
    "num_hidden_layers": 5,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "max_position_embeddings": 512,
    "vocab_size": 1024,
}


def test_checkpointing_is_offered_to_a_traced_family(tmp_path: Path) -> None:
    # No closed form: the CLI traces the step once more with checkpointing when the plan
    # does not fit, and the change it ranks is what --checkpointing itself plans.
    pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GEMMA))
    base = ("--config", str(path), "--batch", "8", "--precision", "fp32", "--reserve", "0")
    out = _json(*base, "--gpus", "1x300MiB")
    assert not out["fit"]["fits"], out["fit"]
    assert "gradient checkpointing planned from the step traced with it" in out["assumed"]
    change = next(c for c in out["fit"]["changes"] if c["flags"] == "--checkpointing")
    asked = _json(*base, "--gpus", "1x300MiB", "--checkpointing")
    assert asked["fit"]["fits"] and change["peak_bytes"] == asked["peak_bytes"]
    # Where it fits, nothing more is traced.
    roomy = _json(*base, "--gpus", "1x1GiB")
    assert roomy["fit"]["fits"]
    assert not any("checkpointing planned" in a for a in roomy["assumed"])
