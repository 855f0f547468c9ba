"""One rank of a job on the fake GPUs: the real gpuwatch client, CUDA scripted (fake_cuda).

Usage: ``fake_rank.py STEPS STEP_SLEEP EXTRA_EVAL`` with torchrun's ``RANK``, ``LOCAL_RANK``
and ``WORLD_SIZE`` set. The rank sees every fake GPU (as under torchrun), works on GPU
``LOCAL_RANK``, sends a small GPT's facts and runs STEPS steps of forward, backward,
optimizer.step and eval; rank 0 peaks EXTRA_EVAL bytes higher in eval (it evaluates alone).
It writes ``READY`` in its stdout once its hello is out, then waits for a line on stdin
before its steps (the test lists its pid in the fake NVML's process lists meanwhile).
"""

from __future__ import annotations

import os
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (fake_nvml)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # fake_cuda

from fake_cuda import FakeCuda
from fake_nvml import FakeNvml, default_gpu

import gpuwatch
from gpuwatch.instrument import _api
from gpuwatch.predict._shape import ModelShape, facts_from_shape

GIB = 1 << 30
PHASES = (("forward", 6), ("backward", 7), ("optimizer.step", 8), ("eval", 4))
GPUS = 4


class RankCuda(FakeCuda):
    """CUDA as one rank sees it: every GPU, its own the current one."""

    def __init__(self, local: int) -> None:
        super().__init__()
        self.local = local

    def current_device(self) -> int:
        return self.local

    def device_count(self) -> int:
        return GPUS

    def get_device_properties(self, idx: int) -> types.SimpleNamespace:
        uuid = FakeNvml.torch_uuid(default_gpu(idx))
        return types.SimpleNamespace(uuid=uuid, name="NVIDIA Fake A100", total_memory=80 * GIB)


def main() -> None:
    steps, sleep, extra = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    cuda = RankCuda(local)
    memory = _api._state.memory
    memory.active, memory._torch, memory._devices = True, types.SimpleNamespace(cuda=cuda), None
    shape = ModelShape(layers=4, hidden=512, heads=8, vocab=8000)
    facts = facts_from_shape(
        shape, batch=2, seq=256, precision="fp32", optimizer="adamw", impl="foreach"
    )
    _api.set_facts(facts)
    gpuwatch.flush()
    print("READY", flush=True)
    sys.stdin.readline()
    for step in range(steps):
        gpuwatch.step(step)
        for name, gib in PHASES:
            with gpuwatch.phase(name):
                cuda.peak = gib * GIB + (extra if rank == 0 and name == "eval" else 0)
                time.sleep(sleep)
    gpuwatch.flush()


if __name__ == "__main__":
    main()
