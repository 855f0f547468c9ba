"""The native allocator reader, against a stand-in CUDA allocator in the CPU build of torch.

``standin/standin_allocator.cpp`` registers a ``c10::DeviceAllocator`` for CUDA and a
device guard, so the reader built from ``gpuwatch/instrument/_native.cpp`` runs unchanged;
the stand-in also answers ``torch._C._cuda_memoryStats``'s dict from the same counters, so
the Python path and the native one read one allocator. Checked: the two agree; the reader
is adopted only after they agreed once, and said in the recording; its ledger keeps the
user's peaks (through the real ``torch.cuda`` functions too); and when the build fails,
the Python path stays and that is said.
"""

from __future__ import annotations

import shutil
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from standin.build import build_standin
from standin.scripted import flat

from gpuwatch.instrument import _native
from gpuwatch.instrument._torchmem import TorchMemory

torch = pytest.importorskip("torch")

MIB = 1024**2
GIB = 1024**3


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_standin(tmp_path_factory.mktemp("standin"))


@pytest.fixture(scope="module")
def native_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("native")


@pytest.fixture(scope="module")
def native(standin: Any, native_dir: Path) -> Any:
    module, how = _native.build(native_dir)
    assert how.startswith("built in")
    return module


@pytest.fixture
def fresh(standin: Any, native: Any) -> Iterator[Any]:
    """The stand-in with no counts, and the reader's ledgers empty (one per process)."""

    def clear() -> None:
        standin.clear()
        standin.set_device(0)
        native.clear(0)
        native.clear(1)

    clear()
    yield standin
    clear()


def standin_torch(s: Any, stats: Any = None) -> Any:
    """A torch whose CUDA calls are the stand-in's (``_C`` a namespace of its own)."""
    cuda = types.SimpleNamespace(
        current_device=s.get_device,
        synchronize=lambda idx=None: None,
        memory_stats_as_nested_dict=s.memory_stats,
        reset_peak_memory_stats=s.reset_peak,
    )
    C = types.SimpleNamespace(
        _cuda_memoryStats=stats or s.memory_stats,
        _cuda_resetPeakMemoryStats=s.reset_peak,
        _cuda_getDevice=s.get_device,
    )
    return types.SimpleNamespace(cuda=cuda, _C=C)


def watching(fake: Any, module: Any = None, how: str = "built in 0.1 s") -> tuple:
    """A TorchMemory on ``fake``, the built reader waiting for its check; what it says."""
    memory = TorchMemory()
    memory.active, memory._torch = True, fake
    notes: list[str] = []
    memory.on_note = notes.append
    memory._native_thread = threading.current_thread()  # no build of its own
    if module is not None:
        memory._candidate = (module, how)
    return memory, notes


def script(s: Any, dev: int) -> None:
    s.alloc(dev, 300 * MIB)
    s.alloc(dev, 4096)
    s.alloc(dev, 70 * MIB)
    s.free(dev, 300 * MIB)
    s.private_pool(dev, 0, 1, 8 * MIB)
    s.set_counters(dev, 3, 1, 5 * MIB)


def test_the_native_figures_equal_the_python_paths(fresh: Any, native: Any) -> None:
    for dev in (0, 1):
        fresh.set_device(dev)
        script(fresh, dev)
        assert native.device() == dev
        python = TorchMemory._figures(dev, fresh.memory_stats(dev), True)
        assert native.read(-1, 1) == python
        assert native.read(dev, 0) == (*python[:3], None, None, *python[5:])
        fresh.alloc(dev, 10 * MIB)
        fresh.free(dev, 10 * MIB)
        before = TorchMemory._figures(dev, fresh.memory_stats(dev), True)
        assert native.read(dev, 2) == before  # read, then reset
        after = TorchMemory._figures(dev, fresh.memory_stats(dev), True)
        assert after[3] == after[1] and after[4] == after[2]  # peaks back to current
        native.clear(dev)


