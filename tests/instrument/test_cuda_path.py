"""The CUDA path of the client, on the CPU: which allocator calls it makes, and how many.

A scripted allocator stands in for torch's (``torch._C``'s raw bindings and ``torch.cuda``'s
public functions, each counting its calls; ``standin/scripted.py``), and a fake clock decides
which boundaries are one instant (and how long each allocator call takes). What is checked
is gpuwatch's own logic: one raw stats read per boundary instant (however long a read takes),
the public functions when the raw ones are missing or answer wrongly, and exact per-phase
peaks however the reads are shared. The real cost on a GPU is measured by
``benchmarks/bench_annotate.py`` (its CUDA rows run where CUDA is present).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from standin.scripted import Allocator, Clock, fake_torch

import gpuwatch
from gpuwatch.instrument import _api
from gpuwatch.instrument._torchmem import SHARED_NS, TorchMemory
from gpuwatch.session import Session

GIB = 1024**3
US = 1000


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Allocator, Clock, list]]:
    """The process-wide client on a scripted allocator and clock; what it emits, captured."""
    alloc, clock = Allocator(), Clock()
    memory = TorchMemory()
    memory.active, memory._torch, memory.clock = True, fake_torch(alloc), clock
    alloc.clock = clock  # the allocator's calls take time only where a test says so
    monkeypatch.setattr(_api._state, "memory", memory)
    monkeypatch.setattr(_api, "_monotonic_ns", clock)
    emitted: list = []
    emit = _api._state.client.emit

    def capture(item: tuple) -> None:  # a phase boundary's fields after its kind
        emitted.append(item[1:]) if item[0] == "phase" else emit(item)

    monkeypatch.setattr(_api._state.client, "emit", capture)
    monkeypatch.setattr(_api._state, "enabled", True)
    _api._state.stack().clear()
    yield alloc, clock, emitted
    _api._state.stack().clear()


def _reads(alloc: Allocator) -> int:
    return alloc.calls.get("_cuda_memoryStats", 0) - 1  # the binding's one probe


def test_a_chain_reads_the_allocator_once_per_instant(cuda) -> None:
    alloc, clock, emitted = cuda
    names = ["data", "forward", "backward", "optimizer.step", "zero_grad"]
    for name in names:
        with gpuwatch.phase(name):
            clock.advance(1_000_000)  # 1 ms of work in each
        clock.advance(2 * US)  # the loop's own Python between two phases
    assert _reads(alloc) == len(names) + 1  # not 2 per phase
    assert alloc.calls.get("memory_stats_as_nested_dict", 0) == 0  # the raw read only
    assert alloc.calls.get("reset_peak_memory_stats", 0) == 0
    assert len(emitted) == 2 * len(names)


def test_an_isolated_phase_reads_at_both_ends_however_short(cuda) -> None:
    alloc, clock, emitted = cuda
    with gpuwatch.phase("zero_grad"):
        clock.advance(1 * US)  # quicker than SHARED_NS: still its own read
        alloc.alloc(3 * GIB)
        alloc.free(3 * GIB)
    assert _reads(alloc) == 2
    _, end = emitted
    assert end[7][3] == 3 * GIB  # the end's peak: what the phase allocated


def test_a_gap_longer_than_an_instant_is_read_again(cuda) -> None:
    alloc, clock, _ = cuda
    with gpuwatch.phase("a"):
        clock.advance(1_000_000)
    clock.advance(SHARED_NS + 1)
    with gpuwatch.phase("b"):
        clock.advance(1_000_000)
    assert _reads(alloc) == 4


def test_shared_reads_keep_every_phase_peak_exact(cuda) -> None:
    # Every byte allocated lands in exactly one read interval, attributed to the phases
    # open at its end: each phase's peak is the allocator's true peak inside it.
    alloc, clock, emitted = cuda
    session = Session(t_origin=0)
    script = [  # (phase, allocations inside it) with a temporary at each phase's middle
        ("forward", [(4, 2), (6, 0)]),
        ("backward", [(3, 5), (1, 0)]),
        ("optimizer.step", [(8, 8), (0, 0)]),
        ("zero_grad", [(0, 0)]),
    ]
    truth = {}
    with gpuwatch.phase("step"):
        clock.advance(2 * US)
        for name, allocs in script:
            clock.advance(3 * US)
            with gpuwatch.phase(name):
                start = alloc.current
                high = start
                for keep, temp in allocs:
                    clock.advance(100 * US)
                    alloc.alloc((keep + temp) * GIB)
                    high = max(high, alloc.current)
                    alloc.free(temp * GIB)
                truth[name] = high
                clock.advance(100 * US)
    pid = 4242
    from gpuwatch.protocol import Message

    for seq, (t, event, name, sid, parent, depth, step, fig, _) in enumerate(emitted):
        body = {"event": event, "name": name, "id": sid, "parent": parent, "depth": depth,
                "step": step}  # fmt: skip
        if fig is not None:
            body.update(dev=fig[0], allocated=fig[1], reserved=fig[2])
            if fig[3] is not None:
                body.update(peak_allocated=fig[3], peak_reserved=fig[4])
        session.ingest(Message("phase", pid, seq, t, body=body))
    cols = session.processes[pid].phases.snapshot()
    pairs = zip(cols["name"], cols["peak_alloc"], strict=True)
    peaks = {session.names[int(n)]: int(p) for n, p in pairs}
    for name, high in truth.items():
        assert peaks[name] == high, name
    assert peaks["step"] == max(truth.values())
    assert _reads(alloc) < len(emitted)  # some instants were shared


@pytest.mark.parametrize(
    ("raw", "raw_stats", "expect"),
    [
        (False, None, "memory_stats_as_nested_dict"),  # an older or newer torch without them
        (True, lambda idx: {"allocated_bytes": 0}, "memory_stats_as_nested_dict"),  # new shape
        (True, lambda idx: 1 / 0, "memory_stats_as_nested_dict"),  # raises
        (True, None, "_cuda_memoryStats"),
    ],
)
def test_the_raw_bindings_are_used_only_where_they_answer_like_the_public_ones(
    raw: bool, raw_stats: Any, expect: str
) -> None:
    alloc = Allocator()
    memory = TorchMemory()
    memory.active, memory._torch = True, fake_torch(alloc, raw=raw, raw_stats=raw_stats)
    alloc.alloc(GIB)
    figures = memory.boundary(10**12, "begin")
    assert figures is not None and figures[1] == GIB and figures[3] == GIB
    memory.boundary(10**12 + 10**9, "end")
    used = {k for k in alloc.calls if "tats" in k}
    assert expect in used
    if expect == "memory_stats_as_nested_dict":
        assert alloc.calls[expect] == 2  # every read went the public way


def test_disabled_peaks_never_reset_the_users_counters() -> None:
    alloc = Allocator()
    memory = TorchMemory(peaks=False)
    memory.active, memory._torch = True, fake_torch(alloc)
    stats, reset = memory._torch._C._cuda_memoryStats, memory._torch._C._cuda_resetPeakMemoryStats
    memory.boundary(10**12, "begin")
    memory.boundary(10**12 + 10**9, "end")
    assert "_cuda_resetPeakMemoryStats" not in alloc.calls
    assert "reset_peak_memory_stats" not in alloc.calls
    # nothing reset, so nothing to make up for: the user's bindings are torch's own
    assert memory._torch._C._cuda_memoryStats is stats
    assert memory._torch._C._cuda_resetPeakMemoryStats is reset


CHAIN = ("data", "forward", "backward", "optimizer.step", "zero_grad")


@pytest.mark.parametrize("stats_us", [1, 12, 20, 40])
def test_a_chain_shares_reads_however_long_a_read_takes(cuda, stats_us: int) -> None:
    # torch's stats call builds a dict of some 325 objects: 20 us and more on a real GPU
    # host. The sharing window counts from the end of the previous read, so the Python
    # between two phases, not the read, decides whether two boundaries are one instant.
    alloc, clock, emitted = cuda
    alloc.stats_ns, alloc.reset_ns = stats_us * US, 2 * US
    steps = 20
    for _ in range(steps):
        for name in CHAIN:
            with gpuwatch.phase(name):
                clock.advance(500 * US)
            clock.advance(2 * US)
    per_phase = _reads(alloc) / (steps * len(CHAIN))
    assert per_phase <= 1.1, per_phase
    assert all(fig[3] is not None for _, event, *_, fig, _e in emitted if event == "end")


def test_an_isolated_pair_after_a_slow_read_is_read_at_both_ends(cuda) -> None:
    alloc, clock, _ = cuda
    alloc.stats_ns = 40 * US
    with gpuwatch.phase("a"):
        clock.advance(500 * US)
    clock.advance(SHARED_NS + 1)  # longer than an instant after the end's read
    with gpuwatch.phase("b"):
        pass
    assert _reads(alloc) == 4
