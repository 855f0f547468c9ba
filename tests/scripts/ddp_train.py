"""A tiny DDP training loop for torchrun on the CPU (gloo); it never imports gpuwatch.

Arguments: steps (default 3), seconds to sleep after each step (default 0).
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> int:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if pause:
            time.sleep(pause)
    dist.barrier()
    print(f"rank {rank} of {dist.get_world_size()} pid {os.getpid()} done", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
