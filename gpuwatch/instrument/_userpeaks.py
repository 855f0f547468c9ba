"""The user's peak counters, as they would be without gpuwatch.

gpuwatch resets the CUDA allocator's peak counters at its phase boundaries, to report an
exact peak per phase. Left at that, ``torch.cuda.max_memory_allocated()`` would answer only
the peak since gpuwatch's last boundary. So gpuwatch keeps, per device, a ledger of the
peaks it reset away since the user's own last reset (every peak of the stats: counts and
bytes, each pool, oversize counters, private pools), and wraps the four torch bindings
every peak query and reset goes through:

- ``torch._C._cuda_memoryStats`` and ``torch._C._accelerator_getDeviceStats`` (behind
  ``torch.cuda.memory_stats``, ``max_memory_allocated``, ``max_memory_reserved``,
  ``memory_summary`` and ``torch.accelerator``'s): the real dict, each peak raised to the
  ledger's where the ledger's is higher;
- ``torch._C._cuda_resetPeakMemoryStats`` and ``torch._C._accelerator_resetPeakStats``: the
  real allocated and reserved peaks are kept first as a carry for gpuwatch's next boundary
  (its own phase peak stays exact across the user's reset), then the real reset, then the
  ledger is emptied.

gpuwatch's own reads use the original functions. A wrapper calls the original first and
returns or raises exactly what it does; its own work is skipped on any error.

Folding a Python read into the ledger walks a dict of some forty stats: the training
thread only queues the dict (:meth:`UserPeaks.queue`), and the fold runs when the sender
thread asks for figures, when a wrapper is called, or on the training thread only when the
queue is long. The dict is freed wherever it is folded, off the boundary too.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

Path = tuple[Any, ...]
"""The keys down to one stat's dict: ``("allocated_bytes", "all")``, ``("oversize_segments",)``,
``("reserved_bytes_by_private_pools", (0, 1), "all")``."""

QUEUE_LIMIT = 64
"""Queued reads beyond which the training thread folds them itself (bounds the memory the
queue holds where the sender thread does not run)."""

WRAPPED = (
    ("_cuda_memoryStats", "_cuda_resetPeakMemoryStats"),
    ("_accelerator_getDeviceStats", "_accelerator_resetPeakStats"),
)
"""(stats, reset) binding names of ``torch._C``, wrapped where present."""


def peak_stats(stats: Any, path: Path = ()) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every dict in a nested stats dict that holds a ``peak``, with its path."""
    for key, value in stats.items():
        if type(value) is dict:
            if "peak" in value:
                yield (*path, key), value
            else:
                yield from peak_stats(value, (*path, key))


def _index(device: Any, current: Callable[[], int]) -> int | None:
    """The device index a binding was called with (``None``/negative: the current one)."""
    if device is None:
        return current()
    if type(device) is int:
        return device if device >= 0 else current()
    index = getattr(device, "index", device)
    if index is None:
        return current()
    return int(index)


