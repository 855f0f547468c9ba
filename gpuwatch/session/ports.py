"""What the session's neighbours need of it, as protocols: the ports of :class:`Session`.

A producer is written against the narrowest port it needs, so that a stand-in (the GPU
sampler's outbox in its own process) is checked by the type checker, not by a comment.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from .model import Device, GpuProcRow


class GpuSampleSink(Protocol):
    """What the NVML sampler calls: implemented by ``Session`` and by the sampler process's
    outbox, which sends each call to the parent."""

    def note(self, text: str) -> None:
        """A line for the log (a lost GPU, a slow NVML)."""

    def add_device(self, device: Device) -> Device:
        """Register a GPU (or update one with the same key)."""

    def set_device_state(self, key: str, state: str, note: str = "") -> None:
        """Mark a device lost, in error, or ok again."""

    def add_gpu_sample(self, key: str, row: dict[str, float | int | None]) -> None:
        """One NVML sample of ``GPU_COLUMNS``."""

    def add_gpu_processes(self, key: str, t: int, rows: Iterable[GpuProcRow]) -> None:
        """A snapshot of NVML's process list on one GPU."""

    def set_proc_info(self, pid: int, info: dict[str, Any]) -> None:
        """Name, user and command line of a process, read once."""

    def set_sampler_rate(self, key: str, rate: float) -> None:
        """The achieved samples per second on one GPU (0 while it is lost)."""
