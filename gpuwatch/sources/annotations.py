"""The annotation receiver: a Unix datagram socket that instrumented scripts send to.

It owns the socket path for the lifetime of the gpuwatch process (an ``flock`` on a lock
file beside it), so a second gpuwatch on the same path is refused while a socket file left
by a crashed one is replaced. Every datagram is validated; anything malformed is counted in
the session as a reject, never raised.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import socket
import stat
import subprocess
import sys
import threading
import time

from .. import protocol
from ..session import Session
from . import _batch
from ._batch import CMSG_SPACE, CREDS, batch_receiver


class SocketError(RuntimeError):
    """The socket path cannot be used; ``str()`` is one line that says what to do."""


class SocketInUse(SocketError):
    """Another live gpuwatch (or another program) already listens on the socket path."""


class SocketDirUnsafe(SocketError):
    """The socket's directory is a link, belongs to someone else or is open to others."""


class SocketPathTaken(SocketError):
    """Something that is not a stale socket sits at the socket path (or its lock file)."""


RELAY_START = 10.0
"""Seconds the relay may take to start reading (a loaded machine); else a thread reads."""

COUNT_LIMIT = 2.0
"""Seconds, after :data:`~gpuwatch.sources._batch.DRAIN_LIMIT`, to count by sender what
could not be recorded in time (reading only the relay's frame headers)."""

