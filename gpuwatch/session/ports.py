"""What the session's neighbours need of it and give it, as protocols: its ports.

A producer is written against the narrowest port it needs, so that a stand-in (the GPU
sampler's outbox in its own process) is checked by the type checker, not by a comment.
The recording attaches itself through :class:`RecordingPort` and learns what changed
from the typed :data:`SessionEvent`\\ s, so neither side reaches into the other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeAlias

import numpy as np

from ..protocol import Message
from .model import Device, GpuProcRow, Mark

if TYPE_CHECKING:
    from .table import Archive


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


# ---------------------------------------------------------------------- the recording


class MarkSource(Protocol):
    """Where the marks a session let go of are read back from (its recording)."""

    def between(self, t0: int, t1: int, limit: int = ...) -> list[Mark]:
        """Marks timed within ``[t0, t1]``, the first ``limit`` in time."""

    def times(self) -> tuple[np.ndarray, np.ndarray]:
        """Every mark's time and pid."""

    def every(self) -> Iterator[Mark]:
        """Every mark, in the order written."""


class RecordingPort(Protocol):
    """What a recording being written gives back to a session that lets go of rows the
    file holds (see :meth:`~gpuwatch.session.retention.Retention.attach`).

    The session tells it back which marks the file holds with
    :meth:`~gpuwatch.session.retention.Retention.marks_recorded`, and which processes the
    file holds whole with :meth:`~gpuwatch.session.retention.Retention.settle`.
    """

    @property
    def marks(self) -> MarkSource:
        """The marks the file holds, read on demand."""

    def reopen(
        self, kind: str, key: str, rows: int, span: tuple[int, int] | None
    ) -> Archive | None:
        """The archive of a settled process's series (``kind``, its pid as text ``key``,
        the ``rows`` and time ``span`` it had), or None where the file has none. Called
        from any thread."""


# ---------------------------------------------------------------------- events


class DeviceChanged(NamedTuple):
    """A device was added, or its state or fields changed."""

    device: Device


class GpuSampled(NamedTuple):
    """One NVML sample of a GPU (keys of ``GPU_COLUMNS``)."""

    key: str
    row: dict[str, float | int | None]


class GpuProcessesSampled(NamedTuple):
    """A snapshot of NVML's process list on one GPU."""

    key: str
    t: int
    rows: list[GpuProcRow]


class HostSampled(NamedTuple):
    """One host memory sample."""

    row: dict[str, int]


class RssSampled(NamedTuple):
    """The RSS of an instrumented process, as the gpuwatch process sampled it."""

    pid: int
    t: int
    rss: int
    cpu: float | None = None  # CPU % (100: one core), None: unknown


class ProcessDescribed(NamedTuple):
    """A process's name, user and command line changed."""

    pid: int
    info: dict[str, Any]


class ProcessGone(NamedTuple):
    """The host sampler found an instrumented process gone."""

    pid: int
    t: int


class MarkAdded(NamedTuple):
    """A mark from gpuwatch itself (a fault it found)."""

    mark: Mark


class Rejected(NamedTuple):
    """The receiver refused a datagram."""

    reason: str


class Noted(NamedTuple):
    """A new one-line notice."""

    text: str


SessionEvent: TypeAlias = (
    DeviceChanged
    | GpuSampled
    | GpuProcessesSampled
    | HostSampled
    | RssSampled
    | ProcessDescribed
    | ProcessGone
    | Message
    | MarkAdded
    | Rejected
    | Noted
)
"""Every fact a session passes to its listeners, one class per kind. A message from an
instrumented process, applied, is its own event: the validated :class:`Message` (the
hot path, thousands a second, makes no wrapper for it)."""

Listener = Callable[[SessionEvent], None]
"""Called with every event, on the thread that added the fact: it must stay cheap."""
