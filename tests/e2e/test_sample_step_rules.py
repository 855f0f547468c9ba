"""The step rules of README (issue 37, item 12), in a recording made with today's code.

README: without ``gpuwatch.step(n)``, steps advance after an ``optimizer.step`` phase when
the next step's first phase begins; a ``zero_grad`` or eval after the optimizer step stays
in its step, and no step that never ran appears. ``samples/train_tiny_gpt.py`` is recorded
for real on the CPU under ``gpuwatch record``; the shipped 2.7B sample, recorded before
those rules, is checked to be as stale as samples/README.md says (re-recorded on a GPU, this
test says to update that page).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

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


def test_the_2_7b_sample_is_as_stale_as_samples_readme_says() -> None:
    session = load(SPIKE)
    broken = broken_rules(session)
    # Every zero_grad in step n+1; the evals after steps 2 and 5 in steps 3 and 6.
    zero_grads = [f"zero_grad in step {n + 1} after step {n}'s" for n in range(STEPS)]
    evals = [f"eval in step {n + 1} after step {n}'s" for n in (2, 5)]
    assert sorted(b.removesuffix(" optimizer.step") for b in broken) == sorted(zero_grads + evals)
    last_step, highest = steps_of(SPIKE)
    assert (last_step, highest) == (5, 6)  # a step 6 for range(6), info says 5
    readme = (ROOT / "samples" / "README.md").read_text()
    assert "recorded before today's step rules" in readme