RELAY_PIPE = 1 << 20
"""Bytes the relay's pipe holds (Linux's default most for an unprivileged process):
about a quarter second of a 20k events/s burst, while the dashboard is busy."""


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
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of our socket file
        self._lock_fd: int | None = None
        self._relay: subprocess.Popen | None = None
        self._relay_in: int | None = None  # the pipe the relay writes datagrams to
        self._relay_lock = threading.Lock()  # who closes _relay_in
        self._lifeline: int | None = None  # closed: the relay exits
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ------------------------------------------------------------------ binding

    def bind(self) -> None:
        """Take the path: lock, replace a stale socket, bind with 0600 permissions.

        Nothing but a stale socket is ever removed, and no directory gpuwatch did not
        create is ever chmod'ed.

        Raises:
            SocketInUse: Another live gpuwatch, or another program, listens on the path.
            SocketDirUnsafe: The directory is not private to this user.
            SocketPathTaken: A file that is not a socket is at the path or its lock file.
            OSError: The socket cannot be created or bound.
        """
        directory = os.path.dirname(self.path)
        self._prepare_dir(directory)
        _refuse_non_socket(self.path)
        self._lock_fd = _take_lock(self.path + ".lock", self.path)
        try:
            # We hold the lock: a socket file here belongs to a gpuwatch that died, unless
            # some other program listens on it.
            _remove_stale_socket(self.path)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        except BaseException:
            self._release_lock()
            raise
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        old_umask = os.umask(0o177)  # created 0600: only this user may send
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            sock.bind(self.path)
        except OSError:
            sock.close()
            self._release_lock()
            raise
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        st = os.lstat(self.path)
        self._identity = (st.st_dev, st.st_ino)
        sock.settimeout(0.2)
        self._sock = sock

    def _prepare_dir(self, directory: str) -> None:
        if self.default_path:
            _private_dir(directory)
            return
        if not os.path.isdir(directory):
            try:
                os.makedirs(directory, mode=0o700)
            except FileExistsError:
                pass
            except OSError as exc:
                raise SocketDirUnsafe(
                    f"cannot create the socket directory {directory}: {exc.strerror or exc}"
                )
        st = os.stat(directory)
        if st.st_uid != os.getuid():
            raise SocketDirUnsafe(
                f"socket directory {directory} belongs to another user: "
                "choose a --socket path in a directory of your own"
            )

    def announce(self, recording: str | None) -> None:
        """Name the recording this gpuwatch writes in its lock file, for a second one to say.

        The lock file is gpuwatch's own (checked when it was taken): no other file beside
        the socket is ever made.
        """
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                _write_lock(self._lock_fd, os.getpid(), recording)

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None

    # ------------------------------------------------------------------ running

    def start(self, relay: bool = True) -> None:
        """Bind (if not yet bound) and start receiving.

        Args:
            relay: Read the socket in a relay process of its own (see ``_batch.relay``)
                where the system allows: a busy dashboard can then never leave the
                socket's small queue full. Otherwise (or if the relay cannot start) a
                thread of this process reads it.
        """
        if self._sock is None:
            self.bind()
        target = self._run_relayed if relay and self._start_relay() else self._run
        self._thread = threading.Thread(target=target, name="gpuwatch-receiver", daemon=True)
        self._thread.start()

    def _start_relay(self) -> bool:
        """Start the relay process; False (nothing started) where it cannot run."""
        sock = self._sock
        assert sock is not None
        if not _batch.available():
            return False
        data_r, data_w = os.pipe()
        life_r, life_w = os.pipe()
        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(data_r, fcntl.F_SETPIPE_SZ, RELAY_PIPE)  # a burst's worth
        fds = (sock.fileno(), data_w, life_r)
        try:
            self._relay = subprocess.Popen(
                [sys.executable, "-I", "-S", _batch.__file__, *map(str, fds),
                 str(protocol.MAX_DATAGRAM + 1)],
                pass_fds=fds,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                # Not in the terminal's process group: Ctrl-C (to gpuwatch record, which
                # passes it to the job) must not stop the receiving.
                start_new_session=True,
            )  # fmt: skip
        except OSError:
            for fd in (data_r, data_w, life_r, life_w):
                os.close(fd)
            return False
        os.close(data_w)
        os.close(life_r)
        self._relay_in, self._lifeline = data_r, life_w
        # Started means reading: a sender greeted now must not wait on an empty chair.
        ready = select.select([data_r], [], [], RELAY_START)[0]
        if not ready or os.read(data_r, len(_batch.READY)) != _batch.READY:
            self._stop_relay()
            return False
        return True

    def _stop_relay(self, deadline: float | None = None) -> None:
        """Stop the relay; with a ``deadline``, after recording everything it delivers.

        The relay is asked to drain (see ``_batch.relay``): the reader thread records what
        it delivers until ``deadline``, then counts the rest by sender until the pipe
        closes (at most :data:`COUNT_LIMIT` more). Without a deadline (it failed to start)
        it is told nothing and exits at once.
        """
        if self._lifeline is not None:
            if deadline is not None:
                with contextlib.suppress(OSError):
                    os.write(self._lifeline, _batch.DRAIN)
            os.close(self._lifeline)  # the relay sees it close, and exits
            self._lifeline = None
        thread = self._thread if deadline is not None else None
        if thread is not None:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                self._counting = True
                thread.join(timeout=COUNT_LIMIT)
        if self._relay is not None:
            try:
                # Delivered all it had (the thread read to the pipe's end), or out of time.
                self._relay.wait(timeout=0 if thread is not None else 2)
            except subprocess.TimeoutExpired:
                self._relay.kill()
                self._relay.wait()
                if thread is not None:
                    self._relay_killed = True
            self._relay = None
        if thread is not None:
            thread.join(timeout=2)  # the pipe has closed: it reads to its end
        if thread is None or not thread.is_alive():
            self._close_relay_in()
        # else the reader, still handling what it read, closes it as it returns

    def _close_relay_in(self) -> None:
        """Close the relay's pipe once (the stopping thread or the reader, whichever is
        last: closing it under a reader still in its loop would hand it a dead number)."""
        with self._relay_lock:
            fd, self._relay_in = self._relay_in, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _run_relayed(self) -> None:
        """Datagrams as the relay framed them on the pipe, read many at a time.

        Read into one buffer made once: a fresh megabyte per read (and the concatenation
        of what was left over) grew this thread's malloc arena by about 18 MB at 10k
        phases/s, and kept it.
        """
        try:
            self._read_relayed()
        finally:
            if self._stop.is_set():
                self._close_relay_in()

    def _read_relayed(self) -> None:
        fd = self._relay_in
        assert fd is not None
        header = _batch.FRAME.size
        buf = bytearray(2 * RELAY_PIPE)  # a pipe's worth on top of a frame not yet whole
        view = memoryview(buf)
        have = 0
        while True:
            try:
                got = os.readv(fd, [view[have:]])
            except OSError:
                return
            if not got:  # the relay exited (stopped, or failed): nothing more comes
                if not self._stop.is_set():
                    self.session.note("the annotation relay stopped; annotations are lost")
                return
            have += got
            at = 0
            while have - at >= header:
                length, pid = _batch.FRAME.unpack_from(buf, at)
                if have - at - header < length:
                    break
                if self._counting:  # stopping, out of time: count it for its sender
                    self._unrecorded[pid] = self._unrecorded.get(pid, 0) + 1
                    at += header + length
                    continue
                data = bytes(view[at + header : at + header + length])
                at += header + length
                self.handle(data, None if pid < 0 else pid)
            if at == 0 and have == len(buf):  # a frame longer than any datagram: not ours
                self.session.note("the annotation relay sent a damaged frame; annotations stop")
                return
            if at:
                buf[: have - at] = bytes(view[at:have])  # the part of a frame still coming
                have -= at

    def _run(self) -> None:
        sock = self._sock
        assert sock is not None
        batch = batch_receiver(sock, protocol.MAX_DATAGRAM + 1)
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
        buf = bytearray(protocol.MAX_DATAGRAM + 1)
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
            self.handle(bytes(view[:n]), _sender_pid(ancillary))

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

    def stop(self) -> None:
        """Record what senders have sent, then stop receiving and release the path.

        The socket file goes first, so that senders stop sending (and count what they
        cannot send); then everything on its way (in the kernel's queue, the relay and
        its pipe) is recorded, for at most ``_batch.DRAIN_LIMIT`` seconds. What is left
        then is counted, by sender, as lost (:meth:`Session.count_lost`), and
        :attr:`cut_short` says so in one line (also a note in the session).
        """
        deadline = time.monotonic() + _batch.DRAIN_LIMIT
        self._unlink()
        self._stop.set()
        relayed = self._relay is not None
        if relayed:
            self._stop_relay(deadline)
        elif self._thread is not None:
            self._thread.join(timeout=2)  # it sees _stop within its poll's 0.2 s
        if self._sock is not None:
            # What came after the relay stopped reading (or all of it, read by a thread):
            # the relay already waited for quiet.
            self._drain_socket(deadline, 0.0 if relayed else _batch.DRAIN_QUIET)
            self._sock.close()
            self._sock = None
        self._count_unrecorded()
        self._release_lock()

    def _unlink(self) -> None:
        """Remove the socket file, only the one we bound: never one that replaced it since."""
        if self._identity is None:
            return
        with contextlib.suppress(OSError):
            st = os.lstat(self.path)
            if (st.st_dev, st.st_ino) == self._identity:
                os.unlink(self.path)
        self._identity = None

    def _drain_socket(self, deadline: float, quiet: float) -> None:
        """Take what the socket holds until it is quiet for ``quiet`` seconds: recorded
        until ``deadline``, counted after it (for at most :data:`COUNT_LIMIT` more)."""
        sock = self._sock
        assert sock is not None
        sock.setblocking(False)  # no reader thread any more: poll here, never wait in a call
        batch = batch_receiver(sock, protocol.MAX_DATAGRAM + 1)
        buf = bytearray(protocol.MAX_DATAGRAM + 1)
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
                got = _receive_one(sock, buf)
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
                f"stopped recording annotations after {_batch.DRAIN_LIMIT:.0f} s: "
                f"{total} datagrams from {senders} process{'es' if senders != 1 else ''} "
                "came too late and are counted as lost"
                + (", and the relay's backlog went uncounted" if self._relay_killed else "")
            )
            self.session.note(self.cut_short)


