"""A scripted CUDA caching allocator in Python, with every counter torch's stats dict has.

``stats(idx)`` returns a fresh nested dict in the shape of ``torch._C._cuda_memoryStats``
(torch/csrc/cuda/Module.cpp): the nine stat arrays (``all``, ``small_pool``, ``large_pool``,
each ``current``/``peak``/``allocated``/``freed``), the two oversize stats, private pools
keyed by their id tuple, and the plain counters. ``reset(idx)`` resets every peak, as
``resetPeakStats`` does. A ``clock`` with ``stats_ns``/``reset_ns`` makes each call take
that long on a fake clock.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

MIB = 1024**2
ARRAYS = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
POOLS = ("all", "small_pool", "large_pool")
OVERSIZE = ("oversize_allocations", "oversize_segments")
SEGMENT = 2 * MIB  # reserved memory grows in segments of this size (or the request's)


class Stat:
    __slots__ = ("allocated", "current", "freed", "peak")

    def __init__(self) -> None:
        self.current = self.peak = self.allocated = self.freed = 0

    def increase(self, n: int) -> None:
        self.current += n
        self.peak = max(self.peak, self.current)
        self.allocated += n

    def decrease(self, n: int) -> None:
        self.current -= n
        self.freed += n

    def as_dict(self) -> dict[str, int]:
        return {
            "current": self.current,
            "peak": self.peak,
            "allocated": self.allocated,
            "freed": self.freed,
        }


class Device:
    """One device's counters."""

    def __init__(self) -> None:
        self.arrays = {name: {p: Stat() for p in POOLS} for name in ARRAYS}
        self.oversize = {name: Stat() for name in OVERSIZE}
        self.private: dict[tuple[int, int], dict[str, Stat]] = {}
        self.retries = self.ooms = 0

    def bump(self, name: str, pool: str, n: int) -> None:
        arr = self.arrays[name]
        if n >= 0:
            arr["all"].increase(n)
            arr[pool].increase(n)
        else:
            arr["all"].decrease(-n)
            arr[pool].decrease(-n)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "num_alloc_retries": self.retries,
            "num_ooms": self.ooms,
            "max_split_size": -1,
            "num_sync_all_streams": 0,
            "num_device_alloc": 0,
            "num_device_free": 0,
        }
        for name, arr in self.arrays.items():
            out[name] = {p: s.as_dict() for p, s in arr.items()}
        for name, s in self.oversize.items():
            out[name] = s.as_dict()
        out["reserved_bytes_by_private_pools"] = {
            pid: {p: s.as_dict() for p, s in arr.items()} for pid, arr in self.private.items()
        }
        return out

    def reset_peaks(self) -> None:
        stats = [s for arr in self.arrays.values() for s in arr.values()]
        stats += list(self.oversize.values())
        stats += [s for arr in self.private.values() for s in arr.values()]
        for s in stats:
            s.peak = s.current


class Allocator:
    """Devices' counters, moved by :meth:`alloc` and :meth:`free`; each call counted."""

    def __init__(self, devices: int = 2) -> None:
        self.devices = [Device() for _ in range(devices)]
        self.device = 0  # the current device
        self.calls: dict[str, int] = {}
        self.clock: Any = None
        self.stats_ns = 0
        self.reset_ns = 0

    # The script.

    def alloc(self, n: int, dev: int | None = None) -> None:
        d = self.devices[self.device if dev is None else dev]
        pool = "small_pool" if n < MIB else "large_pool"
        d.bump("allocation", pool, 1)
        d.bump("active", pool, 1)
        for name in ("allocated_bytes", "active_bytes", "requested_bytes"):
            d.bump(name, pool, n)
        short = (
            d.arrays["allocated_bytes"]["all"].current - d.arrays["reserved_bytes"]["all"].current
        )
        if short > 0:
            d.bump("segment", pool, 1)
            d.bump("reserved_bytes", pool, max(short, SEGMENT))
        if n >= 64 * MIB:
            d.oversize["oversize_allocations"].increase(1)

    def free(self, n: int, dev: int | None = None) -> None:
        d = self.devices[self.device if dev is None else dev]
        pool = "small_pool" if n < MIB else "large_pool"
        d.bump("allocation", pool, -1)
        d.bump("active", pool, -1)
        for name in ("allocated_bytes", "active_bytes", "requested_bytes"):
            d.bump(name, pool, -n)
        if n >= 64 * MIB:
            d.oversize["oversize_allocations"].decrease(1)

    def private_pool(self, pid: tuple[int, int], n: int, dev: int | None = None) -> None:
        d = self.devices[self.device if dev is None else dev]
        arr = d.private.setdefault(pid, {p: Stat() for p in POOLS})
        for p in ("all", "large_pool"):
            if n >= 0:
                arr[p].increase(n)
            else:
                arr[p].decrease(-n)

    def empty_cache(self, dev: int | None = None) -> None:
        d = self.devices[self.device if dev is None else dev]
        extra = (
            d.arrays["reserved_bytes"]["all"].current - d.arrays["allocated_bytes"]["all"].current
        )
        if extra > 0:
            d.bump("reserved_bytes", "large_pool", -extra)

    @property
    def current(self) -> int:
        return self.devices[self.device].arrays["allocated_bytes"]["all"].current

    # torch's side.

    def count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def stats(self, idx: int) -> dict[str, Any]:
        if self.clock is not None:
            self.clock.advance(self.stats_ns)
        return self.devices[idx].stats()

    def reset(self, idx: int) -> None:
        if self.clock is not None:
            self.clock.advance(self.reset_ns)
        self.devices[idx].reset_peaks()


def fake_torch(alloc: Allocator, *, raw: bool = True, raw_stats: Any = None) -> Any:
    """A torch module of namespaces: ``cuda``'s public functions and ``_C``'s bindings."""

    def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            alloc.count(name)
            return fn(*args)

        return call

    cuda = types.SimpleNamespace(
        current_device=counted("current_device", lambda: alloc.device),
        synchronize=counted("synchronize", lambda idx=None: None),
        memory_stats_as_nested_dict=counted("memory_stats_as_nested_dict", alloc.stats),
        reset_peak_memory_stats=counted("reset_peak_memory_stats", alloc.reset),
    )
    C = types.SimpleNamespace()
    if raw:
        C._cuda_memoryStats = counted("_cuda_memoryStats", raw_stats or alloc.stats)
        C._cuda_resetPeakMemoryStats = counted("_cuda_resetPeakMemoryStats", alloc.reset)
        C._cuda_getDevice = counted("_cuda_getDevice", lambda: alloc.device)
    return types.SimpleNamespace(cuda=cuda, _C=C)


class Clock:
    """A fake ``time.monotonic_ns``."""

    def __init__(self) -> None:
        self.now = 10**12

    def __call__(self) -> int:
        return self.now

    def advance(self, ns: int) -> None:
        self.now += ns


def flat(stats: Any) -> list[tuple[str, Any]]:
    """Every figure of a nested stats dict, flattened as ``torch.cuda.memory_stats`` does
    (sorted): two views compare whole."""
    out: list[tuple[str, Any]] = []

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                key = "_".join(map(str, k)) if isinstance(k, tuple) else str(k)
                walk(f"{prefix}.{key}" if prefix else key, v)
        else:
            out.append((prefix, node))

    walk("", stats)
    return sorted(out)
