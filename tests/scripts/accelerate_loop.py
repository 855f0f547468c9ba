"""An Accelerate training loop on the CPU with gradient accumulation, described to gpuwatch
with gpuwatch.integrations.accelerate.watch: 2 optimizer steps of 2 micro-batches."""

from __future__ import annotations

import sys

import fake_facts
import torch

fake_facts.install()

from accelerate import Accelerator  # noqa: E402
from torch import nn  # noqa: E402

import gpuwatch.integrations.accelerate  # noqa: E402


def main() -> int:
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.randn(16, 16), torch.randint(0, 4, (16,)))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    gpuwatch.integrations.accelerate.watch(accelerator)
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(nn.functional.cross_entropy(model(x), y))
            opt.step()
            opt.zero_grad()
    print("trained", gpuwatch.step(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
