"""The annotation receiver: the Unix datagram socket instrumented scripts send to.

It takes the socket's path (``socket_path.py``: a private directory, only a stale socket
replaced; ``lock_file.py``: one gpuwatch per path), reads the socket through the relay
process (``relay.py``) or, where that cannot run, a thread of its own
(``datagrams.py``), and validates every datagram before the session sees it: anything
malformed is counted in the session as a reject, never raised.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time

from .. import protocol
from ..session import Session
from . import relay as relay_process
from .child import Child
from .datagrams import CMSG_SPACE, batch_receiver, receive_one, sender_pid
from .lock_file import LockFile, lock_owner
from .relay import RELAY_PIPE
from .socket_path import (
    Identity,
    SocketDirUnsafe,
    SocketError,
    SocketInUse,
    SocketPathTaken,
    bind_private,
    prepare_dir,
    refuse_non_socket,
    remove_stale_socket,
    unlink_ours,
)

__all__ = [
    "AnnotationReceiver",
    "SocketDirUnsafe",
    "SocketError",
    "SocketInUse",
    "SocketPathTaken",
    "lock_owner",
]

COUNT_LIMIT = 2.0
"""Seconds, after :data:`~gpuwatch.sources.relay.DRAIN_LIMIT`, to count by sender what
could not be recorded in time (reading only the relay's frame headers)."""

_SIZE = protocol.MAX_DATAGRAM + 1
"""Bytes kept of a datagram: one more than the longest valid one, so a longer one shows."""


class AnnotationReceiver:
    """Receives protocol messages and applies them to a session on its own thread.

    The sender's identity is the kernel's word: the socket asks for each datagram's
    credentials (``SO_PASSCRED``), and the pid they carry replaces the one the datagram
    claims, so no process can speak for another. A claimed pid that differs (a script in a
    container names its own-namespace pid) is kept as the process's ``container_pid``.

    Args:
        session: Where validated messages go (:meth:`Session.ingest`).
        path: Socket path; ``None`` means :func:`gpuwatch.protocol.socket_path`.
    """

    def __init__(self, session: Session, path: str | None = None) -> None:
        self.session = session
        # The default directory is gpuwatch's own; an explicit path's directory is the user's.
        self.default_path = path is None and not os.environ.get(protocol.SOCKET_ENV)
        self.path = path or protocol.socket_path()
        self.received = 0
        self.rejected = 0
        self.unrecorded = 0  # datagrams taken at stop too late to record (counted as lost)
        self.cut_short: str | None = None  # what stop() could not record, in one line
        self._counting = False  # past the drain's time: datagrams are counted, not recorded
        self._unrecorded: dict[int, int] = {}  # sender pid -> datagrams counted so far
        self._relay_killed = False  # it held datagrams still when time ran out
        self._sock: socket.socket | None = None
        self._identity: Identity | None = None  # of the socket file we bound
        self._lock: LockFile | None = None
        self._relay: Child | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ------------------------------------------------------------------ binding

    def bind(self) -> None:
        """Take the path: lock, replace a stale socket, bind with 0600 permissions.

        Raises:
            SocketInUse: Another live gpuwatch, or another program, listens on the path.
            SocketDirUnsafe: The directory is not private to this user.
            SocketPathTaken: A file that is not a socket is at the path or its lock file.
            OSError: The socket cannot be created or bound.
        """
        prepare_dir(os.path.dirname(self.path), ours=self.default_path)
        refuse_non_socket(self.path)
        lock = LockFile.take(self.path)
        try:
            remove_stale_socket(self.path)
            sock, self._identity = bind_private(self.path)
        except BaseException:
            lock.release()
            raise
        sock.settimeout(0.2)
        self._sock, self._lock = sock, lock

    def announce(self, recording: str | None) -> None:
        """Name the recording this gpuwatch writes in its lock file, for a second one to say."""
        if self._lock is not None:
            self._lock.announce(recording)

    # ------------------------------------------------------------------ running

    def start(self, relay: bool = True) -> None:
        """Bind (if not yet bound) and start receiving.

        Args:
            relay: Read the socket in the relay process (``relay.py``) where the system
                allows: a busy dashboard can then never leave the socket's small queue
                full. Otherwise (or if the relay cannot start) a thread of this process
                reads it.
        """
        if relay:
            self.listen()
        elif self._sock is None:
            self.bind()
        self._start_reader()

    def listen(self) -> None:
        """Bind (if not yet bound) and have the relay read the socket now, where it can.

        The socket file exists from the bind on, and a sender that finds it connects at
        once: from then on something must empty the socket's small queue, or the sender
        drops all it sends while gpuwatch still opens its recording and serves its views
        (a loaded machine can stall that for seconds). The relay holds what it reads
        until :meth:`start` reads its pipe. Without a relay the socket waits for
        :meth:`start`'s thread.
        """
        if self._sock is None:
            self.bind()
        assert self._sock is not None
        if self._relay is None:
            self._relay = relay_process.start(self._sock, _SIZE)

    def _start_reader(self) -> None:
        """Read the relay's pipe, or else the socket itself, on a thread (once)."""
        if self._thread is not None:
            return
        target = self._run if self._relay is None else self._run_relayed
        self._thread = threading.Thread(target=target, name="gpuwatch-receiver", daemon=True)
        self._thread.start()

    def _run_relayed(self) -> None:
        """Datagrams as the relay framed them, until it exits."""
        relay = self._relay
        assert relay is not None
        try:
            whole = relay.read(self._relayed, limit=_SIZE, size=RELAY_PIPE)
            if not whole:
                self.session.note("the annotation relay sent a damaged frame; annotations stop")
            elif not self._stop.is_set():
                self.session.note("the annotation relay stopped; annotations are lost")
        finally:
            if self._stop.is_set():  # stop() left closing the pipe to this thread
                relay.close_frames()

    def _relayed(self, pid: int, data: bytes) -> None:
        if self._counting:  # stopping, out of time: count it for its sender
            self._unrecorded[pid] = self._unrecorded.get(pid, 0) + 1
        else:
            self.handle(data, None if pid < 0 else pid)

    def _run(self) -> None:
        sock = self._sock
        assert sock is not None
        batch = batch_receiver(sock, _SIZE)
        if batch is None:
            self._run_one_by_one(sock)
            return
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(200):  # waits with the interpreter lock released
                continue
            # Everything queued, a batch per call: the socket's queue empties at once, and
            # the lock is given up only when there is nothing left to read.
            while True:
                try:
                    got = batch.receive()
                except OSError:
                    if self._stop.is_set():
                        return
                    break
                for data, sender in got:
                    self.handle(data, sender)
                if len(got) < batch.batch:
                    break

    def _run_one_by_one(self, sock: socket.socket) -> None:
        """Where the system has no ``recvmmsg``: one datagram per call."""
        buf = bytearray(_SIZE)
        view = memoryview(buf)
        while not self._stop.is_set():
            try:
                n, ancillary, flags, _ = sock.recvmsg_into([buf], CMSG_SPACE)
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue
            if flags & socket.MSG_TRUNC:
                n = len(buf)  # longer than any valid datagram: rejected for its size
            self.handle(bytes(view[:n]), sender_pid(ancillary))

    def handle(self, data: bytes, sender: int | None = None) -> None:
        """Validate one datagram and apply it; count it as rejected if it is bad.

        Args:
            data: The datagram.
            sender: The sending process's pid as the kernel reports it (0: not visible
                in this PID namespace); None only where no socket carried the datagram
                (tests), in which case the claimed pid stands.
        """
        try:
            if len(data) > protocol.MAX_DATAGRAM:
                raise protocol.ProtocolError("size")
            if sender is not None and sender <= 0:
                raise protocol.ProtocolError("identity", "sender not in this PID namespace")
            msg = protocol.decode(data, now=time.monotonic_ns())
            if sender is not None and sender != msg.pid:
                msg.container_pid = msg.pid
                msg.pid = sender
        except protocol.ProtocolError as exc:
            self.rejected += 1
            self.session.count_reject(exc.reason, sender or None, exc.seq)
            return
        except Exception:
            self.rejected += 1
            self.session.count_reject("internal")
            return
        try:
            self.session.ingest(msg)
            self.received += 1
        except Exception:
            self.rejected += 1
            self.session.count_reject("internal")

    # ------------------------------------------------------------------ stopping

    def stop(self) -> None:
        """Record what senders have sent, then stop receiving and release the path.

        The socket file goes first, so that senders stop sending (and count what they
        cannot send); then everything on its way (in the kernel's queue, the relay and
        its pipe) is recorded, for at most :data:`~gpuwatch.sources.relay.DRAIN_LIMIT`
        seconds. What is left then is counted, by sender, as lost
        (:meth:`Session.count_lost`), and :attr:`cut_short` says so in one line (also a
        note in the session).
        """
        deadline = time.monotonic() + relay_process.DRAIN_LIMIT
        if self._identity is not None:
            unlink_ours(self.path, self._identity)
            self._identity = None
        if self._relay is not None:
            self._start_reader()  # listening, not started yet: what the relay holds counts
        self._stop.set()
        relayed = self._relay is not None
        if relayed:
            self._stop_relay(deadline)
        elif self._thread is not None:
            self._thread.join(timeout=2)  # it sees _stop within its poll's 0.2 s
        if self._sock is not None:
            # What came after the relay stopped reading (or all of it, read by a thread):
            # the relay already waited for quiet.
            self._drain_socket(deadline, 0.0 if relayed else relay_process.DRAIN_QUIET)
            self._sock.close()
            self._sock = None
        self._count_unrecorded()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _stop_relay(self, deadline: float) -> None:
        """Have the relay drain: the reader thread records what it delivers until
        ``deadline``, then counts the rest by sender until the pipe closes (at most
        :data:`COUNT_LIMIT` more)."""
        relay, self._relay = self._relay, None
        thread = self._thread
        assert relay is not None and thread is not None
        relay.close_lifeline(drain=True)
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            self._counting = True
            thread.join(timeout=COUNT_LIMIT)
        # It delivered all it had (the thread read to the pipe's end), or it is out of time.
        if not relay.reap(0):
            self._relay_killed = True
        thread.join(timeout=2)  # the pipe has closed: it reads to its end
        if not thread.is_alive():
            relay.close_frames()
        # else the reader, still handling what it read, closes it as it returns: closing it
        # under a reader still in its loop would hand the reader a number reused since.

    def _drain_socket(self, deadline: float, quiet: float) -> None:
        """Take what the socket holds until it is quiet for ``quiet`` seconds: recorded
        until ``deadline``, counted after it (for at most :data:`COUNT_LIMIT` more)."""
        sock = self._sock
        assert sock is not None
        sock.setblocking(False)  # no reader thread any more: poll here, never wait in a call
        batch = batch_receiver(sock, _SIZE)
        buf = bytearray(_SIZE)
        last = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= deadline:
                self._counting = True
            if now >= deadline + COUNT_LIMIT:
                return
            if batch is not None:
                try:
                    got = batch.receive()
                except OSError:
                    return
            else:
                got = receive_one(sock, buf)
            if not got:
                wait = quiet - (now - last)
                if wait <= 0:
                    return
                select.select([sock], [], [], min(wait, 0.05))
                continue
            last = now
            for data, sender in got:
                if self._counting:
                    pid = -1 if sender is None else sender
                    self._unrecorded[pid] = self._unrecorded.get(pid, 0) + 1
                else:
                    self.handle(data, sender)

    def _count_unrecorded(self) -> None:
        """What arrived too late to record: lost, for each sender; one line that says so."""
        counts, self._unrecorded = self._unrecorded, {}
        total = sum(counts.values())
        for pid, count in counts.items():
            if pid > 0:
                self.session.count_lost(pid, count)
        self.unrecorded += total
        if self._counting and self.cut_short is None:
            senders = sum(1 for pid in counts if pid > 0)
            self.cut_short = (
                f"stopped recording annotations after {relay_process.DRAIN_LIMIT:.0f} s: "
                f"{total} datagrams from {senders} process{'es' if senders != 1 else ''} "
                "came too late and are counted as lost"
                + (", and the relay's backlog went uncounted" if self._relay_killed else "")
            )
            self.session.note(self.cut_short)
