"""Many datagrams per system call, with their senders' credentials, holding the GIL.

The receiver thread of the live dashboard shares the interpreter lock with the Textual app.
Python's ``socket.recvmsg`` releases the lock around every call, and getting it back
while the app draws waits for the app's switch interval (5 ms): one datagram per wait,
so under a burst the socket's queue (``net.unix.max_dgram_qlen``, often 10 datagrams)
fills and senders drop events. ``recvmmsg(2)`` with ``MSG_DONTWAIT``, called through
``ctypes.PyDLL`` (which keeps the lock), takes everything queued, up to :data:`BATCH`
datagrams, in one call that never blocks; the thread waits for data (in ``poll``, lock
released) only when the queue is empty.

Linux only; :func:`batch_receiver` returns None where ``recvmmsg`` is not available, and
the receiver then reads one datagram per call.
"""

from __future__ import annotations

import ctypes
import errno
import socket
import struct
from typing import Any

BATCH = 64
"""Datagrams taken per call at most."""

CREDS = struct.Struct("3i")
"""``struct ucred``: pid, uid, gid (what ``SCM_CREDENTIALS`` carries)."""

CMSG_SPACE = socket.CMSG_SPACE(CREDS.size)
"""Ancillary bytes one datagram's credentials take."""

_CMSG_HEADER = struct.Struct("@Nii")  # struct cmsghdr: cmsg_len (size_t), level, type


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _MsgHdr(ctypes.Structure):
    _fields_ = [
        ("msg_name", ctypes.c_void_p),
        ("msg_namelen", ctypes.c_uint32),
        ("msg_iov", ctypes.POINTER(_IoVec)),
        ("msg_iovlen", ctypes.c_size_t),
        ("msg_control", ctypes.c_void_p),
        ("msg_controllen", ctypes.c_size_t),
        ("msg_flags", ctypes.c_int),
    ]


class _MMsgHdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _MsgHdr), ("msg_len", ctypes.c_uint)]


class BatchReceiver:
    """Takes what a datagram socket holds, in one ``recvmmsg`` call, without waiting.

    Args:
        sock: A bound datagram socket with ``SO_PASSCRED`` on.
        size: Bytes kept of each datagram (one more than the largest valid one, so that a
            longer one is seen as truncated).
        batch: Datagrams per call at most.
    """

    def __init__(self, sock: socket.socket, size: int, batch: int = BATCH) -> None:
        self.fd = sock.fileno()
        self.size = size
        self.batch = batch
        self._call = _recvmmsg()
        if self._call is None:
            raise OSError(errno.ENOSYS, "recvmmsg is not available")
        self._data = ctypes.create_string_buffer(batch * size)
        self._control = ctypes.create_string_buffer(batch * CMSG_SPACE)
        self._iov = (_IoVec * batch)()
        self._msgs = (_MMsgHdr * batch)()
        data, control = ctypes.addressof(self._data), ctypes.addressof(self._control)
        self._data_at = [data + i * size for i in range(batch)]
        self._control_at = [control + i * CMSG_SPACE for i in range(batch)]
        for i in range(batch):
            self._iov[i].iov_base = self._data_at[i]
            self._iov[i].iov_len = size
            hdr = self._msgs[i].msg_hdr
            hdr.msg_iov = ctypes.pointer(self._iov[i])
            hdr.msg_iovlen = 1
            hdr.msg_control = self._control_at[i]
            hdr.msg_controllen = CMSG_SPACE
        # What a call changes is reset from this copy, in one move: setting two fields of
        # each of the 64 headers through ctypes cost about 70 us a call, most of a relay
        # waking for one datagram (a fork storm: 18% of a core for 1,800 datagrams/s).
        self._pristine = bytes(self._msgs)
        self._used = 0  # headers the last call filled

    def receive(self) -> list[tuple[bytes, int | None]]:
        """What is queued now (at most :attr:`batch` datagrams), with each sender's pid.

        A datagram longer than :attr:`size` comes back as :attr:`size` bytes (too long to
        be valid); a pid is None when no credentials came with it.

        Raises:
            OSError: The call failed for another reason than an empty queue.
        """
        msgs = self._msgs
        if self._used:
            ctypes.memmove(msgs, self._pristine, self._used * ctypes.sizeof(_MMsgHdr))
        n = self._call(self.fd, msgs, self.batch, socket.MSG_DONTWAIT, None)
        self._used = max(n, 0)
        if n < 0:
            err = ctypes.get_errno()
            if err in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                return []
            raise OSError(err, "recvmmsg failed")
        out: list[tuple[bytes, int | None]] = []
        for i in range(n):
            m = msgs[i]
            length = self.size if m.msg_hdr.msg_flags & socket.MSG_TRUNC else m.msg_len
            data = ctypes.string_at(self._data_at[i], min(length, self.size))
            out.append((data, self._sender(i, m.msg_hdr.msg_controllen)))
        return out

    def _sender(self, i: int, length: int) -> int | None:
        if length < _CMSG_HEADER.size + CREDS.size:
            return None
        control = ctypes.string_at(self._control_at[i], length)
        _, level, kind = _CMSG_HEADER.unpack_from(control)
        if level != socket.SOL_SOCKET or kind != socket.SCM_CREDENTIALS:
            return None
        offset = socket.CMSG_LEN(0)  # the data follows the aligned header
        return CREDS.unpack_from(control, offset)[0]


