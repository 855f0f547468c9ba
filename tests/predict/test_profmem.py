"""The CPU truth's collectives settle (issue 39, item 2): a tensor a collective's worker
thread still holds when the caller lets go is freed on that thread, where torch.profiler
does not see it, unless the caller first waits for the worker (``settle_collectives``).

The worker is a real thread holding a view of the tensor (as gloo's work holds its
tensors) and dropping it a little after the collective returns, as gloo's does on a
loaded machine; the truth is the real profiler's events.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from profmem import ProfiledMemory, _settled, phase_peaks  # noqa: E402

pytestmark = pytest.mark.torch

MIB = 1 << 20
LAG_S = 0.05
_WORKERS: list[threading.Thread] = []


def _workers_let_go() -> None:
    """Wait until every collective's worker has dropped what it held."""
    while _WORKERS:
        _WORKERS.pop().join(30)


class _Work:
    """An asynchronous collective's work: done at once, its thread lets go later."""

    def __init__(self, done: threading.Thread) -> None:
        self._done = done

    def wait(self) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _collective(
    async_op: bool, hold: Callable[[torch.Tensor], torch.Tensor] = lambda t: t.view(-1)
) -> Callable[..., Any]:
    """A collective whose worker thread keeps ``hold(tensor)`` for a while: a reference to
    it by default, as gloo's work keeps; :func:`_cloning` keeps a copy."""

    def collective(tensor: torch.Tensor, async_op: bool = async_op) -> _Work | None:
        held = [hold(tensor)]

        def worker() -> None:
            time.sleep(LAG_S)
            held.clear()

        t = threading.Thread(target=worker)
        t.start()
        _WORKERS.append(t)
        return _Work(t) if async_op else None

    return collective


@pytest.mark.parametrize("async_op", [False, True])
def test_a_settled_collective_frees_on_the_callers_thread(async_op: bool) -> None:
    assert _frees_seen(_settled(_collective(async_op)), async_op) == 1


@pytest.mark.parametrize("async_op", [False, True])
def test_an_unsettled_collective_loses_the_free(async_op: bool) -> None:
    """Without settling the free is the worker's: the profiler never sees it (what made
    the ZeRO-3 and FSDP1 truths read a few buffers high, at random)."""
    assert _frees_seen(_collective(async_op), async_op) == 0


def _frees_seen(collective: Callable[..., Any], async_op: bool) -> int:
    """How many frees of the 4 MiB buffer the profiler saw."""
    mem = ProfiledMemory("cpu")
    mem.start()
    buf = torch.empty(4 * MIB, dtype=torch.uint8)
    work = collective(buf, async_op=async_op)
    if work is not None:
        work.wait()
    del buf, work
    _workers_let_go()
    mem.prof.__exit__(None, None, None)
    alloc = torch._C._profiler._EventType.Allocation
    todo = list(mem.prof.kineto_results.experimental_event_tree())
    frees = 0
    while todo:
        node = todo.pop()
        todo.extend(node.children)
        if node.tag == alloc and node.extra_fields.alloc_size == -4 * MIB:
            frees += 1
    return frees


def _cloning(async_op: bool) -> Callable[..., Any]:
    """A collective whose work makes its own copy of ``tensor`` (as gloo's
    ``_reduce_scatter_base`` clones its input) and frees it on the worker thread."""
    return _collective(async_op, hold=torch.Tensor.clone)


@pytest.mark.parametrize("async_op", [False, True])
def test_a_works_own_temporary_ends_with_the_wait(async_op: bool) -> None:
    """The work's copy is freed where the profiler cannot see: the truth ends it as the
    caller's wait returns, not with the phase (which read it under a later, larger
    allocation of the same phase: 20 MiB here)."""
    mem = ProfiledMemory("cpu")
    mem.start()
    with mem.phase(1, "backward"):
        buf = torch.empty(4 * MIB, dtype=torch.uint8)
        work = _settled(_cloning(async_op))(buf, async_op=async_op)
        if work is not None:
            work.wait()
        del buf, work
        _workers_let_go()
        big = torch.empty(16 * MIB, dtype=torch.uint8)
        del big
    mem.prof.__exit__(None, None, None)
    truth = phase_peaks(mem.prof, "cpu", alive=set())
    assert truth.orphan_bytes == 4 * MIB  # the copy: its free was the worker's
    assert truth.peaks[1, "backward"] == 16 * MIB


def test_the_callers_own_references_after_an_asynchronous_call_do_not_hold_the_wait() -> None:
    """DeepSpeed points a parameter at its all-gather's output between the call and the
    wait: the wait waits for the work's references alone."""
    import profmem

    before = profmem.unsettled
    buf = torch.empty(MIB, dtype=torch.uint8)
    work = _settled(_collective(True))(buf, async_op=True)
    alias = buf.view(-1)  # the caller's, kept past the wait
    t0 = time.monotonic()
    work.wait()
    assert time.monotonic() - t0 < profmem.SETTLE_TIMEOUT_S
    assert profmem.unsettled == before
    assert alias._base is buf


def test_a_collective_calling_another_is_settled_once() -> None:
    """``all_gather_into_tensor`` calls ``all_gather_single``, both wrapped: the outer
    wait must not take the inner work's references off twice (it waited out its timeout
    on every ZeRO-3 all-gather)."""
    import profmem

    before = profmem.unsettled
    inner = _settled(_collective(True))

    def outer(tensor: torch.Tensor, async_op: bool = True) -> Any:
        return inner(tensor, async_op=async_op)

    buf = torch.empty(MIB, dtype=torch.uint8)
    work = _settled(outer)(buf, async_op=True)
    work.wait()
    assert profmem.unsettled == before
