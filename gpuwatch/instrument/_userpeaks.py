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

The Python reader folds the dict it just read into the ledger before its reset, on the
training thread, reading the thirty-odd peaks by name (a generic walk would cost as much as
torch took to build the dict). Keeping the dicts to fold and free later, on the sender
thread, was tried and measured slower: the interpreter's garbage collector then traverses
them at every collection. The native reader folds in C++. Every change to a ledger is one
assignment, so concurrent readers under the GIL need no lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Path = tuple[Any, ...]
"""The keys down to one stat's dict: ``("allocated_bytes", "all")``, ``("oversize_segments",)``,
``("reserved_bytes_by_private_pools", (0, 1), "all")``."""

WRAPPED = (
    ("_cuda_memoryStats", "_cuda_resetPeakMemoryStats"),
    ("_accelerator_getDeviceStats", "_accelerator_resetPeakStats"),
)
"""(stats, reset) binding names of ``torch._C``, wrapped where present."""


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
"""The stat arrays of torch's stats dict (c10's DeviceStats), each by pool: ``all``,
``small_pool``, ``large_pool``."""
OVERSIZE = ("oversize_allocations", "oversize_segments")
PATHS: tuple[Path, ...] = (
    *((name, pool) for name in ARRAYS for pool in ("all", "small_pool", "large_pool")),
    *((name,) for name in OVERSIZE),
)
"""The stats a :class:`Ledger`'s ``peaks`` hold, in its order."""


class Ledger:
    """The peaks reset away on one device: torch's fixed stats in a list, in
    :data:`PATHS`' order (-1: none yet), and anything else (private pools, the stats of a
    torch of another shape) nested like the stats dict, a peak in place of each stat."""

    __slots__ = ("peaks", "rest")

    def __init__(self) -> None:
        self.peaks = [-1] * len(PATHS)
        self.rest: dict[Any, Any] = {}

    def fold(self, stats: dict[Any, Any]) -> None:
        """Raise each peak to the one in ``stats``: spelled out, a walk costs as much as
        building the dict did."""
        peaks = self.peaks
        try:
            i = 0
            for name in ARRAYS:
                arr = stats[name]
                p = arr["all"]["peak"]
                if p > peaks[i]:
                    peaks[i] = p
                p = arr["small_pool"]["peak"]
                if p > peaks[i + 1]:
                    peaks[i + 1] = p
                p = arr["large_pool"]["peak"]
                if p > peaks[i + 2]:
                    peaks[i + 2] = p
                i += 3
            for name in OVERSIZE:
                p = stats[name]["peak"]
                if p > peaks[i]:
                    peaks[i] = p
                i += 1
            pools = stats.get("reserved_bytes_by_private_pools")
            if pools:
                rest = self.rest.get("reserved_bytes_by_private_pools")
                if rest is None:
                    rest = self.rest["reserved_bytes_by_private_pools"] = {}
                fold(rest, pools)
        except (KeyError, TypeError):
            fold(self.rest, stats)  # another shape: every stat, the slow way

    def raise_in(self, stats: dict[Any, Any]) -> None:
        """Raise each stat's ``peak`` in ``stats`` to this ledger's where that is higher."""
        for path, peak in zip(PATHS, self.peaks, strict=True):
            if peak < 0:
                continue
            node: Any = stats
            for key in path:
                node = node.get(key) if type(node) is dict else None
            if type(node) is dict:
                real = node.get("peak")
                if type(real) is int and peak > real:
                    node["peak"] = peak
        if self.rest:
            raise_to(stats, self.rest)


def fold(ledger: dict[Any, Any], stats: dict[Any, Any]) -> None:
    """Raise each peak of ``ledger`` (nested like ``stats``, a peak in place of each stat's
    dict) to the ``peak`` of the same stat in ``stats``."""
    get = ledger.get
    for key, value in stats.items():
        if type(value) is dict:
            if "peak" in value:
                peak = value["peak"]
                if peak > get(key, -1):
                    ledger[key] = peak
            else:
                sub = get(key)
                if sub is None:
                    sub = ledger[key] = {}
                fold(sub, value)


def raise_to(stats: dict[Any, Any], ledger: dict[Any, Any]) -> None:
    """Raise each stat's ``peak`` in ``stats`` to the nested ledger's where that is higher."""
    for key, value in ledger.items():
        node = stats.get(key)
        if type(node) is not dict:
            continue
        if type(value) is dict:
            raise_to(node, value)
        else:
            real = node.get("peak")
            if type(real) is int and value > real:
                node["peak"] = value


def nest(flat: dict[Path, int]) -> dict[Any, Any]:
    """A ledger of paths (the native reader's) as a nested one."""
    out: dict[Any, Any] = {}
    for path, peak in flat.items():
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = peak
    return out


def _wrapping(wrapper: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """``wrapper``, named as ``original`` and marked as gpuwatch's wrapper of it."""
    wrapper._gpuwatch_original = original  # type: ignore[attr-defined]
    wrapper.__name__ = getattr(original, "__name__", wrapper.__name__)
    wrapper.__doc__ = getattr(original, "__doc__", None)
    return wrapper


def _called_with(
    args: tuple[Any, ...], kwargs: dict[str, Any], current: Callable[[], int]
) -> int | None:
    """The device index a binding was called with (its one argument, by position or name)."""
    return _index(args[0] if args else next(iter(kwargs.values()), None), current)


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
        self.ledgers: dict[int, Ledger] = {}  # by device
        # (allocated peak, reserved peak) reset by the user since gpuwatch's last read, by
        # device: gpuwatch's next boundary on that device reports at least these.
        self.carry: dict[int, tuple[int, int]] = {}
        self.native: Any = None  # the native reader once adopted (its ledger is in C++)
        self.originals: dict[str, Any] = {}

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
                    idx = _called_with(args, kwargs, self.device)
                    if idx is not None:
                        self.raise_peaks(out, idx)
            except Exception:
                pass
            return out

        return _wrapping(stats, original)

    def _reset_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def reset(*args: Any, **kwargs: Any) -> Any:
            idx = None
            try:
                idx = _called_with(args, kwargs, self.device)
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

        return _wrapping(reset, original)

    def fold(self, idx: int, stats: Any) -> None:
        """A Python read that gpuwatch is about to reset: its peaks go into the ledger."""
        ledger = self.ledgers.get(idx)
        if ledger is None:
            ledger = self.ledgers[idx] = Ledger()
        ledger.fold(stats)

    def raise_peaks(self, stats: dict[str, Any], idx: int) -> None:
        """Raise each peak of a stats dict the user asked for to the ledger's."""
        ledger = self.ledgers.get(idx)
        if ledger is not None:
            ledger.raise_in(stats)
        native = self.native
        if native is not None:
            flat = native.ledger(idx)
            if flat:
                raise_to(stats, nest(flat))

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
