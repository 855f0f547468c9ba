"""Plain records of the session: devices, processes, phase spans, marks and OOMs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

HOST = "host"
"""Device key of the host (RAM and the RSS of instrumented processes)."""

GPU_COLUMNS = (
    ("t", "i8"),
    ("used", "i8"),
    ("free", "i8"),
    ("total", "i8"),
    ("reserved", "i8"),  # driver-reserved memory (nvmlDeviceGetMemoryInfo_v2)
    ("util_gpu", "f4"),
    ("util_mem", "f4"),
    ("temp", "f4"),
    ("power", "f4"),  # watts
    ("power_limit", "f4"),
    ("clock_sm", "f4"),  # MHz
    ("clock_mem", "f4"),
)
HOST_COLUMNS = (
    ("t", "i8"),
    ("total", "i8"),
    ("used", "i8"),
    ("available", "i8"),
    # The overview's host row (absent from older recordings: unknown):
    ("cpu", "f4"),  # CPU busy, % of all cores since the previous sample
    ("load1", "f4"),  # the 1-minute load average
    ("swap_used", "i8"),
    ("swap_total", "i8"),
)
TORCH_COLUMNS = (
    ("t", "i8"),
    ("dev", "i8"),  # torch device index inside the process
    ("allocated", "i8"),
    ("reserved", "i8"),
    # From the same allocator read (absent from older recordings: unknown):
    ("inactive_split", "i8"),  # cached free bytes in split blocks: fragmentation
    ("alloc_retries", "i8"),  # cudaMalloc retries after freeing the cache (cumulative)
    ("alloc_ooms", "i8"),  # out-of-memory errors the allocator raised (cumulative)
)
PEAK_COLUMNS = (
    ("t1", "i8"),  # the boundary that reported the peak
    ("t0", "i8"),  # the previous boundary: the peak happened somewhere in between
    ("dev", "i8"),
    ("peak_allocated", "i8"),
    ("peak_reserved", "i8"),
)
RSS_COLUMNS = (
    ("t", "i8"),
    ("rss", "i8"),
    # CPU % (100: one core) over the last second or more; unknown in older recordings.
    ("cpu", "f4"),
)


class PhaseRow(NamedTuple):
    """One ended span, a row of a process's ``phases`` table (:data:`PHASE_COLUMNS`).

    Unknown integers are :data:`~gpuwatch.session.table.MISSING_INT`.
    """

    t1: int  # end time: spans are appended as they end
    t0: int
    name: int  # index into Session.names
    step: int
    depth: int
    id: int
    parent: int
    dev: int
    alloc0: int
    reserved0: int
    alloc1: int
    reserved1: int
    peak_alloc: int  # exact peak allocated inside the span (from the allocator)
    peak_reserved: int
    error: int  # 1: it ended by an exception


PHASE_COLUMNS = tuple(
    zip(
        PhaseRow._fields,
        ("i8", "i8", "i4", "i8", "i2", "i8", "i8", "i8", "i8", "i8", "i8", "i8", "i8", "i8", "i1"),
        strict=True,
    )
)
GPU_PROC_COLUMNS = (
    ("t", "i8"),
    ("pid", "i8"),
    ("used", "i8"),
    ("type", "i1"),
    # Unknown in recordings made before they were added, and where not offered:
    ("sm", "f4"),  # SM % of this process (NVML's per-process utilisation samples)
    ("mem_util", "f4"),  # memory-controller % of this process (same samples)
    ("cpu", "f4"),  # host CPU % (100: one core) since the previous snapshot
    ("rss", "i8"),  # host resident memory, bytes
)
"""NVML's process list per GPU; ``type`` 0 compute, 1 graphics, 2 both (one row per PID),
with each process's utilisation and host figures. One snapshot = one ``t``."""

GpuProcRow = (
    tuple[int, int | None, int]
    | tuple[int, int | None, int, float | None, float | None, float | None, int | None]
)
"""One process of a snapshot: (pid, used, type[, sm, mem_util, cpu, rss]); None: unknown."""


def norm_uuid(uuid: str | None) -> str:
    """Compare NVML's ``GPU-xxxx`` and torch's bare ``xxxx`` UUIDs as the same string."""
    u = (uuid or "").strip().lower()
    return u[4:] if u.startswith("gpu-") else u


def gpu_key(uuid: str) -> str:
    """Device key of a GPU with this UUID."""
    return "gpu:" + norm_uuid(uuid)


def origin_key(origin: str, key: str) -> str:
    """A device key inside a merged replay: ``<origin>/<key>`` (origin: the recording's host)."""
    return f"{origin}/{key}" if origin else key


def is_host(key: str | None) -> bool:
    """True for the key of a host device (``host``, or ``<origin>/host`` when merged)."""
    return key is not None and (key == HOST or key.endswith("/" + HOST))


@dataclass
class Device:
    """A device shown as one panel: a GPU (by UUID) or the host.

    Attributes:
        key: ``"host"`` or ``"gpu:<uuid>"``.
        kind: ``"gpu"`` or ``"host"``.
        index: NVML's index (not torch's: CUDA_VISIBLE_DEVICES reorders).
        name: Product name, or the host name.
        uuid: NVML UUID.
        bus_id: PCI bus id.
        total: Total memory in bytes.
        state: ``"ok"``, ``"lost"`` (fell off the bus) or ``"error"``.
        note: Why the state is not ok, or what is not available here.
        source: ``"nvml"``, ``"torch"`` (known only from a script's hello) or ``"host"``.
        origin: In a merged replay, the recording it came from (its host name); else "".
        extra: What else is known: ``driver``; for a MIG instance ``mig_parent`` (its
            GPU's key) and ``mig_slot`` (see :attr:`mig`).
    """

    key: str
    kind: str
    index: int | None = None
    name: str = ""
    uuid: str | None = None
    bus_id: str | None = None
    total: int | None = None
    state: str = "ok"
    note: str = ""
    source: str = "nvml"
    extra: dict[str, Any] = field(default_factory=dict)
    origin: str = ""

    @property
    def mig(self) -> tuple[str, int] | None:
        """For a MIG instance, its GPU's key and its slot (``extra``'s ``mig_parent`` and
        ``mig_slot``, checked: a recording's are hostile); None for a whole GPU."""
        parent, slot = self.extra.get("mig_parent"), self.extra.get("mig_slot")
        if not isinstance(parent, str) or type(slot) is not int or not 0 <= slot < 64:
            return None
        return (origin_key(self.origin, parent) if self.origin else parent), slot


@dataclass
class OpenSpan:
    """A phase that has begun and not yet ended."""

    id: int
    name: str
    t0: int
    step: int | None
    depth: int
    parent: int | None
    dev: int | None = None
    alloc0: int | None = None
    reserved0: int | None = None
    peak_alloc: int | None = None
    peak_reserved: int | None = None


@dataclass
class Mark:
    """A point event from a script (``level`` info / warning / error)."""

    t: int
    pid: int
    text: str
    level: str = "info"
    step: int | None = None


@dataclass
class Oom:
    """An out-of-memory error reported by a script."""

    t: int
    pid: int
    body: dict[str, Any]