def _receive_one(sock: socket.socket, buf: bytearray) -> list[tuple[bytes, int | None]]:
    """One queued datagram and its sender, without waiting; [] when none is queued."""
    try:
        n, ancillary, flags, _ = sock.recvmsg_into([buf], CMSG_SPACE, socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError, TimeoutError):
        return []
    except OSError:
        return []
    if flags & socket.MSG_TRUNC:
        n = len(buf)  # longer than any valid datagram: rejected for its size
    return [(bytes(buf[:n]), _sender_pid(ancillary))]


# --------------------------------------------------------------------------- the path


def _sender_pid(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """The pid in a datagram's ``SCM_CREDENTIALS``, or None when none came with it."""
    for level, kind, data in ancillary:
        ours = level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS
        if ours and len(data) >= CREDS.size:
            return CREDS.unpack_from(data)[0]
    return None


def _private_dir(directory: str) -> None:
    """Create gpuwatch's default socket directory, or accept it only if it is private.

    ``mkdir`` does not follow a link at the path and ``lstat`` does not either, so a link
    planted there (to another user's home, or to a shared 1777 directory) is refused, not
    followed; and only a directory gpuwatch has just created is ever chmod'ed.
    """
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise SocketDirUnsafe(
            f"cannot create the socket directory {directory}: {exc.strerror or exc}"
        )
    else:
        os.chmod(directory, 0o700)  # ours, just made: whatever the umask left
        return
    st = os.lstat(directory)
    what = None
    if stat.S_ISLNK(st.st_mode):
        what = "is a symbolic link"
    elif not stat.S_ISDIR(st.st_mode):
        what = "is not a directory"
    elif st.st_uid != os.getuid():
        what = f"belongs to another user (uid {st.st_uid})"
    elif stat.S_IMODE(st.st_mode) & 0o077:
        what = f"is open to other users (mode {stat.S_IMODE(st.st_mode):04o}, not 0700)"
    if what is not None:
        raise SocketDirUnsafe(
            f"socket directory {directory} {what}: remove it (gpuwatch creates it 0700) "
            "or choose another path with --socket"
        )


def _refuse_non_socket(path: str) -> None:
    """Refuse a path held by anything but a socket: gpuwatch replaces only stale sockets."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketPathTaken(
            f"{path} exists and is not a socket; gpuwatch will not replace it: "
            "choose another --socket path"
        )


def _take_lock(lock_path: str, path: str) -> int:
    """Open and ``flock`` the lock file beside the socket; returns its descriptor.

    Raises:
        SocketInUse: Another gpuwatch holds it.
        SocketPathTaken: The lock file's name is taken by something that is not one.
    """
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SocketPathTaken(f"{lock_path} is a symbolic link; gpuwatch will not follow it")
        raise SocketPathTaken(f"cannot open the lock file {lock_path}: {exc.strerror or exc}")
    try:
        st = os.fstat(fd)
        owner, _ = _lock_content(os.pread(fd, LOCK_MAX, 0))
        ours = st.st_size == 0 or owner is not None  # just made, or our pid in it
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or not ours:
            raise SocketPathTaken(
                f"{lock_path} exists and is not a gpuwatch lock file; gpuwatch will not "
                "touch it: choose another --socket path"
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SocketInUse(f"another gpuwatch (pid {owner}) is already listening on {path}")
        _write_lock(fd, os.getpid(), None)
    except BaseException:
        os.close(fd)
        raise
    return fd


LOCK_MAX = 8192
"""Most bytes a lock file holds: a pid line and a recording path line."""


def _lock_content(data: bytes) -> tuple[int | None, str | None]:
    """(pid, recording) in a lock file; pid None when it is not one gpuwatch wrote."""
    lines = data.decode("utf-8", "replace").split("\n")
    first = lines[0].strip()
    if not first.isdigit() or len(data) >= LOCK_MAX:
        return None, None
    recording = lines[1].strip() if len(lines) > 1 else ""
    return int(first), recording or None


def _write_lock(fd: int, pid: int, recording: str | None) -> None:
    text = f"{pid}\n{recording}\n" if recording else f"{pid}\n"
    data = text.encode("utf-8", "surrogateescape")[: LOCK_MAX - 1]
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def lock_owner(path: str) -> tuple[int | None, str | None]:
    """Who holds the socket at ``path``: the gpuwatch's pid and the recording it writes.

    Read from the lock file beside the socket, which only the user's own gpuwatch writes;
    (None, None) when there is none or it is not one.
    """
    try:
        fd = os.open(path + ".lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None, None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            return None, None
        return _lock_content(os.pread(fd, LOCK_MAX, 0))
    finally:
        os.close(fd)


def _remove_stale_socket(path: str) -> None:
    """Remove a socket at ``path`` that nobody listens on; refuse one that is alive."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):  # appeared since the first look
        _refuse_non_socket(path)
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        alive = False  # bound by nobody: left by a gpuwatch that died
    except FileNotFoundError:
        return
    except OSError:
        alive = True  # e.g. a stream socket with a listener (EPROTOTYPE)
    else:
        alive = True
    finally:
        probe.close()
    if alive:
        raise SocketInUse(f"another program listens on {path}; choose another --socket path")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
