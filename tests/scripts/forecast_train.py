"""A small AdamW training loop, described with ``gpuwatch.watch`` (for the forecast tests).

Before its first ``optimizer.step`` it may wait for a file (``--go``): the test writes it
once gpuwatch has forecast this process, standing in for a GPU's backward, which takes
longer than the forecast (see docs/foresight.md). It never waits past ``--wait``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch import nn

import gpuwatch


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--go", default="")
    p.add_argument("--wait", type=float, default=30.0)
    args = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, args.hidden), nn.GELU(), nn.Linear(args.hidden, 512))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gpuwatch.watch(model, opt)
    for step in range(args.steps):
        x = torch.randn(64, 512)
        loss = model(x).square().mean()
        loss.backward()
        if step == 0 and args.go:
            deadline = time.monotonic() + args.wait
            while not os.path.exists(args.go) and time.monotonic() < deadline:
                time.sleep(0.01)  # the test's condition, with a deadline
        opt.step()
        opt.zero_grad()
    gpuwatch.flush()
    print(f"done {args.steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
