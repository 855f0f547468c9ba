"""OOM forensics: an ``oom`` event for each out-of-memory error, and opt-in memory snapshots.

Two ways an OOM is seen:

- The CUDA caching allocator's out-of-memory observer (where this torch has
  ``torch._C._cuda_attach_out_of_memory_observer``), attached once CUDA is initialised. It
  runs on the allocating thread just before the error is raised, with the exact request
  size, the device's total and free memory; the phase is the one open on that thread. Its
  event waits for the error to pass through a phase, which adds the first line of the
  error's text; one the script catches before any phase sees it goes out without text
  after :data:`PENDING_WAIT` seconds (sent from the sender thread, never training's).
- A ``torch.OutOfMemoryError`` passing through an observed phase, manual or automatic
  (``_api._state.on_oom``). Used when no observer reported the error first; the sizes are
  read from the allocator where CUDA is in use and parsed from the error message otherwise.

The error always propagates to the user: nothing here catches it.

``GPUWATCH_SNAPSHOT=oom`` and/or ``spike`` (comma separated) turn on PyTorch's allocation
history (``torch.cuda.memory._record_memory_history``) as soon as CUDA is in use, and dump a
snapshot (``torch.cuda.memory._dump_snapshot``, opens in https://pytorch.org/memory_viz):

oom
    at an OOM; the ``oom`` event's ``snapshot`` field names the file.
spike
    at a phase boundary whose peak allocated memory tops the highest peak seen before by at
    least 10% and 64 MiB, from step 2 on (steps 0 and 1 set the steady state: optimizer
    state appears lazily at the first step); a warning mark names the file.

At most :data:`MAX_SNAPSHOTS` of each per process. Files go to ``$GPUWATCH_SNAPSHOT_DIR``,
else the current directory.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from typing import Any

from . import _api
from ._api import mark, send

SNAPSHOT_ENV = "GPUWATCH_SNAPSHOT"
SNAPSHOT_DIR_ENV = "GPUWATCH_SNAPSHOT_DIR"
MAX_SNAPSHOTS = 3
HISTORY_ENTRIES = 100_000
"""Allocation events kept by the history ring buffer (several KB each with stacks)."""
SPIKE_WARMUP_STEPS = 2
SPIKE_RATIO = 0.10
SPIKE_MIN = 64 * 1024**2
PENDING_WAIT = 0.5
"""Seconds an observer's event waits for its exception to reach a phase."""

_st = _api._state

_UNITS = {"B": 1, "bytes": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}
_SIZE = r"([0-9]+(?:\.[0-9]+)?) ?(bytes|B|KiB|MiB|GiB|TiB)"
_PATTERNS = {
    "requested": re.compile(r"Tried to allocate " + _SIZE),
    "total": re.compile(r"total capac\w* of " + _SIZE),
    "free": re.compile(r"of which " + _SIZE + r" is free"),
    "allocated": re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch"),
    "cached": re.compile(r"and " + _SIZE + r" is reserved by PyTorch but unallocated"),
}
_DEVICE = re.compile(r"\bGPU (\d+)\b")


class _Oom:
    """Process-wide OOM state."""

    def __init__(self) -> None:
        self.modes: frozenset[str] = frozenset()
        # The observer's event whose exception has not reached a phase yet: (since, body,
        # the observer's time: the event is sent with it, inside the phase that failed).
        self.pending: tuple[float, dict[str, Any], int] | None = None
        self.lock = threading.Lock()
        self.attached = False
        self.recording = False
        self.snapshots = {"oom": 0, "spike": 0}
        self.high = 0  # highest peak allocated seen at a boundary

    def take(self) -> tuple[float, dict[str, Any], int] | None:
        """The pending event (since, body, time), which is then no longer pending."""
        with self.lock:
            pending, self.pending = self.pending, None
        return pending


_O = _Oom()


def install() -> None:
    """Hook into the client (cheap, no torch): called when gpuwatch.instrument is imported."""
    _O.modes = snapshot_modes()
    _st.on_oom = report
    _st.client.before_flush = _send_stale
    _st.memory.on_active = _on_cuda_active
    if "spike" in _O.modes:
        _st.memory.on_peak = _on_peak


def snapshot_modes(env: dict[str, str] | None = None) -> frozenset[str]:
    """The snapshot triggers ``$GPUWATCH_SNAPSHOT`` asks for: a subset of {oom, spike}."""
    value = (os.environ if env is None else env).get(SNAPSHOT_ENV, "")
    return frozenset(
        m for m in re.split(r"[,|+ ]+", value.strip().lower()) if m in ("oom", "spike")
    )


def parse_message(message: str) -> dict[str, int]:
    """Sizes stated in a CUDA OOM message: requested, total, free, allocated, reserved, dev."""
    found: dict[str, int] = {}
    for key, pattern in _PATTERNS.items():
        m = pattern.search(message)
        if m:
            found[key] = int(float(m.group(1)) * _UNITS[m.group(2)])
    if "cached" in found:
        cached = found.pop("cached")
        if "allocated" in found:
            found["reserved"] = found["allocated"] + cached
    m = _DEVICE.search(message)
    if m:
        found["dev"] = int(m.group(1))
    return found


