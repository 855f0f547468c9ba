"""Datagrams of the annotation socket with their senders' pids: many per call, or one.

The thread (or relay) that reads the socket shares no time with anything else it could do
instead: the socket's queue (``net.unix.max_dgram_qlen``, often 10 datagrams) fills within
a millisecond of a burst, and then senders drop events. Python's ``socket.recvmsg``
releases the interpreter lock around every call, and a thread that must get it back from a
drawing dashboard waits for the switch interval (5 ms) each time: one datagram per wait.
``recvmmsg(2)`` with ``MSG_DONTWAIT``, called through ``ctypes.PyDLL`` (which keeps the
lock), takes everything queued, up to :data:`BATCH` datagrams, in one call that never
blocks; the reader waits for data (in ``poll``, lock released) only when the queue is
empty.

``recvmmsg`` is Linux only: :func:`batch_receiver` returns None where it is not available,
and the reader then takes one datagram per call (:func:`receive_one`).

The standard library only: the relay (``relay.py``) runs this in a bare child.
"""

from __future__ import annotations

import ctypes
import errno
import socket
import struct
from collections.abc import Callable

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


_RecvMmsg = Callable[[int, "ctypes.Array[_MMsgHdr]", int, int, None], int]
"""libc's ``recvmmsg(fd, msgs, count, flags, timeout)``, as ctypes calls it."""


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
        call = _recvmmsg()
        if call is None:
            raise OSError(errno.ENOSYS, "recvmmsg is not available")
        self._call: _RecvMmsg = call
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
        # every header through ctypes costs more than the rest of a call that takes one
        # datagram, and a relay woken for each datagram of a trickle pays it every time.
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
        pid: int = CREDS.unpack_from(control, offset)[0]
        return pid


def _recvmmsg() -> _RecvMmsg | None:
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


def receive_one(sock: socket.socket, buf: bytearray) -> list[tuple[bytes, int | None]]:
    """One queued datagram and its sender, without waiting; [] when none is queued.

    A datagram longer than ``buf`` comes back as ``len(buf)`` bytes (too long to be valid).
    """
    try:
        n, ancillary, flags, _ = sock.recvmsg_into([buf], CMSG_SPACE, socket.MSG_DONTWAIT)
    except OSError:  # nothing queued (EAGAIN), or the socket is closing: nothing to take
        return []
    if flags & socket.MSG_TRUNC:
        n = len(buf)
    return [(bytes(buf[:n]), sender_pid(ancillary))]


def sender_pid(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """The pid in a datagram's ``SCM_CREDENTIALS``, or None when none came with it."""
    for level, kind, data in ancillary:
        ours = level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS
        if ours and len(data) >= CREDS.size:
            pid: int = CREDS.unpack_from(data)[0]
            return pid
    return None
