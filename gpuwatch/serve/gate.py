"""The door of ``gpuwatch serve``: how many connections it holds, and for how long.

A server on a network address can be reached by anyone before they show a token, so what
an unauthenticated client can hold is bounded here:

- **A cap on connections** below the process's descriptor limit (whose soft value is raised
  to the hard one at start): a new connection past the cap closes the oldest one that has
  not yet passed the guard (no request accepted on it), so a crowd of half-open
  connections never starves a visitor with the token, and ``accept()`` never fails for
  want of descriptors.
- **A time limit on unfinished requests**: a connection must complete a request within
  :data:`REQUEST_WAIT` of opening (``$GPUWATCH_SERVE_REQUEST_WAIT`` may say otherwise), and
  an idle one is closed after as long (aiohttp's keep-alive timer, which starts when the
  connection opens).
- **One line with a count** for what it closed to make room, at most every
  :data:`REPORT_EVERY` seconds, and the same for descriptor errors of the event loop.
"""

from __future__ import annotations

import asyncio
import errno
import math
import os
import resource
import socket
from collections.abc import Callable, Mapping
from typing import Any

REQUEST_WAIT = 10.0
"""Seconds a connection has to send a whole request, and an idle one is kept."""
REQUEST_WAIT_ENV = "GPUWATCH_SERVE_REQUEST_WAIT"
"""Overrides :data:`REQUEST_WAIT` (seconds): a shorter door for the tests that wait it out."""
REPORT_EVERY = 10.0
"""Seconds between two lines about connections closed to make room."""
DESCRIPTORS_KEPT = 64
"""Descriptors kept out of the cap for the server itself (files, pipes, the loop)."""
DESCRIPTORS_PER_VISITOR = 8
"""Descriptors a visitor takes besides its connection (its process's pipes and control)."""
CAP_FLOOR = 16


