"""``gpuwatch estimate`` as a user runs it: a child process, its output and exit status."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, run_gpuwatch


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return run_gpuwatch("estimate", *args, cwd=cwd)


def test_json_from_shape_options() -> None:
    r = _run(
        "--layers",
        "48",
        "--hidden",
        "1600",
        "--heads",
        "25",
        "--vocab",
        "50257",
        "--seq",
        "1024",
        "--batch",
        "2",
        "--precision",
        "fp16-mixed",
        "--optimizer",
        "adam",
        "--optimizer-impl",
        "fused",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out["phases"]) == {"forward", "backward", "optimizer.step", "zero_grad", "eval"}
    step = out["phases"]["optimizer.step"]
    states = step["weights"] + step["gradients"] + step["optimizer_state"]
    assert states == pytest.approx(16 * out["parameters"], rel=1e-4)
    assert out["phases"]["forward"]["activations"] > 0
    assert out["peak_bytes"] == max(sum(p.values()) for p in out["phases"].values())


def test_table_from_a_config(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_hidden_layers": 4,
                "hidden_size": 256,
                "num_attention_heads": 8,
                "num_key_value_heads": 2,
                "intermediate_size": 688,
                "vocab_size": 32000,
                "max_position_embeddings": 512,
                "hidden_act": "silu",
                "tie_word_embeddings": False,
            }
        )
    )
    r = _run("--config", str(cfg), "--lora-rank", "8", "--checkpointing", "--attention", "eager")
    assert r.returncode == 0, r.stderr
    assert "optimizer.step" in r.stdout and "activations" in r.stdout and "peak:" in r.stdout


def test_params_only_says_activations_are_unknown() -> None:
    r = _run("--params", "7e9", "--precision", "bf16", "--optimizer", "adamw-8bit", "--json")
    out = json.loads(r.stdout)
    assert not out["activations_known"] and out["phases"]["forward"]["activations"] == 0
    assert out["phases"]["forward"]["weights"] == 14_000_000_000


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("--layers", "2"),
        ("--layers", "2", "--hidden", "100", "--heads", "3", "--vocab", "10"),
        ("--config", "/no/such/config.json"),
        ("--params", "1e6", "--lora-rank", "4"),
        ("--trace", "nocolon"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    r = _run(*args)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and r.stderr.startswith("gpuwatch: ")


def test_trace_counts_real_steps_on_fake_tensors() -> None:
    pytest.importorskip("torch")
    r = _run("--trace", "samples/trace_tiny_gpt.py:build", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    first, second = out["steps"]
    cats = second["cpu"]
    assert cats["Parameter"] > 0 and cats["Optstate"] > 0
    assert out["peak_bytes"] >= first["cpu"]["Total"]
