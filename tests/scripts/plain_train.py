"""A plain training loop that has never heard of gpuwatch (for the zero-code tests).

Prints one line per phase-worthy call it makes, so tests can compare what gpuwatch inferred
with what really ran.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--zero-grad", choices=("end", "start", "model"), default="end")
    p.add_argument("--exit-code", type=int, default=0)
    p.add_argument("--sleep", type=float, default=0.0, help="seconds of 'data loading'")
    args = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def zero_grad() -> None:
        (model if args.zero_grad == "model" else opt).zero_grad()

    for step in range(args.steps):
        if args.zero_grad == "start":
            zero_grad()
        for _ in range(args.accum):
            if args.sleep:
                import time

                time.sleep(args.sleep)
            x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
            loss = loss_fn(model(x), y) / args.accum
            loss.backward()
        opt.step()
        if args.zero_grad != "start":
            zero_grad()
        if args.eval_every and (step + 1) % args.eval_every == 0:
            with torch.no_grad():
                model(torch.randn(8, 16))
    print(f"done {args.steps} steps, loss {loss.item():.3f}, gpuwatch {'gpuwatch' in sys.modules}")
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
