"""The background sender: a bounded queue on the training thread, a socket on its own thread.

The training thread only appends a tuple to a deque. A daemon thread wakes every few
milliseconds, turns the tuples into protocol messages and sends them with non-blocking
``sendto`` calls, so a missing, slow or stalled dashboard can never block training: what
cannot be sent is dropped and counted, and the count rides along with the next message that
does get through (a ``stats`` message of its own when none follows). Sequence numbers count
only datagrams sent, so the receiver tells those lost on the way from those dropped here.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import select
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from .. import protocol
from .._version import __version__
from ._sched import scheduler_identity
from ._torchmem import Figures, TorchMemory


class PhaseEvent(NamedTuple):
    """A phase boundary in the sender's queue.

    ``_api._begin`` and ``_end`` queue it with :meth:`Client.emit` as a plain tuple in
    this order: a tuple literal is far cheaper than a NamedTuple's constructor, and one
    is made at each boundary on the training thread.

    Attributes:
        kind: ``"phase"``, telling it from the other queued kinds.
        t: ``time.monotonic_ns()`` of the boundary.
        event: ``"begin"`` or ``"end"``.
        name: The phase's name.
        sid: Its span id.
        parent: The enclosing span's id.
        depth: Nesting depth.
        step: The training step.
        fig: Allocator figures read at the boundary (CUDA only), else None.
        error: The exception class that ended it, if any.
    """

    kind: str
    t: int
    event: str
    name: str
    sid: int
    parent: int | None
    depth: int
    step: int | None
    fig: Figures | None
    error: str | None


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


class Client:
    """Queues events from the training process and sends them to a dashboard.

    Args:
        path: Socket path; ``None`` means :func:`gpuwatch.protocol.socket_path`.
        memory: The allocator reader shared with the phase API.
        queue_max: Events held while the sender is behind; more are dropped and counted.
        interval: Seconds between sender wake-ups while events flow.
        idle_interval: The longest sleep while nothing is queued.
        memory_interval: Seconds between periodic ``memory`` events while CUDA is in use.
        max_wait: Seconds the sender thread may wait per flush for room in a busy
            dashboard's queue before dropping (never the training thread).

    Attributes:
        enabled: False sends nothing at all: no queued event, no periodic allocator
            figures, no hello, no goodbye (``gpuwatch.configure(enabled=False)``).
    """

    def __init__(
        self,
        path: str | None = None,
        memory: TorchMemory | None = None,
        *,
        queue_max: int = 8192,
        interval: float = 0.02,
        idle_interval: float = 0.1,
        memory_interval: float = 0.05,
        max_wait: float = 0.25,
    ) -> None:
        self.path = path or protocol.socket_path()
        self.memory = memory or TorchMemory()
        self.enabled = True
        self.pid = os.getpid()
        self.queue: deque[tuple[Any, ...]] = deque()
        self.queue_max = queue_max
        self.interval = interval
        self.idle_interval = max(interval, idle_interval)
        self.memory_interval = memory_interval
        self.max_wait = max_wait
        self._wait_budget = max_wait
        self.queue_dropped = 0  # written by the training thread only
        self.send_dropped = 0  # written by the sender thread only
        self.sent = 0
        self.facts: dict[str, Any] | None = None
        self._seq = 0  # datagrams sent so far: a drop uses up no number
        self._told = 0  # the drop count the last datagram sent carried
        self._sock: socket.socket | None = None
        self._peer: tuple[int, int, int] | None = None  # identity of the socket we greeted
        self._hello_devices: list[dict[str, Any]] | None = None
        self._scheduler: dict[str, str] | None = None
        self.notebook: str | None = None  # the Jupyter notebook this kernel runs ("": none)
        self._next_memory = 0.0
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._stop = threading.Event()
        # Called on the sender thread before each flush (the OOM module's late events).
        self.before_flush: Callable[[], None] | None = None
        # Given every flushed batch of events, in order, before they are sent (the notebook
        # extension's per-cell figures): whether or not anyone listens on the socket.
        self.tap: Callable[[list[tuple[Any, ...]]], None] | None = None
        self._tapped = 0  # events at the queue's head the tap has had (tap_now)

    @property
    def dropped(self) -> int:
        """Events lost so far: queue overflow plus sends that failed."""
        return self.queue_dropped + self.send_dropped

    # ------------------------------------------------------------------ training thread

    def emit(self, item: tuple[Any, ...]) -> None:
        """Queue one event; never blocks, never raises (cost: a length check and an append)."""
        q = self.queue
        if len(q) >= self.queue_max:
            self.queue_dropped += 1
            return
        q.append(item)
        if self._thread is None:
            self._start()

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is not None:
                return
            thread = threading.Thread(target=self._run, name="gpuwatch-sender", daemon=True)
            self._thread = thread
            thread.start()
            atexit.register(self.close)

    def tap_now(self) -> None:
        """Give the tap what is queued now, without sending it (a notebook cell's end).

        Sending stays the sender thread's: a stalled dashboard's wait never falls on the
        caller. The events go on waiting in the queue; the next flush sends them and does
        not tap them again.
        """
        tap = self.tap
        if tap is None:
            return
        with self._send_lock:
            q = self.queue
            n = len(q)
            if n <= self._tapped:
                return
            fresh = list(itertools.islice(q, self._tapped, n))
            self._tapped = n
            try:
                tap(fresh)
            except Exception:
                pass

    # ------------------------------------------------------------------ sender thread

    def _run(self) -> None:
        # Wake every `interval` while there is traffic; back off (doubling) to
        # `idle_interval` while there is none, so an idle sender costs the training process
        # next to nothing. The first event after a quiet spell waits at most idle_interval.
        delay = self.interval
        while not self._stop.is_set():
            self._stop.wait(delay)
            busy = self.enabled and bool(self.queue)
            try:
                self.flush()
            except Exception:  # never let the sender die; it must keep counting drops
                pass
            if busy:
                delay = self.interval
            else:
                limit = self.idle_interval
                if self.memory.active and self.enabled:  # periodic allocator figures are due
                    limit = min(limit, self.memory_interval)
                delay = min(limit, delay * 2)

    def flush(self) -> None:
        """Send everything queued (called by the sender thread, and once at exit).

        A disabled client sends nothing and keeps what is queued (for if it is enabled again).
        """
        if not self.enabled:
            return
        hook = self.before_flush
        if hook is not None:
            try:
                hook()
            except Exception:
                pass
        with self._send_lock:
            items: list[tuple[Any, ...]] = []
            q = self.queue
            while q:
                items.append(q.popleft())
            now = time.monotonic()
            if self.memory.active and now >= self._next_memory:
                self._next_memory = now + self.memory_interval
                fig = self.memory.current()
                if fig is not None:
                    items.append(("memory", time.monotonic_ns(), fig))
            tapped, self._tapped = self._tapped, 0
            tap = self.tap
            if tap is not None and len(items) > tapped:
                try:
                    tap(items[tapped:])
                except Exception:
                    pass
            if items or self.dropped != self._told:
                self._send_items(items)

    def _send_items(self, items: list[tuple[Any, ...]], stats: bool = True) -> None:
        """Send queued events with this flush's wait budget; count what cannot go.

        Args:
            items: The events, in order.
            stats: Then send a ``stats`` message if the drop count has grown since the
                last datagram that got through (none after a ``bye``).
        """
        self._wait_budget = self.max_wait
        if not self._connected():
            self.send_dropped += len(items)
            return
        for i, item in enumerate(items):
            if self._send_item(item):
                continue
            if self._peer is None and not self._connected():
                # The dashboard went away mid-batch and no new one is there.
                self.send_dropped += len(items) - i - 1
                return
        if stats and self.dropped != self._told:
            # Drops since the last datagram that got through: say so now, not only with
            # the next event (there may be none: the run's last events, its bye lost).
            self._send("stats", time.monotonic_ns(), {}, counted=False)

    def close(self, exit_code: int | None = None, reason: str = "exit") -> None:
        """Flush the queue and say goodbye (registered with atexit once sending starts)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if not self.enabled:
            return
        try:
            self.flush()
            # The bye carries the final drop count: it gets a wait budget of its own, so
            # that events the flush could not send do not take it down with them.
            bye = ("bye", time.monotonic_ns(), exit_code, reason)
            with self._send_lock:
                self._send_items([bye], stats=False)
        except Exception:
            pass

    # ------------------------------------------------------------------ helpers

    def _connected(self) -> bool:
        """Stat the socket; greet a dashboard we have not greeted yet (new one or restarted)."""
        try:
            st = os.stat(self.path)
        except OSError:
            self.disconnect()
            return False
        # ctime too: a restarted dashboard's socket may reuse the old inode number.
        peer = (st.st_dev, st.st_ino, st.st_ctime_ns)
        if peer == self._peer:
            devices = self.memory.devices()
            if devices is not None and devices is not self._hello_devices:
                self._send("hello", time.monotonic_ns(), self._hello_body())
            return self._peer is not None
        self.disconnect()
        if st.st_uid != os.getuid():
            # Someone else's socket: never hand them our annotations.
            return False
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        try:
            # Connected, so that poll() can tell when the dashboard's queue has room.
            sock.connect(self.path)
        except OSError:
            sock.close()
            return False
        self._sock = sock
        self._peer = peer
        if not self._send("hello", time.monotonic_ns(), self._hello_body()):
            self.disconnect()
            return False
        if self.facts is not None:
            self._send("facts", time.monotonic_ns(), {"facts": self.facts})
        return True

    def disconnect(self) -> None:
        """Forget the dashboard; the next flush greets whoever listens on the path."""
        self._peer = None
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def _send_item(self, item: tuple[Any, ...]) -> bool:
        if item[0] != "phase":
            return self._send(*self._message(item))
        _, t, event, name, sid, parent, depth, step, fig, error = item  # a PhaseEvent
        dropped = self.dropped
        try:
            data = protocol.encode_phase(
                self.pid, self._seq, t, dropped, event, name, sid, parent, depth, step, fig, error
            )
        except (protocol.ProtocolError, TypeError, ValueError):
            self.send_dropped += 1
            return False
        return self._transmit(data, dropped)

    def _send(self, kind: str, t: int, body: dict[str, Any], counted: bool = True) -> bool:
        """Send one message; ``counted`` False: its loss is no event's (a ``stats``)."""
        dropped = self.dropped
        try:
            data = protocol.encode(kind, self.pid, self._seq, t, dropped, body)
        except (protocol.ProtocolError, TypeError, ValueError):
            self.send_dropped += counted
            return False
        return self._transmit(data, dropped, counted)

    def _transmit(self, data: bytes, dropped: int, counted: bool = True) -> bool:
        """Send a datagram carrying sequence number ``self._seq`` and drop count ``dropped``."""
        sock = self._sock
        if sock is None:
            self.send_dropped += counted
            return False
        while True:
            try:
                sock.send(data)
                self.sent += 1
                self._seq += 1
                self._told = dropped
                return True
            except BlockingIOError:
                # The dashboard's queue is full: wait for room, on this thread only, while
                # this flush's budget lasts; then give up on this event (a stalled dashboard
                # costs us nothing). A wake-up promises no room: the other ranks of the job
                # send to the same queue and may take the slot first, so only the budget
                # ends the waiting, never a count of tries.
                if self._wait_budget <= 0 or not self._wait_writable(sock):
                    break
            except OSError:
                # No one bound there any more (ECONNREFUSED / ENOENT) or another fault.
                self.send_dropped += counted
                self.disconnect()
                return False
        self.send_dropped += counted
        return False

    def _wait_writable(self, sock: socket.socket) -> bool:
        start = time.monotonic()
        try:
            ready = select.select([], [sock], [], self._wait_budget)[1]
        except (OSError, ValueError):
            ready = []
        self._wait_budget -= time.monotonic() - start
        if not ready:
            self._wait_budget = 0.0
        return bool(ready)

    def _hello_body(self) -> dict[str, Any]:
        devices = self.memory.devices()
        self._hello_devices = devices
        torch = sys.modules.get("torch")
        body: dict[str, Any] = {
            "argv": [a[: protocol.MAX_TEXT] for a in sys.argv[:64]],
            "hostname": socket.gethostname()[:256],
            "wall_ns": time.time_ns(),
            "rank": _env_int("RANK"),
            "local_rank": _env_int("LOCAL_RANK"),
            "world_size": _env_int("WORLD_SIZE"),
            "python": sys.version.split()[0],
            "torch": (str(getattr(torch, "__version__", ""))[:64] or None) if torch else None,
            "client": __version__,
            "peaks": self.memory.peaks,
            "sync": self.memory.sync,
        }
        if devices is not None:
            body["devices"] = devices
        if self._scheduler is None:  # the environment is read once, at the first hello
            self._scheduler = scheduler_identity()
        if self._scheduler:
            body["scheduler"] = self._scheduler
        if self.notebook is None:
            self.notebook = notebook_name()
        if self.notebook:
            body["notebook"] = self.notebook
        return body

    def _message(self, item: tuple[Any, ...]) -> tuple[str, int, dict[str, Any]]:
        kind, t = item[0], item[1]
        body: dict[str, Any]
        if kind == "mark":
            _, _, text, level, step = item
            body = {"text": text, "level": level, "step": step}
        elif kind == "memory":
            body = {}
            _add_figures(body, item[2])
        elif kind == "bye":
            body = {"exit_code": item[2], "reason": item[3]}
        elif kind == "facts":
            body = {"facts": item[2]}
        else:  # "oom" and any dict-bodied kind
            body = item[2]
        return kind, t, body

    def reset_after_fork(self) -> None:
        """Start afresh in a forked child: new pid, no thread, no socket, nothing queued."""
        self.pid = os.getpid()
        self.queue = deque()
        self._tapped = 0
        self._thread = None
        self._start_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._stop = threading.Event()
        self.disconnect()
        self._seq = 0
        self._told = 0
        self.queue_dropped = 0
        self.send_dropped = 0
        self.sent = 0


MAX_NOTEBOOK = 256
"""Longest notebook name a ``hello`` carries (its end is kept: the file name)."""


def notebook_name() -> str:
    """The notebook a Jupyter kernel runs, or "" outside one.

    jupyter_server names each kernel's notebook in ``JPY_SESSION_NAME`` (its path); a
    kernel started otherwise (nbclient, a console) is named by the kernel id in its
    connection file (``-f .../kernel-<id>.json``).
    """
    name = os.environ.get("JPY_SESSION_NAME", "").strip()
    if name:
        return name[-MAX_NOTEBOOK:]
    if "ipykernel" not in sys.modules:
        return ""
    argv = sys.argv
    for i, a in enumerate(argv[:-1]):
        if a == "-f":
            base = os.path.basename(argv[i + 1])
            if base.endswith(".json"):
                base = base[:-5]
            return base[:MAX_NOTEBOOK]
    return "kernel"


def _add_figures(body: dict[str, Any], fig: tuple[Any, ...] | None) -> None:
    if fig is None:
        return
    body["dev"], body["allocated"], body["reserved"] = fig[0], fig[1], fig[2]
    if fig[3] is not None:
        body["peak_allocated"] = fig[3]
        body["peak_reserved"] = fig[4]
    if len(fig) > 5:
        body["inactive_split"], body["alloc_retries"], body["alloc_ooms"] = fig[5:8]
