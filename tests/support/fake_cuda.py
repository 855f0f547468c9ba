"""Just enough of ``torch.cuda`` for the client's allocator reader, scripted.

On a machine with a GPU, CUDA is initialised in the test process itself (``torch.compile``
saves CUDA's RNG state; every Adam-family ``step()`` asks for the current CUDA stream), so
the client's CUDA paths run in tests that never meant them to. :func:`cuda_in_use` gives a
CPU machine the same state: the client's ``TorchMemory`` reads this fake instead of torch.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from gpuwatch.instrument._torchmem import TorchMemory

UUID = "GPU-00000000-fa4e-4b1d-9c0a-00000000a100"


class FakeCuda:
    """The ``torch.cuda`` functions ``TorchMemory`` calls; ``peak`` scripts the figures.

    Attributes:
        peak: Peak allocated bytes since the last reset; allocated is half of it and
            reserved equals it.
    """

    def __init__(self) -> None:
        self.peak = 0

    def current_device(self) -> int:
        return 0

    def synchronize(self, idx: int | None = None) -> None:
        pass

    def memory_stats_as_nested_dict(self, idx: int) -> dict[str, Any]:
        return {
            "allocated_bytes": {"all": {"current": self.peak // 2, "peak": self.peak}},
            "reserved_bytes": {"all": {"current": self.peak, "peak": self.peak}},
        }

    def reset_peak_memory_stats(self, idx: int) -> None:
        pass

    def device_count(self) -> int:
        return 1

    def get_device_properties(self, idx: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(uuid=UUID, name="NVIDIA Fake H100", total_memory=80 << 30)

    def mem_get_info(self, idx: int | None = None) -> tuple[int, int]:
        return 70 << 30, 80 << 30


def cuda_in_use(memory: TorchMemory, monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    """Make ``memory`` see CUDA initialised, served by a :class:`FakeCuda` (undone after)."""
    cuda = FakeCuda()
    monkeypatch.setattr(memory, "active", True)
    monkeypatch.setattr(memory, "_torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(memory, "_devices", None)
    return cuda
