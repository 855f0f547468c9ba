"""Allocator figures from inside the training process, read only when CUDA is in use.

torch is never imported here: the process imported it or it did not. On a CPU-only run
:meth:`TorchMemory.boundary` returns ``None`` after one cheap check, so no memory figures are
sent and the dashboard samples the process's RSS instead.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from . import _native
from ._userpeaks import UserPeaks

SHARED_NS = 20_000
"""Boundaries closer than this (20 us) to the end of the previous allocator read are one
instant and share that read: the Python between the end of one phase and the start of the
next, or between nested enters, cannot allocate more than a few small tensors, and what it
does allocate is counted in the next read's peak (the next phase's), never lost. Counted
from the read's end, not its start: a read that itself takes longer than the window would
otherwise never be shared."""

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

    With peaks on, the user's own peak queries are kept whole (``_userpeaks.py``). Reads go
    through torch's Python bindings until the native reader (``_native.py``), built on a
    background thread when CUDA comes into use, has answered like them once.
    """

    __slots__ = (
        "_bound",
        "_candidate",
        "_carry",
        "_countdown",
        "_device",
        "_devices",
        "_native",
        "_native_mod",
        "_native_thread",
        "_read_event",
        "_read_t",
        "_reset",
        "_shared",
        "_stats",
        "_torch",
        "_user",
        "active",
        "clock",
        "last_device",
        "native_cache",
        "native_note",
        "on_active",
        "on_note",
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
        self._read_t = -SHARED_NS  # when the last read ended
        self._read_event = ""  # and its boundary's kind (or the last sharer's)
        self._shared: Figures | None = None  # its figures without peaks
        self.clock: Callable[[], int] = time.monotonic_ns  # the boundaries' clock
        # Said once in the recording (a mark, set by the phase API): which reader is used.
        self.on_note: Callable[[str], None] | None = None
        self.native_note: str | None = None  # what was said
        self.native_cache: Any = None  # where built readers are kept (None: the default)
        self._native_thread: threading.Thread | None = None
        # (module, how it was had), built and waiting for its check on the training thread.
        self._candidate: tuple[Any, str] | None = None
        self._native: Any = None  # the native reader's read(device, mode), once checked
        self._native_mod: Any = None  # and its module
        self._user: UserPeaks | None = None  # the ledger and the wrappers (peaks on)
        self._carry: dict[int, tuple[int, int]] = {}  # the user's, once installed

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
        self.start_native()
        if self.on_active is not None:
            try:
                self.on_active()
            except Exception:
                pass
        return True

    def start_native(self) -> None:
        """Build or load the native reader on a background thread (once; never here).

        The training thread checks and adopts it at its next boundary (see :meth:`_adopt`);
        until then, and where it cannot be had, reads go through torch's bindings.
        """
        if self._native_thread is not None or self._native is not None:
            return
        if not _native.enabled():
            self._note(f"allocator reader: Python ({_native.ENV}=0)")
            self._native_thread = threading.current_thread()  # nothing to start, ever
            return
        thread = threading.Thread(target=self._build_native, name="gpuwatch-native", daemon=True)
        self._native_thread = thread
        try:
            thread.start()
        except Exception as e:
            self._note(f"allocator reader: Python fallback (no thread: {e})")

    def _build_native(self) -> None:
        try:
            module, how = _native.build(self.native_cache)
        except _native.Unavailable as e:
            self._note(f"allocator reader: Python fallback ({e})")
            return
        except BaseException as e:  # a daemon thread: nothing may escape
            self._note(f"allocator reader: Python fallback ({type(e).__name__}: {e})")
            return
        self._candidate = (module, how)

    def _note(self, text: str) -> None:
        if self.native_note is not None:
            return  # said once
        self.native_note = text
        if self.on_note is not None:
            try:
                self.on_note(text)
            except Exception:
                pass

    def _adopt(self) -> None:
        """Check the built reader against torch's bindings once; use it if they agree.

        Both read back to back without a reset in between, on the training thread, so no
        allocation of this thread falls between them: current bytes and the two counters
        must be equal, and the peak the native reader saw cannot be above torch's.
        """
        candidate, self._candidate = self._candidate, None
        if candidate is None:
            return
        module, how = candidate
        try:
            idx = self._device()
            mine = module.read(idx, 1)
            stats = self._stats(idx)
            theirs = self._figures(idx, stats, True)
            same = (
                module.device() == idx
                and mine[:3] == theirs[:3]
                and mine[5:] == theirs[5:]
                and mine[3] <= theirs[3]
                and mine[4] <= theirs[4]
            )
        except Exception as e:
            self._note(f"allocator reader: Python fallback (check failed: {type(e).__name__}: {e})")
            return
        if not same:
            self._note(
                f"allocator reader: Python fallback (figures differ: native {mine}, torch {theirs})"
            )
            return
        self._native, self._native_mod = module.read, module
        self._device = module.device
        if self._user is not None:
            self._user.native = module
        self._note(f"allocator reader: native ({how})")

    def _wrap(self) -> None:
        """Keep the user's peak counters whole from the first reset gpuwatch makes."""
        user = UserPeaks(self._torch, self._stats, self._reset, self._device)
        binding = getattr(getattr(self._torch, "_C", None), "_cuda_resetPeakMemoryStats", None)
        if binding is not None and getattr(binding, "_gpuwatch_original", binding) is self._reset:
            user.install()  # gpuwatch resets through the raw binding: wrap the bindings
        user.native = self._native_mod
        self._user = user
        self._carry = user.carry

    def _bind(self) -> None:
        """Pick the allocator calls: torch's raw bindings where they work, else the public.

        ``torch.cuda.memory_stats_as_nested_dict`` and ``reset_peak_memory_stats`` wrap
        ``torch._C._cuda_memoryStats`` and ``_cuda_resetPeakMemoryStats`` with lazy-init and
        device-index handling that costs more than the read itself, at every phase boundary
        of the training thread. The raw names are private and may change between torch
        versions: each is used only after it answered once in the shape the public function
        gives, and any failure falls back to the public one. gpuwatch's own reads always
        call the originals, never its wrappers of them.
        """
        torch = self._torch
        cuda = torch.cuda
        raw = getattr(torch, "_C", None)

        def original(name: str) -> Any:
            fn = getattr(raw, name, None)
            return getattr(fn, "_gpuwatch_original", fn)

        stats = original("_cuda_memoryStats")
        reset = original("_cuda_resetPeakMemoryStats")
        device = original("_cuda_getDevice")
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
            probe = None
            if callable(stats):
                probe = stats(idx)
                if type(probe["allocated_bytes"]["all"]["current"]) is int:
                    self._stats = stats
            if callable(reset) and self.peaks:
                if self._stats is not stats:
                    probe = self._stats(idx)
                reset(idx)
                self._reset = reset
                self._wrap()  # from the first reset on, the user's peaks are kept
                self._user.fold(idx, probe)  # type: ignore[union-attr]
            elif callable(reset):
                self._reset = reset
        except Exception:
            pass  # whatever failed keeps the public call
        self._bound = torch

    def boundary(self, t: int = 0, event: str = "") -> Figures | None:
        """Figures at a phase boundary; peaks cover the time since the previous boundary.

        Args:
            t: The boundary's ``time.monotonic_ns()``.
            event: ``"begin"`` or ``"end"``. A boundary within :data:`SHARED_NS` of the end
                of the previous read on the same device is the same instant: phase A ends
                and B begins, or phases nest (begin-begin, end-end). The previous read
                serves it, without peaks. A phase's end never shares its own begin's read:
                what the phase allocated, however quickly, is its own peak.
        """
        if not self.active and not self.check_active():
            return None
        try:
            if self._bound is not self._torch:
                self._bind()
            if self._candidate is not None:
                self._adopt()
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
            peaks = self.peaks
            if peaks and self._user is None:
                self._wrap()
            native = self._native
            if native is not None:
                figures = native(idx, 2 if peaks else 0)
            else:
                stats = self._stats(idx)
                figures = self._figures(idx, stats, peaks)
                if peaks:
                    user = self._user
                    if user is not None:
                        user.fold(idx, stats)
                    self._reset(idx)
            self._read_t = self.clock()
            if self._carry:
                figures = self._user.take_carry(idx, figures)  # type: ignore[union-attr]
            self.last_device = idx
            self._read_event = event
            self._shared = (*figures[:3], None, None, *figures[5:])
            if figures[6] > self.retries:  # rare: the helper's call costs nothing per phase
                self._retried(figures[6])
            if self.on_peak is not None:
                high = figures[3] if figures[3] is not None else figures[1]
                if high > self.watermark:
                    self._peaked(self.on_peak, figures)
            return figures
        except Exception:
            return None

    def _retried(self, retries: int) -> None:
        """cudaMalloc retried since the last boundary: tell ``on_retry`` how often."""
        new, self.retries = retries - self.retries, retries
        if self.on_retry is not None:
            try:
                self.on_retry(new, retries)
            except Exception:
                pass  # the user's callback never breaks the run

    @staticmethod
    def _peaked(on_peak: Callable[[Figures], None], figures: Figures) -> None:
        """A read above the watermark: hand it to ``on_peak``."""
        try:
            on_peak(figures)
        except Exception:
            pass  # the user's callback never breaks the run

    def current(self, idx: int | None = None) -> Figures | None:
        """Current figures without touching the peak counters (safe from any thread)."""
        if not self.active:
            return None
        try:
            if idx is None:
                idx = self.last_device if self.last_device is not None else 0
            native = self._native
            if native is not None:
                return native(idx, 0)
            figures = self._read(idx)
            return (*figures[:3], None, None, *figures[5:])
        except Exception:
            return None

    def _read(self, idx: int) -> Figures:
        if self._bound is not self._torch:
            self._bind()
        return self._figures(idx, self._stats(idx), self.peaks)

    @staticmethod
    def _figures(idx: int, stats: Any, peaks: bool) -> Figures:
        # One call for every counter: torch.cuda.memory_allocated() and friends each
        # rebuild the whole flattened stats dict. The fragmentation figures come from the
        # same dict: inactive split blocks (cached, free, but part of a split segment, so
        # unusable for a larger request), cudaMalloc retries and OOMs.
        alloc = stats["allocated_bytes"]["all"]
        res = stats["reserved_bytes"]["all"]
        split = stats.get("inactive_split_bytes")
        frag = (
            split["all"]["current"] if split else 0,
            stats.get("num_alloc_retries", 0),
            stats.get("num_ooms", 0),
        )
        if peaks:
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
