"""Framework integrations: importable without the frameworks; real Trainers where installed.

Each framework run is a real subprocess sending to a real receiver in this process. The
facts module belongs to another branch, so the scripts install a recording stand-in
(tests/scripts/fake_facts.py).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from conftest import ROOT, wait_for
from phasecheck import phases, receiver, rows, step_rows

from gpuwatch.session import Session

SCRIPTS = ROOT / "tests" / "scripts"


def _have(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


@pytest.fixture
def live(sock_path: str) -> Iterator[Session]:
    yield from receiver(sock_path)


def _run(script: str, env: dict[str, str]) -> None:
    env = {**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_integrations_import_without_their_frameworks(sub_env: dict[str, str]) -> None:
    code = (
        "import sys\n"
        "for name in ('transformers', 'lightning', 'pytorch_lightning', 'accelerate'):\n"
        "    sys.modules[name] = None  # as if not installed\n"
        "import gpuwatch.integrations.transformers as t\n"
        "import gpuwatch.integrations.lightning as l\n"
        "import gpuwatch.integrations.accelerate as a\n"
        "for make in (t.GpuwatchCallback, l.GpuwatchCallback, l.PytorchLightningCallback,\n"
        "             lambda: a.watch(object())):\n"
        "    try:\n"
        "        make()\n"
        "    except ImportError as exc:\n"
        "        print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=sub_env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "GpuwatchCallback needs the 'transformers' package: pip install transformers",
        "GpuwatchCallback needs the 'lightning' package: pip install lightning",
        "PytorchLightningCallback needs the 'pytorch_lightning' package: "
        "pip install pytorch_lightning",
        "gpuwatch.integrations.accelerate.watch needs the 'accelerate' package: "
        "pip install accelerate",
    ]


def _worker(session: Session) -> int:
    """The one process (other than this one) that reported."""
    assert wait_for(lambda: any(p.ended for p in session.processes.values()))
    (pid,) = [p for p in session.processes if p != os.getpid()]
    return pid


@pytest.mark.skipif(not _have("transformers"), reason="transformers is not installed")
def test_transformers_trainer(live: Session, sub_env: dict[str, str]) -> None:
    _run("hf_trainer.py", sub_env)
    pid = _worker(live)
    # 4 steps of 2 micro-batches, an evaluation after steps 2 and 4: the plain loop's shape.
    assert rows(live, pid) == step_rows(4, accum=2, eval_every=2)
    proc = live.processes[pid]
    facts = dict(proc.facts)
    assert facts.pop("activations")["bytes"] > 0  # the first training forward, measured
    assert facts.pop("epoch") == 0  # the one model the Trainer trains
    assert facts == {
        "model": "GPT2LMHeadModel",
        "params": proc.facts["params"],
        "optimizer": "AdamW",  # Accelerate's wrapper unwrapped
        "amp_dtype": None,
        "batch": {"shape": [2, 16]},
    }
    marks = [(m.text.split(":")[0], m.step) for m in live.marks if m.pid == pid]
    assert marks == [
        ("evaluation at step 2", 2),
        ("evaluation at step 4", 4),
        ("training ended at step 4", 4),
    ]


@pytest.mark.skipif(not _have("lightning"), reason="lightning is not installed")
def test_lightning_trainer(live: Session, sub_env: dict[str, str]) -> None:
    _run("lightning_fit.py", sub_env)
    pid = _worker(live)
    got = phases(live, pid)
    names = [r[0] for r in got]
    assert [names.count(n) for n in ("forward", "backward", "optimizer.step", "eval")] == [
        4,
        4,
        4,
        2,
    ]
    # Lightning runs forward and backward inside the optimizer's closure; still each step
    # is forward < backward < optimizer.step, and nothing lies inside an optimizer.step.
    for step in range(4):
        order = [r[0] for r in got if r[2] == step and r[0] in ("forward", "backward")]
        order += [r[0] for r in got if r[2] == step and r[0] == "optimizer.step"]
        assert order == ["forward", "backward", "optimizer.step"], (step, got)
    for s in (r for r in got if r[0] == "optimizer.step"):
        assert s[1] == 0
        assert not [r for r in got if r is not s and s[3] <= r[3] and r[4] <= s[4]]
    facts = live.processes[pid].facts
    assert (facts["model"], facts["optimizer"], facts["batch"]) == (
        "Tiny",
        "AdamW",
        {"shape": [4, 16]},
    )
    marks = [m.text.split(":")[0] for m in live.marks if m.pid == pid]
    assert marks == ["validation at step 2", "validation at step 4"]


@pytest.mark.skipif(not _have("accelerate"), reason="accelerate is not installed")
def test_accelerate_loop(live: Session, sub_env: dict[str, str]) -> None:
    _run("accelerate_loop.py", sub_env)
    pid = _worker(live)
    # Under accelerator.accumulate only the last micro-batch steps and zeroes.
    assert rows(live, pid) == step_rows(2, accum=2, last_data=True)
    facts = live.processes[pid].facts
    assert (facts["model"], facts["optimizer"]) == ("Sequential", "AdamW")


@pytest.mark.skipif(not _have("transformers"), reason="transformers is not installed")
@pytest.mark.parametrize(
    ("fields", "want"),
    [
        ({"activation_checkpointing": True, "gradient_checkpointing": True}, True),  # 5.x
        ({"gradient_checkpointing": True}, True),  # before the rename
        ({"activation_checkpointing": True}, True),  # after the old name is gone (6.x)
        ({"activation_checkpointing": False, "gradient_checkpointing": None}, False),
        ({}, False),
    ],
)
def test_the_trainer_callback_reads_checkpointing_by_either_name(
    monkeypatch, fields: dict[str, bool], want: bool
) -> None:
    from types import SimpleNamespace

    from gpuwatch import instrument
    from gpuwatch.integrations.transformers import GpuwatchCallback

    seen: dict[str, object] = {}
    monkeypatch.setattr(instrument, "watch", lambda model, opt, **kw: seen.update(kw))
    monkeypatch.setattr(instrument, "step", lambda step: None)
    args = SimpleNamespace(bf16=False, fp16=False, **fields)
    GpuwatchCallback().on_train_begin(
        args, SimpleNamespace(global_step=0), None, model=object(), optimizer=object()
    )
    assert seen["checkpointing"] is want