def raise_descriptor_limit() -> int:
    """Raise the soft limit on open descriptors to the hard one; returns the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20) if soft != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= hard:
        return int(hard if soft == resource.RLIM_INFINITY else soft)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return int(hard)
    except (ValueError, OSError):
        return int(soft)


def request_wait(environ: Mapping[str, str] = os.environ) -> float:
    """Seconds from ``$GPUWATCH_SERVE_REQUEST_WAIT`` (a positive number), else
    :data:`REQUEST_WAIT`."""
    try:
        value = float(environ.get(REQUEST_WAIT_ENV, ""))
    except ValueError:
        return REQUEST_WAIT
    return value if 0 < value < math.inf else REQUEST_WAIT


def connection_cap(limit: int, max_visitors: int) -> int:
    """Connections held at once under a descriptor ``limit``."""
    spare = DESCRIPTORS_KEPT + DESCRIPTORS_PER_VISITOR * max_visitors
    return max(CAP_FLOOR, min(limit - spare, 65536))


ACCEPT_BATCH = 64
"""Connections accepted in one turn of the loop (then others' events are served)."""
RETRY_AFTER = 0.1
"""Seconds accepting waits after the system itself ran out of descriptors."""


def listen(host: str, port: int, backlog: int) -> socket.socket:
    """A non-blocking listening socket on the first address ``host`` names.

    Raises:
        OSError: It cannot listen there.
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    if not infos:
        raise OSError(f"no address for {host}")
    family, _, _, _, address = infos[0]
    sock = socket.create_server(address[:2], family=family, backlog=backlog)
    sock.setblocking(False)
    return sock


class _Counted(asyncio.Protocol):
    """aiohttp's protocol for one connection, with its end told to the gate."""

    def __init__(self, inner: Any, gate: Gate) -> None:
        self.inner, self.gate = inner, gate

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            self.inner.connection_lost(exc)
        finally:
            self.gate.lost(self.inner)


class Gate:
    """Accepts connections for aiohttp, holding at most ``cap`` of them at once.

    At the cap, the oldest connection on which no request has passed the guard is closed
    to make room; while every connection is trusted (or still closing), accepting waits.
    Connections are counted from ``accept()`` to their end, so the descriptors in use stay
    below the limit whatever arrives.

    Args:
        cap: Connections at once.
        say: Where the report goes (one line).
    """

    def __init__(self, cap: int, say: Callable[[str], None]) -> None:
        self.cap = cap
        self.say = say
        self.open = 0  # accepted and not yet ended (closing ones included)
        self._untrusted: dict[Any, None] = {}  # insertion order: the oldest first
        self._trusted: set[Any] = set()
        self.evicted = 0
        self.errors = 0
        self._report: asyncio.TimerHandle | None = None
        self._sock: socket.socket | None = None
        self._factory: Callable[[], Any] | None = None
        self._reading = False
        self._connecting: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return self.open

    # ------------------------------------------------------------------ accepting

    def serve(self, sock: socket.socket, factory: Callable[[], Any]) -> None:
        """Accept on ``sock``; each connection gets ``factory()`` (aiohttp's handler)."""
        self._sock, self._factory = sock, factory
        self._resume()

    def close(self) -> None:
        """Stop accepting and close the listening socket."""
        self._pause()
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _resume(self) -> None:
        if not self._reading and self._sock is not None:
            asyncio.get_running_loop().add_reader(self._sock.fileno(), self._accept)
            self._reading = True

    def _pause(self) -> None:
        if self._reading and self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
        self._reading = False

    def _accept(self) -> None:
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        for _ in range(ACCEPT_BATCH):
            if self.open >= self.cap:
                self._make_room()
                if self.open >= self.cap:
                    self._pause()  # the ends of those closing resume it (lost())
                    return
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    raise
                # Out of descriptors all the same (the server's own files): wait a little
                # rather than spin on a socket that stays readable.
                self.errors += 1
                self._schedule_report()
                self._pause()
                loop.call_later(RETRY_AFTER, self._resume)
                return
            self.open += 1
            task = loop.create_task(self._connect(conn))
            self._connecting.add(task)  # held until done: the loop keeps only weak ones
            task.add_done_callback(self._connecting.discard)

    async def _connect(self, conn: socket.socket) -> None:
        assert self._factory is not None
        factory = self._factory
        handler = None

        def protocol() -> asyncio.Protocol:
            nonlocal handler
            handler = factory()
            self._untrusted[handler] = None
            return _Counted(handler, self)

        try:
            conn.setblocking(False)
            await asyncio.get_running_loop().connect_accepted_socket(protocol, conn)
        except (OSError, RuntimeError):
            conn.close()
            if handler is None:
                self.open -= 1
                self._resume()
            else:
                self.lost(handler)

    def _make_room(self) -> None:
        """Close the oldest untrusted connections for the ones waiting to be accepted."""
        for _ in range(ACCEPT_BATCH):
            if not self._untrusted:
                return
            oldest = next(iter(self._untrusted))
            del self._untrusted[oldest]
            transport = oldest.transport
            if transport is not None:
                transport.abort()  # its descriptor is free once it has ended (lost())
            self.evicted += 1
        self._schedule_report()

    # ------------------------------------------------------------------ connections

    def trust(self, handler: Any) -> None:
        """A request on this connection passed the guard: never closed to make room."""
        if handler in self._untrusted:
            del self._untrusted[handler]
            self._trusted.add(handler)

    def lost(self, handler: Any) -> None:
        """A connection ended: its place is free."""
        self._untrusted.pop(handler, None)
        self._trusted.discard(handler)
        self.open -= 1
        if self.open < self.cap:
            self._resume()

    # ------------------------------------------------------------------ reports

    def loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """The loop's exception handler: descriptor shortages counted, not each logged."""
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
            self.errors += 1
            self._schedule_report()
            return
        loop.default_exception_handler(context)

    def _schedule_report(self) -> None:
        if self._report is None:
            self._report = asyncio.get_running_loop().call_later(REPORT_EVERY, self._say)

    def _say(self) -> None:
        self._report = None
        parts = []
        if self.evicted:
            parts.append(
                f"closed {self.evicted} connections that had sent no complete request, to "
                f"keep room under the cap of {self.cap} connections"
            )
        if self.errors:
            parts.append(f"{self.errors} times out of file descriptors")
        self.evicted = self.errors = 0
        if parts:
            self.say(f"in the last {REPORT_EVERY:.0f} s: " + "; ".join(parts))
