"""``gpuwatch estimate --trace``: a plain ``nn.Module`` planned with the run's options.

The builder is a user's own file; each option changes the per-phase answer as the real
run would (the layout applied on torch's fake process group, the step run on fake
tensors); what the trace cannot honour, and a builder that fails, is one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, run_cli, run_gpuwatch

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

BUILDER = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, dim=256, layers=3):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim))
            for _ in range(layers)
        )

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def build(batch=8):
    return Net(), lambda out: out.square().mean(), torch.randn(batch, 256)


def fixed():
    return Net(), lambda out: out.square().mean(), torch.randn(8, 256)


def broken(batch=8):
    raise FileNotFoundError("no such checkpoint: weights/net.pt")
"""

MIB = 2**20


@pytest.fixture
def builder(tmp_path: Path) -> str:
    path = tmp_path / "net_builder.py"
    path.write_text(BUILDER)
    return str(path)


def _estimate(*argv: str) -> dict[str, Any]:
    """``estimate --trace ...`` as the command parses and answers it, in this process."""
    from gpuwatch.cli._common import add_commands
    from gpuwatch.cli._trace import trace_estimate
    from gpuwatch.cli.estimate import COMMANDS

    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(), COMMANDS)
    args, extra = parser.parse_known_args(["estimate", *argv, "--device", "cpu"])
    if extra == ["--device", "cpu"]:
        args.device = "cpu"
    return trace_estimate(args)


def _total(breakdown: dict[str, int]) -> int:
    return sum(breakdown.values())


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("estimate", *args, cwd=ROOT)  # in this process: see test_estimate_cli


def test_the_answer_is_per_phase_with_a_fit_verdict(builder: str) -> None:
    r = _run("--trace", f"{builder}:build", "--gpus", "2x24GiB", "--layout", "ddp", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out["phases"]) >= {"forward", "backward", "optimizer.step", "zero_grad"}
    assert out["parameters"] == 3 * (2 * 256 * 512 + 512 + 256)
    assert out["world_size"] == 2 and out["parallel"] == "ddp"
    fit = out["fit"]
    assert fit["fits"] is True and fit["gpus"] == 2 and fit["usable_bytes"] > 20 * 2**30
    assert fit["peak_bytes"] == out["peak_bytes"]
    text = _run("--trace", f"{builder}:build", "--gpus", "2x24GiB").stdout
    assert "FITS" in text and "forward" in text and "ddp" in text


def test_ddp_is_traced_with_its_buckets(builder: str) -> None:
    alone = _estimate("--trace", f"{builder}:build", "--precision", "fp32")
    ddp = _estimate("--trace", f"{builder}:build", "--precision", "fp32", "--gpus", "2x24GiB")
    assert ddp["parallel"] == "ddp" and ddp["traced"]["strategy"] == "ddp"
    assert ddp["phases"]["backward"].get("ddp_buckets", 0) > 0
    assert not alone["phases"]["backward"].get("ddp_buckets")
    # The buckets hold a copy of the gradients (no gradient_as_bucket_view).
    grads = alone["phases"]["optimizer.step"]["gradients"]
    assert ddp["phases"]["backward"]["ddp_buckets"] == pytest.approx(grads, rel=0.05)


