"""The step rules of README (issue 37, item 12), in a recording made with today's code.

README: without ``gpuwatch.step(n)``, steps advance after an ``optimizer.step`` phase when
the next step's first phase begins; a ``zero_grad`` or eval after the optimizer step stays
in its step, and no step that never ran appears. ``samples/train_tiny_gpt.py`` is recorded
for real on the CPU under ``gpuwatch record``; the shipped H100 samples, re-recorded on an
H100 with those rules, are checked to follow them too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLE, run_gpuwatch

from gpuwatch.session import Session
from gpuwatch.store import load

STEPS = 6
TINY = ("--layers", "1", "--hidden", "32", "--heads", "2", "--vocab", "64", "--seq", "16")
SPIKE = ROOT / "samples" / "gpt-2.7b-h100-adamw-spike.gpuwatch"


def broken_rules(session: Session) -> list[str]:
    """Each phase that breaks README's step rules: a zero_grad or eval after an
    optimizer.step in another step than that optimizer.step's."""
    out = []
    for proc in session.processes.values():
        cols = proc.phases.snapshot()
        order = sorted(range(len(cols["t0"])), key=lambda i: int(cols["t0"][i]))
        stepped: int | None = None  # the step of the optimizer.step this iteration ran
        for i in order:
            name = session.names[int(cols["name"][i])]
            step = int(cols["step"][i])
            if name == "optimizer.step":
                stepped = step
            elif name in ("zero_grad", "eval") and stepped is not None and step != stepped:
                out.append(f"{name} in step {step} after step {stepped}'s optimizer.step")
            elif name in ("data", "forward"):
                stepped = None
    return out


def steps_of(path: Path) -> tuple[int, int]:
    """(last_step from info --json, the highest step of any phase)."""
    info = json.loads(run_gpuwatch("info", "--json", str(path)).stdout)
    [proc] = info["processes"]
    session = load(path)
    highest = max(int(p.phases.snapshot()["step"].max()) for p in session.processes.values())
    return proc["last_step"], highest


def test_a_recording_made_today_follows_readme_step_rules(tmp_path: Path, sock_path: str) -> None:
    out = tmp_path / "tiny.gpuwatch"
    script = (SAMPLE, "--steps", str(STEPS), "--eval-every", "3", "--batch", "2", *TINY)
    recorded = run_gpuwatch(
        "record", "--out", str(out), "--socket", sock_path, "--", sys.executable, *map(str, script)
    )
    assert recorded.returncode == 0, recorded.stderr
    session = load(out)
    assert session.processes and all(len(p.phases) for p in session.processes.values())
    assert broken_rules(session) == []
    # range(6) runs steps 0..5: no step 6 appears, and info agrees.
    assert steps_of(out) == (STEPS - 1, STEPS - 1)


H100 = sorted((ROOT / "samples").glob("*h100*.gpuwatch"))


@pytest.mark.parametrize("path", H100, ids=[p.name for p in H100])
def test_the_h100_samples_follow_readme_step_rules(path: Path) -> None:
    session = load(path)
    assert broken_rules(session) == []
    [proc] = json.loads(run_gpuwatch("info", "--json", str(path)).stdout)["processes"]
    # range(n) runs steps 0..n-1: no step n appears, and info agrees.
    assert steps_of(path) == (proc["steps"] - 1, proc["steps"] - 1)


def test_the_2_7b_sample_keeps_each_eval_in_its_optimizer_steps_step() -> None:
    session = load(SPIKE)
    [proc] = session.processes.values()
    cols = proc.phases.snapshot()
    order = sorted(range(len(cols["t0"])), key=lambda i: int(cols["t0"][i]))
    seq = [(session.names[int(cols["name"][i])], int(cols["step"][i])) for i in order]
    # --eval-every 3 over range(6): evals after steps 2 and 5, in steps 2 and 5; each
    # step's zero_grad in that step; no step 6.
    assert [s for name, s in seq if name == "eval"] == [2, 5]
    assert [s for name, s in seq if name == "zero_grad"] == list(range(STEPS))
    assert max(s for _, s in seq) == STEPS - 1
    # The script's eval marks name the step as gpuwatch counts it, from 0 (they said
    # "step 3: ..." in step 2, and the first screen's header read "step 2: step 3: ...").
    evals = [(m.step, m.text) for m in session.marks if "eval" in m.text]
    assert [s for s, _ in evals] == [2, 5], evals
    assert all(text.startswith(f"step {s}: loss ") for s, text in evals), evals
    readme = (ROOT / "samples" / "README.md").read_text()
    assert "recorded before today's step rules" not in readme