def report(exc: BaseException, phase: str | None) -> None:
    """The ``on_oom`` hook: an OutOfMemoryError left ``phase``. Sends one ``oom`` per error."""
    try:
        if getattr(exc, "_gpuwatch_seen", False):
            return  # an enclosing phase; the innermost one reported it
        try:
            # A mark on the user's exception object, which declares no such attribute.
            exc._gpuwatch_seen = True  # type: ignore[attr-defined]
        except Exception:
            pass
        message = _first_line(exc)
        claimed = _O.take()
        if claimed is not None:  # the allocator's observer saw it, with exact figures
            claimed[1]["message"] = message
            send("oom", claimed[1], claimed[2])
            return
        body: dict[str, Any] = {
            **parse_message(str(exc)),
            "phase": phase,
            "step": _st.step,
            "message": message,
        }
        _fill_from_allocator(body)
        if "oom" in _O.modes:
            body["snapshot"] = _snapshot("oom")
        send("oom", body)
    except Exception:
        pass


def _observer(device: int, alloc: int, total: int, free: int) -> None:
    """The allocator's OOM observer: runs on the allocating thread before the error."""
    try:
        t = time.monotonic_ns()
        stack = _st.stack()
        body: dict[str, Any] = {
            "dev": int(device),
            "requested": int(alloc),
            "total": int(total),
            "free": int(free),
            "phase": stack[-1][1] if stack else None,
            "step": _st.step,
            "message": None,
        }
        _fill_from_allocator(body)
        if "oom" in _O.modes:
            body["snapshot"] = _snapshot("oom")
        older = _O.take()
        if older is not None:  # an earlier one nobody claimed: it goes as it is
            send("oom", older[1], older[2])
        with _O.lock:
            _O.pending = (time.monotonic(), body, t)
    except Exception:
        pass


def _send_stale() -> None:
    """The sender thread's look before each flush: send an event no phase claimed."""
    pending = _O.pending
    if pending is None or time.monotonic() - pending[0] < PENDING_WAIT:
        return
    with _O.lock:
        if _O.pending is not pending:
            return
        _O.pending = None
    send("oom", pending[1], pending[2])


def _first_line(exc: BaseException) -> str | None:
    """The first line of the error's text (torch's OOM message is one long line)."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()[: 4 * 1024]
    return None


def _fill_from_allocator(body: dict[str, Any]) -> None:
    """Allocated / reserved and free / total from torch, where CUDA is in use."""
    memory = _st.memory
    if not memory.active:
        return
    dev = body.get("dev", memory.last_device)
    fig = memory.current(dev)
    if fig is not None:
        body["dev"], body["allocated"], body["reserved"] = fig[0], fig[1], fig[2]
    if body.get("free") is None or body.get("total") is None:
        info = memory.mem_get_info(body.get("dev"))
        if info is not None:
            body["free"], body["total"] = info


def _on_cuda_active() -> None:
    """CUDA is in use: attach the observer; start the allocation history if opted in."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is not None and not _O.attached:
        try:
            attach(_observer)
            _O.attached = True
        except Exception:
            pass
    if _O.modes and not _O.recording:
        try:
            torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES)
            _O.recording = True
        except Exception:
            pass


def _on_peak(fig: tuple[Any, ...]) -> None:
    """A boundary whose peak tops the watermark (spike snapshots only)."""
    high = fig[3] if fig[3] is not None else fig[1]
    before = _O.high
    _O.high = max(before, high)
    _st.memory.watermark = _O.high
    if (
        _st.step < SPIKE_WARMUP_STEPS
        or before <= 0
        or high < before + max(int(before * SPIKE_RATIO), SPIKE_MIN)
    ):
        return
    stack = _st.stack()
    phase = stack[-1][1] if stack else "no phase"
    path = _snapshot("spike")
    if path is not None:
        mark(
            f"memory snapshot at a new peak of {_gib(high)} in {phase} "
            f"(step {_st.step}, before {_gib(before)}): {path}",
            "warning",
        )
    if _O.snapshots["spike"] >= MAX_SNAPSHOTS:
        _st.memory.on_peak = None


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB"


def _snapshot(kind: str) -> str | None:
    """Dump a memory snapshot file; returns its path, or None (not CUDA, limit, failure)."""
    if _O.snapshots[kind] >= MAX_SNAPSHOTS:
        return None
    _O.snapshots[kind] += 1
    directory = os.environ.get(SNAPSHOT_DIR_ENV) or os.getcwd()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = os.path.join(directory, f"gpuwatch-{kind}-{os.getpid()}-step{_st.step}-{stamp}.pickle")
    try:
        os.makedirs(directory, exist_ok=True)
        dump_snapshot(path)
    except Exception:
        return None
    return path


def dump_snapshot(path: str) -> None:
    """Write PyTorch's memory snapshot (needs CUDA in use; raises otherwise)."""
    if not _st.memory.active:
        raise RuntimeError("no CUDA allocator in use")
    torch = sys.modules["torch"]
    torch.cuda.memory._dump_snapshot(path)