def test_tp_splits_each_layers_pair_of_linears_and_says_so(builder: str) -> None:
    argv = ("--trace", f"{builder}:build", "--precision", "fp32")
    alone = _estimate(*argv)
    tp = _estimate(*argv, "--gpus", "2x24GiB", "--layout", "tp=2")
    assert tp["parallel"] == "tp=2" and tp["traced"]["strategy"] == "tp"
    # Megatron's split: the first Linear by columns (weight and bias halved), the second
    # by rows (weight halved, its bias replicated on every rank).
    per_rank = 3 * ((256 * 512 + 512) // 2 + 256 * 512 // 2 + 256)
    assert tp["rank_parameters"] == per_rank
    assert alone["phases"]["optimizer.step"]["weights"] == 4 * tp["parameters"]
    assert tp["phases"]["optimizer.step"]["weights"] == 4 * per_rank
    said = [a for a in tp["assumed"] if a.startswith("tensor parallel over 2")]
    assert said and "0 (colwise), 2 (rowwise)" in said[0] and "replicated" in said[0]


def test_fsdp_shards_the_states_over_the_gpus_named(builder: str) -> None:
    one = _estimate("--trace", f"{builder}:build", "--precision", "fp32")
    fsdp = _estimate(
        "--trace", f"{builder}:build", "--precision", "fp32", "--gpus", "4x24GiB", "--layout",
        "fsdp",
    )  # fmt: skip
    assert fsdp["traced"]["strategy"] == "fsdp2"
    weights = one["phases"]["zero_grad"]["weights"]
    assert fsdp["phases"]["zero_grad"]["weights"] == pytest.approx(weights / 4, rel=0.02)
    assert fsdp["phases"]["forward"].get("fsdp_unsharded", 0) > 0
    fsdp1 = _estimate(
        "--trace", f"{builder}:build", "--precision", "fp32", "--gpus", "4x24GiB", "--layout",
        "fsdp1",
    )  # fmt: skip
    assert fsdp1["traced"]["strategy"] == "fsdp1"
    assert fsdp1["phases"]["zero_grad"]["weights"] == pytest.approx(weights / 4, rel=0.02)


def test_fsdp_s_mixed_precision_policy_gathers_the_units_in_bf16(builder: str) -> None:
    argv = ("--trace", f"{builder}:build", "--gpus", "2x24GiB", "--layout", "fsdp")
    fp32 = _estimate(*argv, "--precision", "fp32")
    mixed = _estimate(*argv, "--mp-policy", "bf16")
    gathered = fp32["phases"]["forward"]["fsdp_unsharded"]
    assert mixed["phases"]["forward"]["fsdp_unsharded"] == pytest.approx(gathered / 2, rel=0.05)
    # The weights stay fp32 (the policy casts them as it gathers).
    assert mixed["phases"]["zero_grad"]["weights"] == fp32["phases"]["zero_grad"]["weights"]


def test_the_batch_the_precision_and_checkpointing_change_the_phases(builder: str) -> None:
    base = _estimate("--trace", f"{builder}:build", "--precision", "fp32", "--batch", "64")
    big = _estimate("--trace", f"{builder}:build", "--precision", "fp32", "--batch", "256")
    act, act_big = base["phases"]["forward"]["activations"], big["phases"]["forward"]["activations"]
    assert act > 0 and act_big == pytest.approx(4 * act, rel=0.1)
    assert big["batch"] == 256
    bf16 = _estimate("--trace", f"{builder}:build", "--precision", "bf16", "--batch", "64")
    fp32_weights = base["phases"]["zero_grad"]["weights"]
    assert bf16["phases"]["zero_grad"]["weights"] == pytest.approx(fp32_weights / 2, rel=0.02)
    mixed = _estimate("--trace", f"{builder}:build", "--precision", "bf16-mixed", "--batch", "64")
    assert mixed["phases"]["forward"]["activations"] < act  # bf16 activations under autocast
    ckpt = _estimate(
        "--trace", f"{builder}:build", "--precision", "fp32", "--batch", "64", "--checkpointing"
    )
    assert ckpt["phases"]["forward"]["activations"] < act / 2


def test_accumulation_keeps_the_gradients_through_the_next_forward(builder: str) -> None:
    one = _estimate("--trace", f"{builder}:build", "--precision", "fp32")
    two = _estimate("--trace", f"{builder}:build", "--precision", "fp32", "--accumulation", "2")
    grads = one["phases"]["optimizer.step"]["gradients"]
    assert not one["first_step"]["forward"].get("gradients")
    assert two["first_step"]["forward"]["gradients"] == grads
    assert _total(two["first_step"]["forward"]) > _total(one["first_step"]["forward"])


def test_a_plan_that_does_not_fit_says_so_and_ranks_changes(builder: str) -> None:
    out = _estimate(
        "--trace", f"{builder}:build", "--batch", "4096", "--gpus", "1x24MiB", "--reserve", "0"
    )
    fit = out["fit"]
    assert fit["fits"] is False and fit["headroom_bytes"] < 0
    # Each phase is linear in the batch: the largest that fits is well below 4096.
    assert fit["max_batch"] is not None and 0 <= fit["max_batch"] < 4096
    smaller = _estimate("--trace", f"{builder}:build", "--batch", str(max(fit["max_batch"], 1)))
    assert smaller["peak_bytes"] <= fit["usable_bytes"] or fit["max_batch"] == 0
    flags = [c["flags"] for c in fit["changes"]]
    assert "--checkpointing" in flags
    assert all(c["peak_bytes"] > 0 for c in fit["changes"])


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--lora-rank", "8"), "--lora-rank"),
        (("--gpus", "2x24GiB", "--layout", "tp=3"), "tp=3"),
        (("--gpus", "2x24GiB", "--layout", "zero2"), "zero2"),
        (("--layers", "2"), "shape"),
        (("--layout", "fsdp"), "--gpus"),
        (("--gpus", "2x24GiB", "--layout", "fsdp", "--fsdp-units", "embed,layers"), "units"),
        (("--gpus", "2x24GiB", "--mp-policy", "bf16"), "--mp-policy"),
        (("--loss", "outside"), "--loss"),
    ],
)
def test_what_the_trace_cannot_honour_is_refused_in_one_line(
    builder: str, args: tuple[str, ...], said: str
) -> None:
    r = _run("--trace", f"{builder}:build", *args)
    assert r.returncode == 2, r.stdout
    assert r.stderr.startswith("gpuwatch: ") and r.stderr.strip().count("\n") == 0
    assert said in r.stderr and r.stdout == ""


def test_a_batch_the_builder_cannot_take_is_refused(builder: str) -> None:
    r = _run("--trace", f"{builder}:fixed", "--batch", "16")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "--batch" in r.stderr and "takes no batch" in r.stderr


def test_a_failing_builder_is_one_line_with_its_own_error(builder: str) -> None:
    r = run_gpuwatch("estimate", "--trace", f"{builder}:broken", cwd=ROOT)  # a real child
    assert r.returncode == 2, r.stdout
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert "FileNotFoundError: no such checkpoint: weights/net.pt" in r.stderr
    assert "Traceback" not in r.stderr
