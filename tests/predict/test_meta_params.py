"""Parameters on ``meta`` beside parameters on the CPU (issue 39, item 5), against the
profiler's truth.

A model half materialised (a head built under ``torch.device("meta")`` and never run)
holds no memory for its meta parameters: they are no weights, get no AdamW state and no
step temporary, and the model is on one device, not a device map.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from profmem import ProfiledMemory  # noqa: E402
from torch import nn  # noqa: E402

import gpuwatch  # noqa: E402
from gpuwatch.predict import predict, total  # noqa: E402

pytestmark = pytest.mark.torch

DIM, BATCH = 512, 32
PHASES = ("forward", "backward", "optimizer.step", "zero_grad")


class HalfMaterialised(nn.Module):
    """Two Linear layers on the CPU and an unused head of the same size on ``meta``."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU(), nn.Linear(DIM, DIM))
        with torch.device("meta"):
            self.head = nn.Sequential(nn.Linear(DIM, DIM), nn.Linear(DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def test_meta_parameters_hold_nothing(sent: list) -> None:
    mem = ProfiledMemory("cpu")
    mem.start()
    torch.manual_seed(0)
    model = HalfMaterialised()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gpuwatch.watch(model, opt)
    x = torch.randn(BATCH, DIM)
    for step in (1, 2):
        with mem.phase(step, "forward"):
            loss = model(x).square().mean()
        with mem.phase(step, "backward"):
            loss.backward()
        with mem.phase(step, "optimizer.step"):
            opt.step()
        with mem.phase(step, "zero_grad"):
            opt.zero_grad()
        del loss
    truth = mem.stop(None)
    facts = sent[-1]
    body = sum(p.numel() * 4 for p in model.body.parameters())
    assert facts["params"]["bytes"] == body
    assert facts["params"]["meta_tensors"] == 4
    assert "parallel" not in facts  # one device: no device map
    assert all(g["device"] == "cpu" for g in facts["optimizer"]["groups"])
    p = predict(facts)
    assert not any("device_map" in n for n in p.notes)
    bad = []
    for (step, phase), got in sorted(truth.peaks.items()):
        pred = total(p.phases[phase, step == 1].peak)
        if abs(pred - got) > 0.10 * got:
            bad.append(f"step {step} {phase}: {pred / got:.2f} of the truth")
    assert not bad, "; ".join(bad)
