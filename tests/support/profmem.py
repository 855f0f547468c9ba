"""Ground truth per rank without a GPU: torch.profiler's allocator events.

The profiler is started before the model is built (``profile_memory=True``), so every
allocation and free of the rank's tensors is a ``[memory]`` event with its signed bytes.
Their running sum is the bytes the rank holds; a phase marked with
:func:`record_function` (``gw:<step>:<phase>``) has as its truth the highest running sum
inside it (the level at its start included). Unlike a dispatch-mode tracker this sees
inside DTensor's ops and FSDP's and DDP's C++ (buckets, all-gather outputs).

What it does not see: allocations made on other threads than the one that started the
profiler (the profiler's memory reports are per thread; ``profile_all_threads`` drops them
all). On the CPU with gloo that is gloo's worker threads, whose buffers are its own, and
autograd runs CPU backward on the calling thread. A collective's memory is another
matter: gloo's work holds its tensors (and temporaries of its own: ``_reduce_scatter_base``
clones its input) until the worker has finished with it, so when the caller lets go
first the free happens on the worker and is lost, at random under load.
:func:`settle_collectives` makes the caller wait, after each collective, until the
worker has let go of the caller's tensors, so that their frees are the caller's, and
marks each collective and its wait: a temporary the work made is taken as freed when
the caller's wait returns (the work is the worker's alone by then). On CUDA the events
of the ``cuda`` device are the caching allocator's, the same truth as
``max_memory_allocated``.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.profiler import profile, record_function

PREFIX = "gw:"

RELEASES = ("FSDP::post_backward_rs_wait", "FSDP::root_post_backward")
"""FSDP2's ranges in which it waits on a reduce-scatter and drops its reference to the
previous one's input (``reduce_scatter_state``): where an orphan is freed at the latest."""
"""The record_function names of marked phases: ``gw:<step>:<phase>``."""


COLLECTIVE = "gwc:"
"""The record_function names of a settled collective's call: ``gwc:<id>``."""
WAIT = "gww:"
"""... and of its wait (an asynchronous one's ``wait``, a synchronous one's return):
``gww:<id>``."""

COLLECTIVES = (
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather",
    "all_reduce",
    "broadcast",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "reduce_scatter",
    "reduce",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "_all_gather_base",
    "_reduce_scatter_base",
)
"""The ``torch.distributed`` collectives :func:`settle_collectives` wraps."""

SETTLE_TIMEOUT_S = 0.25
"""How long a collective waits for gloo's worker to let go of its tensors. The worker
lets go microseconds after the work is done; what holds them longer is not the worker
(ZeRO-3's asynchronous all-gathers keep one reference each past their wait, from
something other than the work the caller held: counted in :data:`unsettled`)."""

unsettled = 0
"""Collectives whose tensors were still referenced past :data:`SETTLE_TIMEOUT_S`."""

_ids = itertools.count()
_inside = threading.local()


