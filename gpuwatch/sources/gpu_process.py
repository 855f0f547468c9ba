"""GPU sampling in a process of its own, so that a busy gpuwatch never delays a sample.

The sampler wakes every 100 ms for a fraction of a millisecond of NVML calls; in the
gpuwatch process it must first take the interpreter lock from the receiver and the
recorder. On a loaded machine (a fork storm of short instrumented scripts on 2 cores, see
``benchmarks/bench_floods.py``) the thread holding the lock is itself waiting for a core,
and wake-ups came 25 ms late at the median and 340-540 ms at the 99th percentile: one
sample in ten was never taken. In a process of its own the sampler waits for nothing but
the kernel's scheduler, which serves a short sleeper at once.

:class:`GpuProcess` (the gpuwatch side) starts a Python that runs :func:`child`: the
same :class:`~gpuwatch.sources.gpu.GpuSampler` against an :class:`_Outbox`, where
each call the sampler makes on its session is queued, and a writer thread sends what is
queued as one frame (``marshal``: this interpreter's own format, from a child of ours on a
private pipe, several times cheaper than JSON) on the child's stdout; a thread here makes
the calls on the real session. Samples carry their own ``t`` (one monotonic clock for every
process), so a late frame places nothing late. The child's stdin
is its lifeline: closed (gpuwatch stopping, or gone), the child stops sampling and exits.
Where the child cannot start, the sampler runs in this process as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import marshal
import os
import struct
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from ..session import Device, Session
from ..session.model import GpuProcRow

START_LIMIT = 20.0
"""Seconds the child may take to say whether NVML opened (a loaded machine's interpreter
start, plus the sampler's own wait for a slow NVML); else sampling falls back to a thread."""

STOP_LIMIT = 2.0
"""Seconds the child may take to exit once told; then it is killed (it is ours)."""

_PIPE = 1 << 20  # bytes the pipe holds: a minute of samples while this process is paused
_QUEUED = 200_000  # calls the child holds beyond that (about 60 MB), then counts
_FRAME = struct.Struct("<I")  # a frame's length; a marshalled list of calls follows
_MAX_FRAME = 64 << 20

# The child imports what this process imports (this gpuwatch, the same NVML backend),
# from this process's sys.path, and nothing from its own environment (-I).
_BOOT = (
    "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
    "from gpuwatch.sources.gpu_process import child; sys.exit(child(sys.argv[2:]))"
)


class _Outbox:
    """The session as the child's sampler sees it: every call is sent on ``fd``.

    Calls are queued and written in frames by a thread of their own, so that a full pipe
    (gpuwatch paused) never holds a sampling thread inside what the watchdog would take for
    a hung NVML call.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._calls: deque[tuple[Any, ...]] = deque()
        self._ready = threading.Event()
        self._closed = False
        self.dropped = 0  # calls not queued: gpuwatch has not read for minutes
        self._writer = threading.Thread(target=self._write, name="gpuwatch-gpu-out", daemon=True)
        self._writer.start()

    def send(self, kind: str, *args: Any) -> None:
        if len(self._calls) >= _QUEUED:
            self.dropped += 1
            return
        self._calls.append((kind, *args))
        self._ready.set()

    # What GpuSampler calls on its session.
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
                calls = [self._calls.popleft() for _ in range(min(len(self._calls), 256))]
                try:
                    payload = marshal.dumps(calls)
                except ValueError:  # a value marshal cannot take (never seen): as JSON has it
                    payload = marshal.dumps(json.loads(json.dumps(calls, default=str)))
                data = _FRAME.pack(len(payload)) + payload
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


def child(argv: list[str]) -> int:
    """The child: sample until stdin closes. ``argv``: interval, process interval (s)."""
    from .gpu import GpuSampler

    fd = os.dup(1)  # ours alone: a stray print of any module cannot corrupt the stream
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    out = _Outbox(fd)
    sampler = GpuSampler(
        out,
        interval=float(argv[0]),
        process_interval=float(argv[1]),
    )
    ok = sampler.start()
    out.send("opened", ok)
    if ok:
        with contextlib.suppress(OSError):
            while os.read(0, 64):
                pass
        sampler.stop()
    out.close()
    return 0


class GpuProcess:
    """Samples every GPU into ``session`` from a child process (a thread where it cannot).

    Args:
        session: Where devices, samples, process lists and notes go.
        interval: Seconds between samples of each GPU.
        process_interval: Seconds between process lists of each GPU.
    """

    def __init__(self, session: Session, interval: float = 0.1, process_interval: float = 1.0):
        self.session = session
        self.interval = interval
        self.process_interval = process_interval
        self.child: subprocess.Popen | None = None
        self.fallback: Any = None  # a GpuSampler in this process, where the child failed
        self._lifeline: int | None = None
        self._reader: threading.Thread | None = None
        self._opened = threading.Event()
        self._said = False  # the child said whether NVML opened
        self._ok = False
        self._stopping = False
        self._handlers: dict[str, Callable[..., None]] = {
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
        return self._start_fallback()

    def _start_fallback(self) -> bool:
        from .gpu import GpuSampler

        self.fallback = GpuSampler(
            self.session, interval=self.interval, process_interval=self.process_interval
        )
        return self.fallback.start()

    def _spawn(self) -> bool:
        life_r, life_w = os.pipe()
        data_r, data_w = os.pipe()
        with contextlib.suppress(OSError, AttributeError):
            import fcntl

            fcntl.fcntl(data_r, fcntl.F_SETPIPE_SZ, _PIPE)
        args = [json.dumps(sys.path), str(self.interval), str(self.process_interval)]
        try:
            self.child = subprocess.Popen(
                [sys.executable, "-I", "-c", _BOOT, *args],
                stdin=life_r,
                stdout=data_w,
                stderr=subprocess.DEVNULL,
                # Not in the terminal's process group: Ctrl-C goes to gpuwatch, which stops
                # the child through its lifeline once it has finished the recording.
                start_new_session=True,
            )
        except OSError:
            for fd in (life_r, life_w, data_r, data_w):
                os.close(fd)
            return False
        os.close(life_r)
        os.close(data_w)
        self._lifeline = life_w
        self._reader = threading.Thread(
            target=self._read, args=(data_r,), name="gpuwatch-gpu-in", daemon=True
        )
        self._reader.start()
        return True

    def _on_opened(self, ok: bool) -> None:
        self._ok, self._said = bool(ok), True
        self._opened.set()

    def _read(self, fd: int) -> None:
        """Make the child's calls on the session until it exits."""
        pending = b""
        header = _FRAME.size
        try:
            while True:
                chunk = os.read(fd, _PIPE)
                if not chunk:
                    break
                pending += chunk
                at = 0
                while len(pending) - at >= header:
                    (length,) = _FRAME.unpack_from(pending, at)
                    if length > _MAX_FRAME:
                        return  # not our child's: stop reading (the finally notes it)
                    if len(pending) - at - header < length:
                        break
                    self._apply(pending[at + header : at + header + length])
                    at += header + length
                pending = pending[at:]
        except OSError:
            pass
        finally:
            os.close(fd)
            self._opened.set()  # a child that died before it said: start() stops waiting
            if not self._stopping and self._ok:
                self.session.note("the GPU sampling process ended: GPU samples stop here")

    def _apply(self, frame: bytes) -> None:
        try:
            calls = marshal.loads(frame)
        except Exception:
            return
        for kind, *args in calls:
            try:
                self._handlers[kind](*args)
            except Exception:  # one call the session refused: the others still count
                pass

    def stop(self, timeout: float = 1.0) -> None:
        """Stop sampling within about ``timeout`` seconds (plus the child's exit)."""
        if self.fallback is not None:
            self.fallback.stop(timeout)
            return
        self._stop_child(timeout + STOP_LIMIT)

    def _stop_child(self, timeout: float = STOP_LIMIT) -> None:
        self._stopping = True
        if self._lifeline is not None:
            os.close(self._lifeline)  # the child stops sampling, writes the rest, exits
            self._lifeline = None
        child, self.child = self.child, None
        if child is not None:
            try:
                child.wait(timeout)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if self._reader is not None:
            self._reader.join(timeout=1.0)
