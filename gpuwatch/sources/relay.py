"""The annotation relay: a child process that empties the socket and forwards it to gpuwatch.

The relay shares no interpreter lock with a dashboard, so the socket's small queue is
emptied the moment anything arrives. What gpuwatch has not read yet waits in the frame
pipe (:data:`RELAY_PIPE`) and then in the relay's own memory (:data:`RELAY_BACKLOG`), so a
burst the dashboard cannot follow at once is delivered late, not lost.

It is a plain forwarder, one frame per datagram (tag: the sender's pid from the kernel,
-1 when none came): every moment it spends on anything else is a moment the socket's queue
can fill, so validating is gpuwatch's work. It runs as a bare child (``child.py``): the
standard library only, no ``site``, no training-side client imported, so that it starts as
fast as an interpreter can and nothing of the user's environment runs in it.
"""

from __future__ import annotations

import os
import select
import socket
import time

from .child import FRAME, LIFELINE_FD, READY, Child, frames_out, lifeline_said
from .datagrams import BatchReceiver, available

RELAY_START = 10.0
"""Seconds the relay may take to start reading (a loaded machine); else a thread reads."""

RELAY_PIPE = 1 << 20
"""Bytes the relay's pipe holds (Linux's most for an unprivileged process): a burst's
worth while the dashboard is busy drawing."""

RELAY_BACKLOG = 64 << 20
"""Bytes the relay holds while the pipe is full: past that it stops reading the socket,
and senders wait, then drop and count. They are held in one buffer, so this bounds what
they cost the relay's memory too (an object per read would cost several times their size
when senders trickle, a datagram per read)."""

DRAIN_QUIET = 0.25
"""Seconds without a datagram after which a draining socket counts as empty."""

DRAIN_LIMIT = 5.0
"""Seconds gpuwatch takes at most, when it stops, to record what is still on its way."""


def start(sock: socket.socket, size: int) -> Child | None:
    """Start a relay on ``sock``, reading; None (nothing left running) where it cannot.

    Args:
        sock: The bound annotation socket (``SO_PASSCRED`` on).
        size: Bytes kept of each datagram (one more than the longest valid one).
    """
    if not available():
        return None
    fd = sock.fileno()
    relay = Child.start(
        __name__, [str(fd), str(size)], bare=True, pass_fds=[fd], pipe_size=RELAY_PIPE
    )
    if relay is None:
        return None
    # Started means reading: a sender greeted from now on must not wait on an empty chair.
    if not relay.wait_ready(RELAY_START):
        relay.reap(2.0)
        relay.close_frames()
        return None
    return relay


def main(argv: list[str]) -> int:
    """The relay process: ``SOCK_FD SIZE``; frames on stdout, lifeline on stdin."""
    try:
        return relay(int(argv[0]), frames_out(), LIFELINE_FD, int(argv[1]))
    except (OSError, KeyboardInterrupt):
        return 1


def relay(sock_fd: int, out_fd: int, lifeline_fd: int, size: int) -> int:
    """Forward every datagram of ``sock_fd`` to the pipe ``out_fd`` until gpuwatch stops.

    When gpuwatch stops it says :data:`~gpuwatch.sources.child.DRAIN` on the lifeline: the
    relay reads the socket until it is quiet for :data:`DRAIN_QUIET` (or
    :data:`DRAIN_LIMIT` has passed), writes out all it holds and exits, closing the pipe.
    A lifeline that closes without a word ends it at once: nobody reads what it holds.
    """
    sock = socket.socket(fileno=sock_fd)
    batch = BatchReceiver(sock, size)
    os.write(out_fd, READY)  # before the pipe is non-blocking: it is empty
    os.set_blocking(out_fd, False)
    backlog = bytearray()  # framed datagrams the pipe has not taken yet, oldest first
    poller = select.poll()
    poller.register(lifeline_fd, select.POLLIN | select.POLLHUP)
    reading = writing = False
    draining: float | None = None  # when gpuwatch asked to drain
    last = 0.0  # when a datagram last came, while draining
    while True:
        want_read = len(backlog) < RELAY_BACKLOG
        timeout = None
        if draining is not None:
            now = time.monotonic()
            if now - last >= DRAIN_QUIET or now - draining >= DRAIN_LIMIT:
                want_read = False  # the socket is quiet, or time is up
                if not backlog:
                    return 0
            else:
                timeout = max(1, int((DRAIN_QUIET - (now - last)) * 1000) + 1)
        reading = _watch(poller, sock_fd, select.POLLIN, want_read, reading)
        writing = _watch(poller, out_fd, select.POLLOUT, bool(backlog), writing)
        events = dict(poller.poll(timeout))
        if lifeline_fd in events:
            if not lifeline_said(lifeline_fd):
                return 0
            poller.unregister(lifeline_fd)
            draining = last = time.monotonic()
        if sock_fd in events and _receive(batch, backlog) and draining is not None:
            last = time.monotonic()
        if backlog:  # as much as the pipe takes now
            _flush(out_fd, backlog)


def _watch(poller: select.poll, fd: int, mask: int, want: bool, was: bool) -> bool:
    """Poll ``fd`` for ``mask`` while ``want`` (registered or not as it changes)."""
    if want != was:
        if want:
            poller.register(fd, mask)
        else:
            poller.unregister(fd)
    return want


def _receive(batch: BatchReceiver, backlog: bytearray) -> bool:
    """Frame what the socket holds into ``backlog`` (until it is full); whether any came."""
    came = False
    while len(backlog) < RELAY_BACKLOG:
        got = batch.receive()
        for data, pid in got:
            backlog += FRAME.pack(len(data), -1 if pid is None else pid)
            backlog += data
        came = came or bool(got)
        if len(got) < batch.batch:
            break
    return came


def _flush(out_fd: int, backlog: bytearray) -> None:
    """Write as much of ``backlog`` as the pipe takes now, and drop it from the front."""
    try:
        with memoryview(backlog) as view:  # released before the buffer changes
            n = os.write(out_fd, view)
    except BlockingIOError:
        n = 0
    del backlog[:n]  # from the front: CPython moves a start offset, no copy