def test_the_reader_is_adopted_after_one_agreement_and_said(fresh: Any, native: Any) -> None:
    fake = standin_torch(fresh)
    memory, notes = watching(fake, native, "built in 3.2 s")
    twin, _ = watching(standin_torch(fresh))  # the Python path, on device 1
    script(fresh, 0)
    script(fresh, 1)
    t = 10**12
    for step in range(3):
        for n in (100, 20, 300):
            for dev, m in ((0, memory), (1, twin)):
                fresh.set_device(dev)
                begin = m.boundary(t, "begin")
                fresh.alloc(dev, n * MIB)
                fresh.free(dev, (n // 2) * MIB)
                end = m.boundary(t + 10**9, "end")
                assert begin is not None and end is not None
                if dev == 0:
                    got = (begin[1:], end[1:])
                else:
                    assert (begin[1:], end[1:]) == got, (step, n)
            t += 2 * 10**9
    assert memory._native is not None and twin._native is None
    assert notes == ["allocator reader: native (built in 3.2 s)"]
    assert memory.native_note == notes[0]


def test_a_reader_that_disagrees_is_not_used_and_that_is_said(fresh: Any, native: Any) -> None:
    def off_by_a_page(idx: int) -> dict[str, Any]:
        out = fresh.memory_stats(idx)
        out["allocated_bytes"]["all"]["current"] += 4096
        return out

    script(fresh, 0)
    memory, notes = watching(standin_torch(fresh, stats=off_by_a_page), native)
    assert memory.boundary(10**12, "begin") is not None
    assert memory._native is None
    assert len(notes) == 1 and notes[0].startswith("allocator reader: Python fallback (figures")
    memory.boundary(10**12 + 10**9, "end")
    assert len(notes) == 1  # said once


def test_the_native_fold_keeps_every_peak_of_the_user(fresh: Any, native: Any) -> None:
    # Devices 0 and 1 live the same life; gpuwatch watches device 0 only. What the user
    # reads of device 0 through the wrapped binding equals what device 1 holds untouched.
    fake = standin_torch(fresh)
    memory, _ = watching(fake, native)
    t = 10**12

    def both(op: str, *args: Any) -> None:
        for dev in (0, 1):
            getattr(fresh, op)(dev, *args)

    def user_sees() -> None:
        assert flat(fake._C._cuda_memoryStats(0)) == flat(fresh.memory_stats(1))

    for step in range(4):
        memory.boundary(t, "begin")
        both("alloc", (200 + 50 * step) * MIB)
        both("alloc", 2048)
        both("private_pool", 0, 1, 4 * MIB)
        memory.boundary(t + 10**8, "end")
        t += 10**9
        memory.boundary(t, "begin")
        both("free", (200 + 50 * step) * MIB)
        both("free", 2048)
        both("private_pool", 0, 1, -4 * MIB)
        memory.boundary(t + 10**8, "end")
        t += 10**9
        user_sees()
        if step == 1:  # the user resets, as a training loop that logs a peak per epoch
            fake._C._cuda_resetPeakMemoryStats(0)
            fresh.reset_peak(1)
            user_sees()
    assert memory._native is not None


def test_a_user_reset_inside_a_phase_keeps_its_peak_exact(fresh: Any, native: Any) -> None:
    fake = standin_torch(fresh)
    memory, _ = watching(fake, native)
    memory.boundary(10**12, "begin")  # adopts the reader
    assert memory._native is not None
    fresh.alloc(0, GIB)
    memory.boundary(10**12 + 10**9, "begin")
    fresh.alloc(0, 4 * GIB)
    fresh.free(0, 4 * GIB)
    fake._C._cuda_resetPeakMemoryStats(0)  # the user's reset, mid-phase
    fresh.alloc(0, GIB)
    fresh.free(0, GIB)
    end = memory.boundary(10**12 + 2 * 10**9, "end")
    assert end is not None and end[3] == 5 * GIB  # the phase's true peak, not 2 GiB
    nxt = memory.boundary(10**12 + 3 * 10**9, "begin")
    assert nxt is not None and nxt[3] == GIB  # the carry is used once


def test_the_users_torch_cuda_calls_see_their_own_peaks(
    fresh: Any, native: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real torch.cuda functions (the CPU build's, on the stand-in's bindings).
    for name, fn in (
        ("_cuda_memoryStats", fresh.memory_stats),
        ("_cuda_resetPeakMemoryStats", fresh.reset_peak),
        ("_cuda_getDevice", fresh.get_device),
    ):
        monkeypatch.setattr(torch._C, name, fn, raising=False)
    monkeypatch.setattr(torch.cuda.memory, "is_initialized", lambda: True)
    fake = standin_torch(fresh)
    fake._C = torch._C
    memory, _ = watching(fake, native)
    peaks = []
    t = 10**12
    for n in (3, 5, 2):
        memory.boundary(t, "begin")
        fresh.alloc(0, n * GIB)
        fresh.free(0, n * GIB)
        memory.boundary(t + 10**8, "end")
        t += 10**9
        peaks.append(torch.cuda.max_memory_allocated(0))
    assert peaks == [3 * GIB, 5 * GIB, 5 * GIB]
    assert torch.cuda.memory_stats(0)["active_bytes.all.peak"] == 5 * GIB
    assert (
        torch.cuda.max_memory_reserved(0) == fresh.memory_stats(0)["reserved_bytes"]["all"]["peak"]
    )
    torch.cuda.reset_peak_memory_stats(0)
    assert torch.cuda.max_memory_allocated(0) == 0
    memory.boundary(t, "begin")
    fresh.alloc(0, GIB)
    fresh.free(0, GIB)
    memory.boundary(t + 10**8, "end")
    assert torch.cuda.max_memory_allocated(0) == GIB
    assert memory._native is not None


def test_a_second_process_loads_the_reader_from_the_cache(native_dir: Path, native: Any) -> None:
    module, how = _native.build(native_dir)
    assert how.startswith("loaded from cache")
    assert module.read is not None


def test_without_a_compiler_the_python_path_stays_and_that_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(_native.Unavailable, match="no compiler"):
        _native.build(tmp_path, compiler=str(tmp_path / "no-such-c++"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    memory = TorchMemory()
    notes: list[str] = []
    memory.on_note = notes.append
    memory.native_cache = tmp_path
    memory.start_native()
    thread = memory._native_thread
    assert thread is not None and thread is not threading.current_thread()
    thread.join(60)
    assert notes == [
        f"allocator reader: Python fallback (no compiler: {tmp_path}/no-such-c++ not found)"
    ]
    assert memory._candidate is None
    memory.start_native()  # once per process
    assert memory._native_thread is thread


def test_a_failed_build_leaves_the_python_path_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler")
    broken = tmp_path / "broken.cpp"
    broken.write_text("#include <Python.h>\nthis is not C++;\n")
    monkeypatch.setattr(_native, "SOURCE", broken)
    memory = TorchMemory()
    notes: list[str] = []
    memory.on_note = notes.append
    memory.native_cache = tmp_path / "cache"
    memory.start_native()
    assert memory._native_thread is not None
    memory._native_thread.join(120)
    assert len(notes) == 1 and notes[0].startswith(
        "allocator reader: Python fallback (build failed:"
    )
    assert memory._candidate is None


def test_gpuwatch_native_0_builds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWATCH_NATIVE", "0")
    memory = TorchMemory()
    notes: list[str] = []
    memory.on_note = notes.append
    started = threading.active_count()
    memory.start_native()
    assert threading.active_count() == started
    assert notes == ["allocator reader: Python (GPUWATCH_NATIVE=0)"]