class UserPeaks:
    """The ledger of reset-away peaks and the wrappers that show them to the user.

    Args:
        torch: The torch module (its ``_C`` is wrapped).
        stats: The original ``_cuda_memoryStats``.
        reset: The original ``_cuda_resetPeakMemoryStats``.
        device: The original current-device call.
    """

    def __init__(
        self, torch: Any, stats: Callable[[int], Any], reset: Callable[[int], Any],
        device: Callable[[], int],
    ) -> None:  # fmt: skip
        self.torch = torch
        self.stats = stats
        self.reset = reset
        self.device = device
        self.ledgers: dict[int, dict[Path, int]] = {}
        self.pending: deque[tuple[int, Any]] = deque()
        # (allocated peak, reserved peak) reset by the user since gpuwatch's last read, by
        # device: gpuwatch's next boundary on that device reports at least these.
        self.carry: dict[int, tuple[int, int]] = {}
        self.native: Any = None  # the native reader once adopted (its ledger is in C++)
        self.originals: dict[str, Any] = {}
        self._lock = threading.Lock()

    def install(self) -> None:
        """Wrap the bindings of ``torch._C`` that exist (once)."""
        raw = getattr(self.torch, "_C", None)
        if raw is None or self.originals:
            return
        cuda_accelerator = self._accelerator_is_cuda()
        for stats_name, reset_name in WRAPPED:
            if stats_name.startswith("_accelerator") and not cuda_accelerator:
                continue
            stats = getattr(raw, stats_name, None)
            reset = getattr(raw, reset_name, None)
            if not callable(stats) or not callable(reset):
                continue
            if getattr(stats, "_gpuwatch_original", None) is not None:
                continue  # wrapped already (a second TorchMemory in one process)
            self.originals[stats_name], self.originals[reset_name] = stats, reset
            setattr(raw, stats_name, self._stats_wrapper(stats))
            setattr(raw, reset_name, self._reset_wrapper(reset))

    def _accelerator_is_cuda(self) -> bool:
        try:
            acc = self.torch.accelerator.current_accelerator()
            return acc is not None and acc.type == "cuda"
        except Exception:
            return False

    def _stats_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def stats(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            try:
                if type(out) is dict and out:
                    arg = args[0] if args else next(iter(kwargs.values()), None)
                    idx = _index(arg, self.device)
                    if idx is not None:
                        self.raise_peaks(out, idx)
            except Exception:
                pass
            return out

        stats._gpuwatch_original = original  # type: ignore[attr-defined]
        stats.__name__ = getattr(original, "__name__", "stats")
        stats.__doc__ = getattr(original, "__doc__", None)
        return stats

    def _reset_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def reset(*args: Any, **kwargs: Any) -> Any:
            idx = None
            try:
                arg = args[0] if args else next(iter(kwargs.values()), None)
                idx = _index(arg, self.device)
                if idx is not None:
                    self.keep_carry(idx)
            except Exception:
                pass
            out = original(*args, **kwargs)
            try:
                if idx is not None:
                    self.forget(idx)
            except Exception:
                pass
            return out

        reset._gpuwatch_original = original  # type: ignore[attr-defined]
        reset.__name__ = getattr(original, "__name__", "reset")
        reset.__doc__ = getattr(original, "__doc__", None)
        return reset

    def queue(self, idx: int, stats: Any) -> None:
        """A Python read about to be reset: fold it into the ledger (soon, maybe elsewhere)."""
        pending = self.pending
        pending.append((idx, stats))
        if len(pending) > QUEUE_LIMIT:
            self.drain(blocking=False)

    def drain(self, blocking: bool = True) -> None:
        """Fold every queued read into the ledgers (any thread)."""
        if not self.pending:
            return
        if not self._lock.acquire(blocking):
            return
        try:
            pending = self.pending
            while pending:
                try:
                    idx, stats = pending.popleft()
                except IndexError:
                    break
                ledger = self.ledgers.setdefault(idx, {})
                for path, stat in peak_stats(stats):
                    peak = stat["peak"]
                    if peak > ledger.get(path, -1):
                        ledger[path] = peak
        finally:
            self._lock.release()

    def ledger(self, idx: int) -> dict[Path, int]:
        """The peaks gpuwatch reset away on ``idx`` since the user's last reset."""
        self.drain()
        with self._lock:
            out: dict[Path, int] = dict(self.ledgers.get(idx, {}))
        native = self.native
        if native is not None:
            for path, peak in (native.ledger(idx) or {}).items():
                if peak > out.get(path, -1):
                    out[path] = peak
        return out

    def raise_peaks(self, stats: dict[str, Any], idx: int) -> None:
        """Raise each peak of a stats dict the user asked for to the ledger's."""
        for path, peak in self.ledger(idx).items():
            node: Any = stats
            for key in path:
                node = node.get(key) if type(node) is dict else None
            if type(node) is dict:
                real = node.get("peak")
                if type(real) is int and peak > real:
                    node["peak"] = peak

    def keep_carry(self, idx: int) -> None:
        """The user is about to reset: keep the real peaks for gpuwatch's next boundary."""
        native = self.native
        if native is not None:
            fig = native.read(idx, 1)
            alloc, res = fig[3], fig[4]
        else:
            stats = self.stats(idx)
            alloc = stats["allocated_bytes"]["all"]["peak"]
            res = stats["reserved_bytes"]["all"]["peak"]
        old = self.carry.get(idx)
        if old is not None:
            alloc, res = max(alloc, old[0]), max(res, old[1])
        self.carry[idx] = (alloc, res)

    def forget(self, idx: int) -> None:
        """The user reset the peaks: what gpuwatch reset away before no longer counts."""
        self.drain()
        with self._lock:
            self.ledgers.pop(idx, None)
        native = self.native
        if native is not None:
            native.clear(idx)

    def take_carry(self, idx: int, figures: Any) -> Any:
        """``figures`` with peaks at least the carry kept for ``idx`` (which is used up)."""
        kept = self.carry.pop(idx, None)
        if kept is None or figures[3] is None:
            return figures
        return (*figures[:3], max(figures[3], kept[0]), max(figures[4], kept[1]), *figures[5:])

    def uninstall(self) -> None:
        """Put the original bindings back (tests)."""
        raw = getattr(self.torch, "_C", None)
        for name, original in self.originals.items():
            try:
                setattr(raw, name, original)
            except Exception:
                pass
        self.originals.clear()
