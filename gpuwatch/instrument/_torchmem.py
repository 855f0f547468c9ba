"""Allocator figures from inside the training process, read only when CUDA is in use.

torch is never imported here: the process imported it or it did not. On a CPU-only run
:meth:`TorchMemory.boundary` returns ``None`` after one cheap check, so no memory figures are
sent and the dashboard samples the process's RSS instead.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

SHARED_NS = 20_000
"""Boundaries closer than this (20 us) are one instant and share one allocator read: the
Python between the end of one phase and the start of the next, or between nested enters,
cannot allocate more than a few small tensors, and what it does allocate is counted in the
next read's peak (the next phase's), never lost."""

Figures = tuple[int, int, int, "int | None", "int | None", int, int, int]
"""(torch device index, allocated, reserved, peak allocated, peak reserved, inactive split
bytes, allocation retries, allocator OOMs): bytes, then the allocator's two counters."""


class TorchMemory:
    """Reads and resets the CUDA caching allocator's counters at phase boundaries.

    Args:
        peaks: Reset the allocator's peak counters at each boundary so that each boundary
            reports the exact peak since the previous one. This clobbers any peak counters
            the user reads themselves (``torch.cuda.max_memory_allocated``); with
            ``GPUWATCH_PEAKS=0`` they are left alone and no peaks are reported.
        sync: Call ``torch.cuda.synchronize()`` before reading, so boundaries carry exact
            timing at the cost of stalling the host at every boundary.
    """

    __slots__ = (
        "_bound",
        "_countdown",
        "_device",
        "_devices",
        "_read_event",
        "_read_t",
        "_reset",
        "_shared",
        "_stats",
        "_torch",
        "active",
        "last_device",
        "on_active",
        "on_peak",
        "on_retry",
        "peaks",
        "retries",
        "sync",
        "watermark",
    )

    def __init__(self, *, peaks: bool = True, sync: bool = False) -> None:
        self.peaks = peaks
        self.sync = sync
        self.active = False
        self._countdown = 0
        self.last_device: int | None = None
        self._torch: Any = None
        self._devices: list[dict[str, Any]] | None = None
        # Set by the OOM forensics module: called once when CUDA turns out to be in use,
        # and at a boundary whose peak tops ``watermark`` (the callback raises it).
        self.on_active: Callable[[], None] | None = None
        self.on_peak: Callable[[Figures], None] | None = None
        self.watermark = 0
        # Called with (new retries, retries in all) at a boundary whose read shows that the
        # allocator retried cudaMalloc since the previous one (it freed its cache to make
        # room: fragmentation or a nearly full device). Set by the phase API: a mark.
        self.on_retry: Callable[[int, int], None] | None = None
        self.retries = 0
        # The allocator calls, bound to the torch module they came from (see _bind).
        self._bound: Any = None
        self._stats: Any = None
        self._reset: Any = None
        self._device: Any = None
        self._read_t = -SHARED_NS  # the last read's boundary time
        self._read_event = ""  # and its kind (or the last sharer's)
        self._shared: Figures | None = None  # its figures without peaks

    def check_active(self) -> bool:
        """True once this process has initialised CUDA (checked cheaply until it has).

        On a CPU-only run this is asked at every boundary, so the real check runs only at
        every 16th call: CUDA starting up is noticed within 16 boundaries.
        """
        if self.active:
            return True
        self._countdown -= 1
        if self._countdown > 0:
            return False
        self._countdown = 16
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        try:
            if not torch.cuda.is_initialized():
                return False
        except Exception:
            return False
        self._torch = torch
        self.active = True
        if self.on_active is not None:
            try:
                self.on_active()
            except Exception:
                pass
        return True

    def _bind(self) -> None:
        """Pick the allocator calls: torch's raw bindings where they work, else the public.

        ``torch.cuda.memory_stats_as_nested_dict`` and ``reset_peak_memory_stats`` wrap
        ``torch._C._cuda_memoryStats`` and ``_cuda_resetPeakMemoryStats`` with lazy-init and
        device-index handling that costs more than the read itself, at every phase boundary
        of the training thread. The raw names are private and may change between torch
        versions: each is used only after it answered once in the shape the public function
        gives, and any failure falls back to the public one.
        """
        torch = self._torch
        cuda = torch.cuda
        raw = getattr(torch, "_C", None)
        stats = getattr(raw, "_cuda_memoryStats", None)
        reset = getattr(raw, "_cuda_resetPeakMemoryStats", None)
        device = getattr(raw, "_cuda_getDevice", None)
        self._stats, self._reset, self._device = (
            cuda.memory_stats_as_nested_dict,
            cuda.reset_peak_memory_stats,
            cuda.current_device,
        )
        try:
            idx = device() if callable(device) else None
            if type(idx) is int and idx == cuda.current_device():
                self._device = device
            idx = self._device()
            if callable(stats):
                probe = stats(idx)
                if type(probe["allocated_bytes"]["all"]["current"]) is int:
                    self._stats = stats
            if callable(reset) and self.peaks:
                reset(idx)
                self._reset = reset
        except Exception:
            pass  # whatever failed keeps the public call
        self._bound = torch

    def boundary(self, t: int = 0, event: str = "") -> Figures | None:
        """Figures at a phase boundary; peaks cover the time since the previous boundary.

        Args:
            t: The boundary's ``time.monotonic_ns()``.
            event: ``"begin"`` or ``"end"``. A boundary within :data:`SHARED_NS` of the
                previous read on the same device is the same instant: phase A ends and B
                begins, or phases nest (begin-begin, end-end). The previous read serves it,
                without peaks. A phase's end never shares its own begin's read: what the
                phase allocated, however quickly, is its own peak.
        """
        if not self.active and not self.check_active():
            return None
        try:
            if self._bound is not self._torch:
                self._bind()
            idx = self._device()
            if (
                t
                and 0 <= t - self._read_t < SHARED_NS
                and idx == self.last_device
                and not (event == "end" and self._read_event == "begin")
            ):
                self._read_event = event  # begin -> begin -> end: the end reads
                return self._shared
            if self.sync:
                self._torch.cuda.synchronize(idx)
            figures = self._read(idx)
            if self.peaks:
                self._reset(idx)
            self.last_device = idx
            self._read_t, self._read_event = t, event
            self._shared = (*figures[:3], None, None, *figures[5:])
            if figures[6] > self.retries:
                new, self.retries = figures[6] - self.retries, figures[6]
                if self.on_retry is not None:
                    try:
                        self.on_retry(new, figures[6])
                    except Exception:
                        pass
            if self.on_peak is not None:
                high = figures[3] if figures[3] is not None else figures[1]
                if high > self.watermark:
                    try:
                        self.on_peak(figures)
                    except Exception:
                        pass
            return figures
        except Exception:
            return None

    def current(self, idx: int | None = None) -> Figures | None:
        """Current figures without touching the peak counters (safe from any thread)."""
        if not self.active:
            return None
        try:
            if idx is None:
                idx = self.last_device if self.last_device is not None else 0
            figures = self._read(idx)
            return (*figures[:3], None, None, *figures[5:])
        except Exception:
            return None

    def _read(self, idx: int) -> Figures:
        # One call for every counter: torch.cuda.memory_allocated() and friends each
        # rebuild the whole flattened stats dict. The fragmentation figures come from the
        # same dict: inactive split blocks (cached, free, but part of a split segment, so
        # unusable for a larger request), cudaMalloc retries and OOMs.
        if self._bound is not self._torch:
            self._bind()
        stats = self._stats(idx)
        alloc = stats["allocated_bytes"]["all"]
        res = stats["reserved_bytes"]["all"]
        split = stats.get("inactive_split_bytes")
        frag = (
            split["all"]["current"] if split else 0,
            stats.get("num_alloc_retries", 0),
            stats.get("num_ooms", 0),
        )
        if self.peaks:
            return (idx, alloc["current"], res["current"], alloc["peak"], res["peak"], *frag)
        return (idx, alloc["current"], res["current"], None, None, *frag)

    def devices(self) -> list[dict[str, Any]] | None:
        """Visible CUDA devices with their UUIDs, for mapping torch's index to NVML's."""
        if not self.active:
            return None
        if self._devices is None:
            try:
                cuda = self._torch.cuda
                found = []
                for i in range(cuda.device_count()):
                    props = cuda.get_device_properties(i)
                    found.append(
                        {
                            "index": i,
                            "uuid": str(getattr(props, "uuid", "")),
                            "name": str(props.name),
                            "total": int(props.total_memory),
                        }
                    )
                self._devices = found
            except Exception:
                return None
        return self._devices

    def mem_get_info(self, idx: int | None) -> tuple[int, int] | None:
        """(free, total) bytes on the device as the driver sees it, or None."""
        if not self.active:
            return None
        try:
            free, total = self._torch.cuda.mem_get_info(idx)
            return int(free), int(total)
        except Exception:
            return None
