"""One rank of a fake GPU job for the cluster tests: real gpuwatch phases on a scripted CUDA.

Usage: ``cluster_rank.py PEAK_MIB [SECONDS]`` with ``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` in
the environment. The client's allocator reader sees CUDA in use on device ``LOCAL_RANK``
(tests/support/fake_cuda.py's scripted figures, its UUID the fake NVML GPU's of that index, so
gpuwatch maps the process to that GPU) and the script steps through
data/forward/backward/optimizer.step, the peak of ``backward`` being PEAK_MIB, about four
steps a second, until SECONDS have passed (default: until killed).

The step number comes from the wall clock (``CLUSTER_EPOCH``, shared by the job's ranks), as a
real job's collectives keep its ranks in step: a rank starved on a loaded machine skips to the
current step instead of falling behind, which the ranks table would rightly flag.
"""

from __future__ import annotations

import os
import sys
import time
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "support"))

from fake_cuda import FakeCuda

import gpuwatch
from gpuwatch.instrument import _api

MIB = 1 << 20
peak_mib = int(sys.argv[1])
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else float("inf")
local = int(os.environ.get("LOCAL_RANK", "0"))


class RankCuda(FakeCuda):
    """The fake CUDA of one rank: its own device, with the fake NVML GPU's UUID."""

    def current_device(self) -> int:
        return local

    def device_count(self) -> int:
        return local + 1

    def get_device_properties(self, idx: int) -> types.SimpleNamespace:
        uuid = f"{idx:08x}-fa4e-4b1d-9c0a-{0xA100 + idx:012x}"  # tests/fake_nvml.py's GPU
        return types.SimpleNamespace(uuid=uuid, name="NVIDIA Fake H100", total_memory=80 << 30)


cuda = RankCuda()
memory = _api._state.memory
memory.active = True
memory._torch = types.SimpleNamespace(cuda=cuda)
memory._devices = None

PERIOD = 0.27  # not a divisor of a second: each scrape lands in another phase
epoch = float(os.environ.get("CLUSTER_EPOCH") or time.time())
start = time.monotonic()
shares = {"data": 0.2, "forward": 0.6, "backward": 1.0, "optimizer.step": 0.8}
while time.monotonic() - start < seconds:
    step = int((time.time() - epoch) / PERIOD)
    gpuwatch.step(step)
    for name, share in shares.items():
        with gpuwatch.phase(name):
            cuda.peak = int(peak_mib * share) * MIB
            time.sleep(0.06)
    time.sleep(max(0.0, epoch + (step + 1) * PERIOD - time.time()))