def _recvmmsg() -> Any:
    """libc's ``recvmmsg``, called with the interpreter lock held; None where missing."""
    try:
        libc = ctypes.PyDLL(None, use_errno=True)
        call = libc.recvmmsg
    except (OSError, AttributeError):
        return None
    call.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(_MMsgHdr),
        ctypes.c_uint,
        ctypes.c_int,
        ctypes.c_void_p,
    ]
    call.restype = ctypes.c_int
    return call


def available() -> bool:
    """Whether this system has ``recvmmsg`` (Linux), without making a receiver's buffers."""
    return _recvmmsg() is not None


def batch_receiver(sock: socket.socket, size: int) -> BatchReceiver | None:
    """A :class:`BatchReceiver` on ``sock``, or None where the system has no ``recvmmsg``."""
    try:
        return BatchReceiver(sock, size)
    except OSError:
        return None


# --------------------------------------------------------------------------- the relay

FRAME = struct.Struct("<Ii")
"""A relayed datagram's header on the pipe: its length, and its sender's pid (-1: none)."""


READY = FRAME.pack(0, 0)
"""The relay's first frame: it is reading the socket (no datagram is empty and from pid 0)."""

RELAY_BACKLOG = 64 << 20
"""Bytes the relay holds while the pipe is full (about 12 s of a 20k events/s burst): past
that it stops reading the socket, and senders wait, then drop and count. They are held in
one buffer, so this is also about what they cost it: a chunk object per read (a datagram
each, when senders trickle) cost 3.6 times their size."""

DRAIN = b"D"
"""What gpuwatch writes on the lifeline before closing it to stop the relay: take what the
socket still holds and deliver everything, then exit (a lifeline closed without it means
gpuwatch died: the relay exits at once)."""

DRAIN_QUIET = 0.25
"""Seconds without a datagram after which a draining socket counts as empty."""

DRAIN_LIMIT = 5.0
"""Seconds gpuwatch takes at most, when it stops, to record what is still on its way."""


def relay(sock_fd: int, out_fd: int, lifeline_fd: int, size: int) -> int:
    """Forward every datagram of ``sock_fd`` to the pipe ``out_fd`` until gpuwatch stops.

    Runs in a process of its own (``python -I -S _batch.py ...``, the standard library
    only): no interpreter lock shared with a dashboard, so the socket's small queue is
    emptied the moment anything arrives. What the dashboard has not read yet waits in the
    pipe (made 1 MiB large) and then in the relay's own memory (:data:`RELAY_BACKLOG`),
    so a burst the dashboard cannot follow at once is delivered late, not lost. The
    lifeline is a pipe whose other end only gpuwatch holds. When gpuwatch stops it sends
    :data:`DRAIN` first: the relay reads the socket until it is quiet for
    :data:`DRAIN_QUIET` (or :data:`DRAIN_LIMIT` has passed), writes out all it holds and
    exits, closing the pipe. When gpuwatch dies the lifeline just closes, and the relay
    exits at once.
    """
    import os
    import select
    import time

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
        if want_read != reading:
            reading = want_read
            if reading:
                poller.register(sock_fd, select.POLLIN)
            else:
                poller.unregister(sock_fd)
        if bool(backlog) != writing:
            writing = bool(backlog)
            if writing:
                poller.register(out_fd, select.POLLOUT)
            else:
                poller.unregister(out_fd)
        events = dict(poller.poll(timeout))
        if lifeline_fd in events:
            if os.read(lifeline_fd, 1) != DRAIN:
                return 0  # gpuwatch is gone: nobody reads what the relay holds
            poller.unregister(lifeline_fd)
            draining = last = time.monotonic()
        if sock_fd in events:
            while len(backlog) < RELAY_BACKLOG:
                got = batch.receive()
                for data, pid in got:
                    backlog += FRAME.pack(len(data), -1 if pid is None else pid)
                    backlog += data
                if got and draining is not None:
                    last = time.monotonic()
                if len(got) < batch.batch:
                    break
        if backlog:  # as much as the pipe takes now
            try:
                with memoryview(backlog) as view:  # released before the buffer changes
                    n = os.write(out_fd, view)
            except BlockingIOError:
                n = 0
            del backlog[:n]  # from the front: CPython moves a start offset, no copy


if __name__ == "__main__":  # the relay process: _batch.py SOCK_FD OUT_FD LIFELINE_FD SIZE
    import sys

    try:
        sys.exit(relay(*(int(a) for a in sys.argv[1:5])))
    except (OSError, KeyboardInterrupt):
        sys.exit(1)