def _tensors(args: Iterable[Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(t for t in a if isinstance(t, torch.Tensor))
    return out


def _refs(t: torch.Tensor) -> tuple[int, int]:
    """References to ``t`` (its views' included) and to its storage (a tensor made over
    the same memory in C++, ``detach`` or ``as_strided``, holds only the storage)."""
    return t._use_count(), torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def _settle(tensors: list[torch.Tensor], counts: list[tuple[int, int]]) -> None:
    """Wait until each tensor and its storage are referenced no more than before the
    collective."""
    global unsettled
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while any(
        a > n or b > m for t, (n, m) in zip(tensors, counts, strict=True) for a, b in [_refs(t)]
    ):
        if time.monotonic() > deadline:
            unsettled += 1
            return
        time.sleep(1e-5)


class _SettledWork:
    """An asynchronous collective's work whose :meth:`wait` drops the caller's reference
    to the work and returns once gloo's worker has let go of it too.

    The caller may take references of its own to the tensors between the call and the
    wait (DeepSpeed points a parameter at its all-gather's output): the work's own are
    what the call added (``held``), and the wait takes them off what it finds."""

    def __init__(
        self, work: Any, key: int, tensors: list[torch.Tensor], held: list[tuple[int, int]]
    ) -> None:
        self._work = work
        self._key = key
        self._tensors = tensors
        self._held = held

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        if self._work is None:
            return True
        with record_function(f"{WAIT}{self._key}"):
            done = bool(self._work.wait(*args, **kwargs))
            now = [_refs(t) for t in self._tensors]
            self._work = None
            counts = [(a - c, b - d) for (a, b), (c, d) in zip(now, self._held, strict=True)]
            _settle(self._tensors, counts)
        self._tensors = []
        return done

    def is_completed(self) -> bool:
        return self._work is None or bool(self._work.is_completed())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _settled(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if getattr(_inside, "call", False):
            # One collective calling another (``all_gather_into_tensor`` is
            # ``all_gather_single`` now): the outer call settles the work it returns.
            return fn(*args, **kwargs)
        key = next(_ids)
        tensors = _tensors([*args, *kwargs.values()])
        counts = [_refs(t) for t in tensors]
        _inside.call = True
        try:
            with record_function(f"{COLLECTIVE}{key}"):
                work = fn(*args, **kwargs)
        finally:
            _inside.call = False
        if work is None:  # synchronous: done, but the worker may still hold the work
            with record_function(f"{WAIT}{key}"):
                _settle(tensors, counts)
            return None
        held = [(a - c, b - d) for (a, b), (c, d) in zip(map(_refs, tensors), counts, strict=True)]
        return _SettledWork(work, key, tensors, held)

    call.__gw_settled__ = True  # type: ignore[attr-defined]
    return call


def settle_collectives() -> None:
    """Make a collective's frees the caller's, or mark where they happen.

    Wraps :data:`COLLECTIVES` in ``torch.distributed`` (call it before a library captures
    them: DeepSpeed's comm backend reads its all-gather and reduce-scatter functions once,
    at ``init_distributed``). After a collective is done (a synchronous call's return, an
    asynchronous work's ``wait``) the caller waits until no reference to its tensors or
    their storages is left beyond those held before the call: gloo's worker has dropped
    them, so the caller's own drop frees the memory, where the profiler sees it. The call
    is marked ``gwc:<id>`` and its wait ``gww:<id>``: what the work allocated itself is
    freed with the work, on the worker, as the wait returns (:func:`phase_peaks`).
    """
    import torch.distributed as dist

    for name in COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is not None and not getattr(fn, "__gw_settled__", False):
            setattr(dist, name, _settled(fn))


@dataclass
class Truth:
    """Per-phase peaks from a profiled run.

    Attributes:
        peaks: ``(step, phase)`` -> the highest bytes held inside that phase.
        starts: ``(step, phase)`` -> the bytes held when it began.
        final: The bytes held when the profiler stopped.
        events: How many allocator events were seen.
        orphan_bytes: Allocations whose free happened on another thread (see
            :func:`phase_peaks`).
    """

    peaks: dict[tuple[int, str], int] = field(default_factory=dict)
    starts: dict[tuple[int, str], int] = field(default_factory=dict)
    final: int = 0
    events: int = 0
    orphan_bytes: int = 0


class ProfiledMemory:
    """Profile the allocator of one device type from :meth:`start` to :meth:`stop`.

    Args:
        device: ``"cpu"`` or ``"cuda"``: whose ``[memory]`` events are summed.
    """

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        # torch.autograd's profiler, not torch.profiler's wrapper: the wrapper's first start
        # in a process imports torch._inductor (seconds per rank, per case), and the events
        # are the same kineto results.
        self.prof = profile(
            use_kineto=True,
            use_device="cuda" if device == "cuda" else None,
            profile_memory=True,
        )
        self.truth = Truth()

    def start(self) -> None:
        self.prof.__enter__()

    def stop(self, alive: Iterable[Any] | None = None) -> Truth:
        """Stop profiling; ``alive``: every tensor still held now that was allocated
        inside a phase (gradients, optimizer state), or None when that cannot be named
        (then only reused pointers reveal orphans)."""
        ptrs: set[int] | None = None if alive is None else set()
        for t in alive or ():
            t = getattr(t, "_local_tensor", t)  # a DTensor's shard
            if isinstance(t, torch.Tensor) and ptrs is not None:
                ptrs.add(int(t.untyped_storage().data_ptr()))
        self.prof.__exit__(None, None, None)
        self.truth = phase_peaks(self.prof, self.device, ptrs)
        return self.truth

    @staticmethod
    @contextmanager
    def phase(step: int, name: str) -> Iterator[None]:
        """Mark a phase for the truth (a ``record_function`` range)."""
        with record_function(f"{PREFIX}{step}:{name}"):
            yield


def phase_peaks(prof: Any, device: str = "cpu", alive: set[int] | None = None) -> Truth:
    """The running sum of ``prof``'s allocator events on ``device``, peaked per phase.

    An allocation whose free the profiler never saw was freed on another thread (gloo's
    worker drops the last reference to a collective's input after the main thread did)
    when its pointer is allocated again, or when it was made inside a phase and is not
    among ``alive`` (data pointers of storages still held at the end): it is taken as
    freed at the end of the first of FSDP's :data:`RELEASES` ranges after it (where FSDP
    drops its own reference to a reduce-scatter's input, so the worker's drop follows),
    else when the phase that allocated it ended; one allocated inside a settled
    collective's call (``gwc:<id>``: the work's own temporary) ends with its wait
    (``gww:<id>``); its bytes are counted in
    :attr:`Truth.orphan_bytes`. Allocations made outside any phase (the model, DDP's
    buckets) are orphans only when their pointer is allocated again. A free whose
    allocation came before the profiler started (an earlier case's model, in the same
    process) is not counted.
    """
    want = torch.device(device).type
    allocs: list[tuple[int, int, int]] = []  # (time, signed bytes, ptr)
    ranges: list[tuple[int, int, int, str]] = []
    releases: list[int] = []
    release_ends: list[int] = []
    calls: list[tuple[int, int, str]] = []  # settled collectives: (start, end, id)
    waits: dict[str, int] = {}  # their waits' ends, by id
    todo = list(prof.kineto_results.experimental_event_tree())
    alloc_tag = torch._C._profiler._EventType.Allocation
    while todo:
        node = todo.pop()
        todo.extend(node.children)
        if node.tag == alloc_tag:
            e = node.extra_fields
            if e.device.type == want and e.alloc_size:
                allocs.append((node.start_time_ns, int(e.alloc_size), int(e.ptr)))
        elif node.name.startswith(RELEASES):
            releases.append(node.start_time_ns)
            release_ends.append(node.end_time_ns)
        elif node.name.startswith(PREFIX):
            step, _, phase = node.name[len(PREFIX) :].partition(":")
            ranges.append((node.start_time_ns, node.end_time_ns, int(step), phase))
        elif node.name.startswith(COLLECTIVE):
            calls.append((node.start_time_ns, node.end_time_ns, node.name[len(COLLECTIVE) :]))
        elif node.name.startswith(WAIT):
            waits[node.name[len(WAIT) :]] = node.end_time_ns
    allocs.sort()
    ranges.sort()
    calls.sort()
    call_starts = [c[0] for c in calls]
    order = sorted(range(len(releases)), key=releases.__getitem__)
    releases = [releases[i] for i in order]
    release_ends = [release_ends[i] for i in order]
    live: dict[int, int] = {}
    starts = [r[0] for r in ranges]
    orphans = 0
    frees: list[tuple[int, int, int]] = []

    def work_end(t: int) -> int | None:
        """Where the work of the settled collective whose call made ``t``'s allocation
        let go of it: its wait's end (the innermost call, where one wraps another)."""
        c = bisect.bisect_right(call_starts, t) - 1
        for start, end, key in reversed(calls[max(c - 3, 0) : c + 1]):
            if start <= t <= end:
                return waits.get(key, end)
        return None

    def orphan(i: int, by: int) -> None:
        nonlocal orphans
        t, n, ptr = allocs[i]
        done = work_end(t)
        if done is not None:
            frees.append((min(done, by), -n, ptr))
            orphans += n
            return
        k = bisect.bisect_right(starts, t) - 1
        if k < 0 or ranges[k][1] < t:
            # Outside any phase (the model, DDP's buckets, DeepSpeed's all-gathers between
            # steps): no phase to end it, but a pointer allocated again was freed first.
            if by < 2**63:
                frees.append((by, -n, ptr))
                orphans += n
            return
        r = bisect.bisect_right(releases, t)
        end = release_ends[r] if r < len(releases) else ranges[k][1]
        frees.append((min(ranges[k][1], by, end), -n, ptr))
        orphans += n

    before: set[int] = set()  # frees of what was allocated before the window opened
    for i, (t, n, ptr) in enumerate(allocs):
        if n < 0:
            if live.pop(ptr, None) is None:
                before.add(i)
            continue
        if ptr in live:
            orphan(live[ptr], t - 1)
        live[ptr] = i
    for ptr, i in live.items():
        if alive is not None and ptr not in alive:
            orphan(i, 2**63)
    # Not this run's memory: an earlier run in this process (the fake process group's
    # rank 0 runs in the test's own process) whose model its watch() held until this
    # run's replaced it would otherwise lower every level after its free.
    allocs = [a for i, a in enumerate(allocs) if i not in before]
    allocs.extend(frees)
    allocs.sort()
    times = [t for t, _, _ in allocs]
    levels: list[int] = []
    level = 0
    for _, n, _ in allocs:
        level += n
        levels.append(level)
    truth = Truth(final=level, events=len(allocs), orphan_bytes=orphans)
    for t0, t1, step, phase in ranges:
        i = bisect.bisect_left(times, t0)
        j = bisect.bisect_right(times, t1)
        at_start = levels[i - 1] if i else 0
        peak = max([at_start, *levels[i:j]])
        key = (step, phase)
        truth.starts.setdefault(key, at_start)
        truth.peaks[key] = max(peak, truth.peaks.get(key, 0))
    return truth
