"""GPU sampling in a process of its own, so that a busy gpuwatch never delays a sample.

The sampler wakes every 100 ms for a fraction of a millisecond of NVML calls; in the
gpuwatch process it must first take the interpreter lock from the receiver and the
recorder. On a loaded machine (a fork storm of short instrumented scripts, see
``benchmarks/bench_floods.py``) the thread holding the lock is itself waiting for a core,
and the sampler's wake-ups come late enough to miss samples. In a process of its own the
sampler waits for nothing but the kernel's scheduler, which serves a short sleeper at once.

:class:`GpuProcess` (the gpuwatch side) starts a child (``child.py``) that runs
:func:`main`: the same :class:`~gpuwatch.sources.gpu.GpuSampler` against an
:class:`_Outbox`, where each call the sampler makes on its sink is queued, and a writer
thread sends what is queued as one frame (tag 0; the payload a list of calls in
``marshal``, this interpreter's own format: the child is ours, on a private pipe, and it
is cheaper to write and read than JSON); a thread here makes the calls on the real
session. Samples carry their own ``t`` (one monotonic clock for every process), so a late
frame places nothing late. Where the child cannot start, the sampler runs in this process.
"""

from __future__ import annotations

import dataclasses
import json
import marshal
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from ..session import Device
from ..session.model import GpuProcRow
from ..session.ports import GpuSampleSink
from .child import READY, Child, frame, frames_out, lifeline_said
from .gpu import GpuSampler

START_LIMIT = 20.0
"""Seconds the child may take to say whether NVML opened (a loaded machine's interpreter
start, plus the sampler's own wait for a slow NVML); else sampling falls back to a thread."""

STOP_LIMIT = 2.0
"""Seconds the child may take to exit once told; then it is killed (it is ours)."""

_PIPE = 1 << 20  # bytes the pipe holds: a minute of samples while this process is paused
_QUEUED = 200_000  # calls the child holds beyond that (about 60 MB), then counts
_BATCH = 256  # calls per frame at most: a frame stays far below the reader's limit
_MAX_FRAME = 64 << 20  # longer is not a frame our child wrote

Call = tuple[Any, ...]
"""One call of the sampler on its sink: its kind (a key of the handlers), its arguments."""


