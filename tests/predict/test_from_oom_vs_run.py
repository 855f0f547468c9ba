"""``estimate --from`` on the OOM sample names a change that fits, and that change holds
against a run of it.

``samples/gpt2-small-h100-oom.gpuwatch`` ran out of memory in forward on an H100. The
real CLI re-plans it and ranks the changes; the first that fits is checkpointing every
layer. The same model (``samples/train_tiny_gpt.py``) with that change then runs under
``gpuwatch record`` on the CPU at a scaled-down size, and its phases' true peaks come
from torch.profiler's allocator events (``profiled_tiny_gpt.py``). The recorded run's
facts must plan as the sample's plan at that size with the change applied, and that
plan's prediction must land within 10% of every phase's peak of every step.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import ROOT, no_gpu_env, record_cmd

torch = pytest.importorskip("torch")

from gpuwatch.predict import plan_from_facts, rank_estimate, total  # noqa: E402
from gpuwatch.store.loader import load  # noqa: E402

pytestmark = pytest.mark.torch

OOM = ROOT / "samples" / "gpt2-small-h100-oom.gpuwatch"
DRIVER = ROOT / "tests" / "support" / "profiled_tiny_gpt.py"
TOLERANCE = 0.10
SMALL = {"layers": 2, "hidden": 128, "heads": 4, "vocab": 1024}
BATCH, SEQ, STEPS = 8, 128, 3


def _facts(path: Path) -> dict:
    session = load(str(path))
    facts = [p.facts for p in session.processes.values() if isinstance(p.facts, dict)]
    assert facts, f"{path.name}: no facts"
    return facts[0]


def test_the_change_that_fits_holds_against_a_recorded_run_of_it(
    tmp_path: Path, sock_dir: Path
) -> None:
    env = {**no_gpu_env(dict(__import__("os").environ)), "PYTHONPATH": str(ROOT)}
    got = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "estimate", "--from", str(OOM), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert got.returncode == 0, got.stderr
    fit = json.loads(got.stdout)["fit"]
    assert not fit["fits"]
    first = next(c for c in fit["changes"] if c["fits"])
    assert first["flags"] == "--checkpointing"  # the cheapest change that fits

    # The same model with that change, scaled down, recorded on the CPU.
    rec, truth_file = tmp_path / "small.gpuwatch", tmp_path / "truth.json"
    sample_args = [f"--{k}={v}" for k, v in SMALL.items()]
    sample_args += [f"--batch={BATCH}", f"--seq={SEQ}", f"--steps={STEPS}", "--eval-every=0"]
    run = subprocess.run(
        [
            *record_cmd(str(rec), str(sock_dir / "gw.sock")),
            "--",
            sys.executable,
            str(DRIVER),
            str(truth_file),
            "--device=cpu",
            "--checkpointing",
            *sample_args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    truth = json.loads(truth_file.read_text())

    # The sample's plan at the small size, with the change: what the recorded run is.
    sample, _ = plan_from_facts(_facts(OOM))
    assert sample.shape is not None and not sample.checkpointing
    plan = replace(
        sample,
        shape=replace(
            sample.shape,
            max_positions=SEQ,
            kv_heads=None,
            head_dim=None,
            intermediate=None,
            **SMALL,
        ),
        batch=BATCH,
        seq=SEQ,
        checkpointing=True,
        device="cpu",
    )
    recorded, _ = plan_from_facts(_facts(rec))
    assert replace(recorded, device="cpu") == plan

    pred = rank_estimate(plan).prediction
    bad, rows = [], 0
    for key, peak in sorted(truth.items()):
        step, _, phase = key.partition(":")
        pm = pred.phases.get((phase, step == "1"))
        if pm is None:
            continue  # data: the batch's tokens, not a phase the plan predicts
        rows += 1
        ratio = total(pm.peak) / peak
        print(f"step {step} {phase}: {ratio:.3f}")
        if abs(ratio - 1) > TOLERANCE:
            bad.append(f"step {step} {phase}: {ratio:.3f} of the truth")
    assert rows >= 4 * STEPS - 1  # forward, backward, optimizer.step, zero_grad each step
    assert not bad, "; ".join(bad)
