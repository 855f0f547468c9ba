"""gpuwatch never keeps a user's tensor alive: the batch of step 1 dies when the loop drops it.

Each case runs a real training loop inside a function (where a frame's locals outlive the
step) in a fresh interpreter, holds only a ``weakref`` to the first step's batch, and checks
after later steps that nothing else references it. The cases cover every way gpuwatch meets
a training step: ``watch()`` with and without its phases, the zero-code start-up hook of
``gpuwatch run``, explicit phases, and a model whose output object is kept by the loop.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

from conftest import ROOT

from gpuwatch import launch

pytestmark = pytest.mark.torch

_CHILD = textwrap.dedent(
    """
    import gc, sys, weakref
    import torch
    from torch import nn
    MODE = sys.argv[1]
    if MODE != "zero-code":
        import gpuwatch

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(32, 64)
            self.b = nn.Linear(64, 8)

        def forward(self, x):
            return {"out": self.b(torch.relu(self.a(x))), "hidden": x * 2}

    def train():
        torch.manual_seed(0)
        model = Net().train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        if MODE == "watch":
            gpuwatch.watch(model, opt)
        elif MODE == "watch-no-phases":
            gpuwatch.watch(model, opt, phases=False)
        first = None
        for step in range(4):
            batch = torch.randn(16, 32)
            if first is None:
                first = weakref.ref(batch)
            if MODE == "phases":
                with gpuwatch.phase("forward"):
                    output = model(batch)
                    loss = output["out"].square().mean()
                with gpuwatch.phase("backward"):
                    loss.backward()
                with gpuwatch.phase("optimizer.step"):
                    opt.step()
                    opt.zero_grad()
            else:
                output = model(batch)
                loss = output["out"].square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
        gc.collect()
        held = first()
        holders = [type(r).__name__ for r in gc.get_referrers(held)] if held is not None else []
        print("ALIVE" if held is not None else "FREED", holders)

    train()
    """
)


@pytest.mark.parametrize("mode", ["watch", "watch-no-phases", "zero-code", "phases"])
def test_the_first_batch_is_not_kept_alive(mode: str, sock_path: str) -> None:
    env = launch.child_env(sock_path, instrument=mode == "zero-code")
    env["PYTHONPATH"] = os.pathsep.join([env.get("PYTHONPATH", ""), str(ROOT)]).strip(os.pathsep)
    env.pop("GPUWATCH_ACTIVATIONS", None)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("FREED"), f"{mode}: {out.stdout.strip()} {out.stderr[-500:]}"
    assert "gpuwatch" not in out.stderr, out.stderr
