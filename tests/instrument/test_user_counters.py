"""The user's peak counters under gpuwatch equal a run without it (the Python reader).

gpuwatch resets the allocator's peaks at its boundaries; the user's ``max_memory_allocated``,
``memory_stats()`` and ``reset_peak_memory_stats`` go through ``torch._C``'s bindings, which
gpuwatch wraps. One script of phases, allocations and user calls runs twice on the scripted
allocator (``standin/scripted.py``, every peak field torch has): watched by gpuwatch and
not; every answer the user gets must be the same. The native reader's fold is checked the
same way in ``test_native.py``.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from standin.scripted import MIB, Allocator, Clock, fake_torch, flat

from gpuwatch.instrument._torchmem import SHARED_NS, TorchMemory
from gpuwatch.instrument._userpeaks import PATHS

GIB = 1024**3
US = 1000


def watched(alloc: Allocator, clock: Clock) -> tuple[TorchMemory, Any]:
    fake = fake_torch(alloc)
    memory = TorchMemory()
    memory.active, memory._torch, memory.clock = True, fake, clock
    memory._native_thread = object()  # type: ignore[assignment]  # the Python reader only
    return memory, fake


def run(script: list[tuple], gpuwatch: bool) -> list[tuple]:
    """What the user saw, running ``script`` with or without gpuwatch watching."""
    alloc, clock = Allocator(), Clock()
    if gpuwatch:
        memory, fake = watched(alloc, clock)
    else:
        memory, fake = None, fake_torch(alloc)
    seen: list[tuple] = []
    for op, *args in script:
        clock.advance(args[-1] if op == "wait" else 1 * US)
        if op in ("begin", "end"):
            if memory is not None:
                memory.boundary(clock(), op)
        elif op == "alloc":
            alloc.alloc(args[0])
        elif op == "free":
            alloc.free(args[0])
        elif op == "pool":
            alloc.private_pool((0, 1), args[0])
        elif op == "max":  # torch.cuda.max_memory_allocated / max_memory_reserved
            stats = fake._C._cuda_memoryStats(0)
            seen.append(
                (
                    op,
                    stats["allocated_bytes"]["all"]["peak"],
                    stats["reserved_bytes"]["all"]["peak"],
                )
            )
        elif op == "stats":  # torch.cuda.memory_stats()
            seen.append((op, flat(fake._C._cuda_memoryStats(0))))
        elif op == "reset":  # torch.cuda.reset_peak_memory_stats()
            fake._C._cuda_resetPeakMemoryStats(0)
        elif op == "sender" and memory is not None:  # the client's periodic figures
            memory.current()
        elif op == "empty":
            alloc.empty_cache()
    return seen


def random_script(seed: int, length: int = 400) -> list[tuple]:
    rng = random.Random(seed)
    script: list[tuple] = []
    held: list[int] = []
    depth = pool = 0
    for _ in range(length):
        r = rng.random()
        if r < 0.2:
            if depth < 3 and (depth == 0 or rng.random() < 0.6):
                script.append(("begin",))
                depth += 1
            elif depth:
                script.append(("end",))
                depth -= 1
        elif r < 0.45:
            n = rng.choice([512, 4096, 300 * 1024, 3 * MIB, 80 * MIB, GIB])
            held.append(n)
            script.append(("alloc", n))
        elif r < 0.65 and held:
            script.append(("free", held.pop(rng.randrange(len(held)))))
        elif r < 0.7:  # a CUDA graph's private pool grows or shrinks
            n = rng.choice([4, -4]) * MIB if pool else 4 * MIB
            pool += n
            script.append(("pool", n))
        elif r < 0.77:
            script.append(("max",))
        elif r < 0.81:
            script.append(("stats",))
        elif r < 0.84:
            script.append(("reset",))
        elif r < 0.87:
            script.append(("sender",))
        elif r < 0.89:
            script.append(("empty",))
        else:  # the loop's own Python, or real work
            script.append(("wait", rng.choice([2 * US, SHARED_NS // 2, 3 * SHARED_NS, 10**6])))
    script += [("end",)] * depth + [("max",), ("stats",)]
    return script


@pytest.mark.parametrize("seed", range(8))
def test_the_users_counters_equal_a_run_without_gpuwatch(seed: int) -> None:
    script = random_script(seed)
    assert run(script, gpuwatch=True) == run(script, gpuwatch=False)


def test_a_training_loop_that_logs_its_peak_per_step() -> None:
    # HF Trainer / Lightning's DeviceStatsMonitor pattern: read the peak, reset, repeat.
    script: list[tuple] = []
    for step in range(5):
        for _phase, n in (("forward", 2 + step), ("backward", 3), ("optimizer.step", 1)):
            script += [("begin",), ("alloc", n * GIB), ("free", n * GIB), ("end",)]
            script += [("wait", 2 * US)]
        script += [("max",), ("stats",)]
        if step % 2:
            script += [("reset",)]
    seen = run(script, gpuwatch=True)
    assert seen == run(script, gpuwatch=False)
    assert [s[1] for s in seen if s[0] == "max"] == [3 * GIB, 3 * GIB, 4 * GIB, 5 * GIB, 6 * GIB]


def test_a_user_reset_inside_a_phase_keeps_the_phase_peak_exact() -> None:
    alloc, clock = Allocator(), Clock()
    memory, fake = watched(alloc, clock)
    memory.boundary(clock(), "begin")
    alloc.alloc(GIB)
    clock.advance(10**6)
    memory.boundary(clock(), "begin")
    alloc.alloc(4 * GIB)
    alloc.free(4 * GIB)
    fake._C._cuda_resetPeakMemoryStats(0)  # the user's, mid-phase
    alloc.alloc(GIB)
    alloc.free(GIB)
    clock.advance(10**6)
    end = memory.boundary(clock(), "end")
    assert end is not None and end[3] == 5 * GIB
    clock.advance(10**6)
    nxt = memory.boundary(clock(), "end")
    assert nxt is not None and nxt[3] == GIB  # the carry served one boundary only
    stats = fake._C._cuda_memoryStats(0)
    assert stats["allocated_bytes"]["all"]["peak"] == 2 * GIB  # the user's: since the reset


def test_each_reset_folds_the_peaks_it_resets_away() -> None:
    alloc, clock = Allocator(), Clock()
    memory, _ = watched(alloc, clock)
    memory.boundary(clock(), "begin")
    user = memory._user
    assert user is not None and user.ledgers[0].peaks[PATHS.index(("allocated_bytes", "all"))] == 0
    alloc.alloc(GIB)
    alloc.free(GIB)
    clock.advance(10**6)
    memory.boundary(clock(), "end")
    ledger = user.ledgers[0]
    assert ledger.peaks[PATHS.index(("allocated_bytes", "all"))] == GIB
    assert ledger.peaks[PATHS.index(("allocation", "large_pool"))] == 1
    assert ledger.peaks[PATHS.index(("allocation", "small_pool"))] == 0


def test_a_stats_dict_of_another_shape_is_folded_the_slow_way() -> None:
    # A torch without requested_bytes (older) or with stats gpuwatch does not know (newer).
    from gpuwatch.instrument._userpeaks import Ledger

    ledger = Ledger()
    ledger.fold({"allocated_bytes": {"all": {"current": 1, "peak": 7}}, "new_stat": {"peak": 3}})
    user = {"allocated_bytes": {"all": {"current": 1, "peak": 2}}, "new_stat": {"peak": 1}}
    ledger.raise_in(user)
    assert user == {"allocated_bytes": {"all": {"current": 1, "peak": 7}}, "new_stat": {"peak": 3}}


def test_the_wrappers_raise_what_torch_raises_and_nothing_of_their_own() -> None:
    alloc, clock = Allocator(), Clock()
    memory, fake = watched(alloc, clock)
    memory.boundary(clock(), "begin")
    with pytest.raises(IndexError):
        fake._C._cuda_memoryStats(7)  # no such device: the original's own error
    with pytest.raises(IndexError):
        fake._C._cuda_resetPeakMemoryStats(7)
    assert memory._user is not None
    memory._user.ledgers = None  # type: ignore[assignment]  # gpuwatch's side breaks
    assert fake._C._cuda_memoryStats(0)["allocated_bytes"]["all"]["current"] == 0
    assert fake._C._cuda_resetPeakMemoryStats(0) is None


def test_the_wrappers_are_installed_once_and_gpuwatch_reads_the_originals() -> None:
    alloc, clock = Allocator(), Clock()
    memory, fake = watched(alloc, clock)
    original = fake._C._cuda_memoryStats
    memory.boundary(clock(), "begin")
    wrapped = fake._C._cuda_memoryStats
    assert wrapped is not original and wrapped._gpuwatch_original is original
    second = TorchMemory()
    second.active, second._torch, second.clock = True, fake, clock
    second._native_thread = object()  # type: ignore[assignment]
    clock.advance(10**6)
    second.boundary(clock(), "begin")
    assert fake._C._cuda_memoryStats is wrapped  # not wrapped twice
    assert second._stats is memory._stats  # both read through the original
    calls = alloc.calls.get("_cuda_memoryStats", 0)
    clock.advance(10**6)
    memory.boundary(clock(), "end")
    assert alloc.calls["_cuda_memoryStats"] == calls + 1


def test_torch_accelerators_bindings_are_kept_whole_too() -> None:
    # torch.accelerator.max_memory_allocated() and friends, where the accelerator is CUDA.
    import types

    def with_accelerator(alloc: Allocator) -> Any:
        fake = fake_torch(alloc)
        fake._C._accelerator_getDeviceStats = alloc.stats
        fake._C._accelerator_resetPeakStats = alloc.reset
        cuda = types.SimpleNamespace(type="cuda")
        fake.accelerator = types.SimpleNamespace(current_accelerator=lambda: cuda)
        return fake

    seen = []
    for watch in (True, False):
        alloc, clock = Allocator(), Clock()
        fake = with_accelerator(alloc)
        memory = TorchMemory()
        memory.active, memory._torch, memory.clock = True, fake, clock
        memory._native_thread = object()  # type: ignore[assignment]
        peaks = []
        for n in (3, 5, 2):
            if watch:
                memory.boundary(clock(), "begin")
            alloc.alloc(n * GIB)
            alloc.free(n * GIB)
            clock.advance(10**6)
            if watch:
                memory.boundary(clock(), "end")
            peaks.append(fake._C._accelerator_getDeviceStats(0)["allocated_bytes"]["all"]["peak"])
            if n == 5:
                fake._C._accelerator_resetPeakStats(0)
        seen.append(peaks)
    assert seen[0] == seen[1] == [3 * GIB, 5 * GIB, 2 * GIB]