class _Outbox:
    """The sink as the child's sampler sees it: every call is sent on ``fd``.

    Calls are queued and written in frames by a thread of their own, so that a full pipe
    (gpuwatch paused) never holds a sampling thread inside what the watchdog would take for
    a hung NVML call.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._calls: deque[Call] = deque()
        self._ready = threading.Event()
        self._closed = False
        self.dropped = 0  # calls not queued: gpuwatch has not read for minutes
        self._writer = threading.Thread(target=self._write, name="gpuwatch-gpu-out", daemon=True)
        self._writer.start()

    def send(self, kind: str, *args: Any) -> None:
        """Queue one call for the parent."""
        if len(self._calls) >= _QUEUED:
            self.dropped += 1
            return
        self._calls.append((kind, *args))
        self._ready.set()

    # What GpuSampler calls on its sink (GpuSampleSink).
    def note(self, text: str) -> None:
        self.send("note", text)

    def add_device(self, device: Device) -> Device:
        self.send("device", dataclasses.asdict(device))
        return device

    def set_device_state(self, key: str, state: str, note: str = "") -> None:
        self.send("state", key, state, note)

    def add_gpu_sample(self, key: str, row: dict[str, float | int | None]) -> None:
        self.send("sample", key, row)

    def add_gpu_processes(self, key: str, t: int, rows: Iterable[GpuProcRow]) -> None:
        self.send("procs", key, t, list(rows))

    def set_proc_info(self, pid: int, info: dict[str, Any]) -> None:
        self.send("info", pid, info)

    def set_sampler_rate(self, key: str, rate: float) -> None:
        self.send("rate", key, rate)

    def _write(self) -> None:
        while True:
            self._ready.wait()
            self._ready.clear()
            while self._calls:
                calls = [self._calls.popleft() for _ in range(min(len(self._calls), _BATCH))]
                try:
                    payload = marshal.dumps(calls)
                except ValueError:  # a type marshal does not know: sent as JSON would have it
                    payload = marshal.dumps(json.loads(json.dumps(calls, default=str)))
                data = frame(0, payload)
                try:
                    while data:
                        data = data[os.write(self._fd, data) :]
                except OSError:  # gpuwatch has gone: nobody to sample for
                    os._exit(0)
            if self.dropped and not self._calls:
                lost, self.dropped = self.dropped, 0
                self.send("note", f"gpuwatch did not read GPU samples for minutes: {lost} lost")
            if self._closed and not self._calls:
                return

    def close(self, timeout: float = 1.0) -> None:
        """Write what is queued (for at most ``timeout`` seconds)."""
        self._closed = True
        self._ready.set()
        self._writer.join(timeout)


def main(argv: list[str]) -> int:
    """The child: sample until the lifeline says. ``argv``: interval, process interval (s)."""
    fd = frames_out()
    os.write(fd, READY)
    out = _Outbox(fd)
    sink: GpuSampleSink = out
    sampler = GpuSampler(sink, interval=float(argv[0]), process_interval=float(argv[1]))
    ok = sampler.start()
    out.send("opened", ok)
    drain = True
    if ok:
        drain = lifeline_said()
        sampler.stop()
    if drain:  # else gpuwatch is gone, or does not wait: nobody reads the rest
        out.close()
    return 0


class GpuProcess:
    """Samples every GPU into ``session`` from a child process (a thread where it cannot).

    A frame or a call from the child that cannot be applied is counted
    (:attr:`rejected`) and said in a note: the first when it comes, the total when the
    child ends if more followed.

    Args:
        session: Where devices, samples, process lists and notes go.
        interval: Seconds between samples of each GPU.
        process_interval: Seconds between process lists of each GPU.
    """

    def __init__(
        self, session: GpuSampleSink, interval: float = 0.1, process_interval: float = 1.0
    ) -> None:
        self.session = session
        self.interval = interval
        self.process_interval = process_interval
        self.child: Child | None = None
        self.fallback: GpuSampler | None = None  # sampling in this process: the child failed
        self.rejected = 0  # frames and calls from the child that could not be applied
        self._reader: threading.Thread | None = None
        self._opened = threading.Event()
        self._said = False  # the child said whether NVML opened
        self._ok = False
        self._stopping = False
        self._handlers: dict[str, Callable[..., object]] = {
            "note": session.note,
            "device": lambda d: session.add_device(Device(**d)),
            "state": session.set_device_state,
            "sample": session.add_gpu_sample,
            "procs": lambda key, t, rows: session.add_gpu_processes(key, t, map(tuple, rows)),
            "info": session.set_proc_info,
            "rate": session.set_sampler_rate,
            "opened": self._on_opened,
        }

    def start(self) -> bool:
        """Start sampling; as :meth:`GpuSampler.start <gpuwatch.sources.gpu.GpuSampler.start>`."""
        if self._spawn():
            self._opened.wait(START_LIMIT)
            if self._said:
                if not self._ok:
                    self._stop_child()  # it exits on its own: reap it, leave no zombie
                return self._ok
            self._stop_child()  # it died, or hangs before NVML: sample in this process
        self.fallback = GpuSampler(
            self.session, interval=self.interval, process_interval=self.process_interval
        )
        return self.fallback.start()

    def _spawn(self) -> bool:
        child = Child.start(
            __name__, [str(self.interval), str(self.process_interval)], pipe_size=_PIPE
        )
        if child is None:
            return False
        self.child = child
        if not child.wait_ready(START_LIMIT):  # it died, or is not ours
            self._stop_child()
            return False
        self._reader = threading.Thread(target=self._read, name="gpuwatch-gpu-in", daemon=True)
        self._reader.start()
        return True

    def _on_opened(self, ok: bool) -> None:
        self._ok, self._said = bool(ok), True
        self._opened.set()

    def _read(self) -> None:
        """Make the child's calls on the session until it exits."""
        child = self.child
        assert child is not None
        try:
            if not child.read(self._apply, limit=_MAX_FRAME, size=_PIPE):
                self._reject("a frame longer than any the sampler writes; reading stops")
        finally:
            child.close_frames()
            self._opened.set()  # a child that died before it said: start() stops waiting
            if self.rejected > 1:
                self.session.note(
                    f"{self.rejected} frames or calls from the GPU sampling process could "
                    "not be applied in all"
                )
            if not self._stopping and self._ok:
                self.session.note("the GPU sampling process ended: GPU samples stop here")

    def _apply(self, tag: int, payload: bytes) -> None:
        try:
            calls = marshal.loads(payload)
            if tag != 0 or not isinstance(calls, list):
                raise ValueError(f"tag {tag}, a {type(calls).__name__}")
        except Exception as exc:  # marshal raises several kinds on damaged input
            self._reject(f"a damaged frame ({exc})")
            return
        for call in calls:
            try:
                kind, *args = call
                self._handlers[kind](*args)
            except Exception as exc:  # one call refused: the others still count
                self._reject(f"a call the session refused ({type(exc).__name__}: {exc})")

    def _reject(self, what: str) -> None:
        """Count one thing from the child that could not be applied; say the first."""
        self.rejected += 1
        if self.rejected == 1:
            self.session.note(
                f"the GPU sampling process sent {what[:200]}; "
                "GPU samples may be missing (counted, the total said at stop)"
            )

    def stop(self, timeout: float = 1.0) -> None:
        """Stop sampling within about ``timeout`` seconds (plus the child's exit)."""
        if self.fallback is not None:
            self.fallback.stop(timeout)
            return
        self._stop_child(timeout + STOP_LIMIT)

    def _stop_child(self, timeout: float = STOP_LIMIT) -> None:
        self._stopping = True
        child, self.child = self.child, None
        if child is None:
            return
        child.close_lifeline(drain=True)  # the child stops sampling, writes the rest, exits
        child.reap(timeout)
        if self._reader is not None:
            self._reader.join(timeout=1.0)
        else:
            child.close_frames()
