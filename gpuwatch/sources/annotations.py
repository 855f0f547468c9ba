"""The annotation receiver: a Unix datagram socket that instrumented scripts send to.

It owns the socket path for the lifetime of the gpuwatch process (an ``flock`` on a lock
file beside it), so a second gpuwatch on the same path is refused while a socket file left
by a crashed one is replaced. Every datagram is validated; anything malformed is counted in
the session as a reject, never raised.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import threading

from .. import protocol
from ..session import Session


class SocketInUse(RuntimeError):
    """Another live gpuwatch already listens on the socket path."""


class SocketDirUnsafe(RuntimeError):
    """The socket's directory belongs to someone else or is open to others."""


class AnnotationReceiver:
    """Receives protocol messages and applies them to a session on its own thread.

    Args:
        session: Where validated messages go (:meth:`Session.ingest`).
        path: Socket path; ``None`` means :func:`gpuwatch.protocol.socket_path`.
    """

    def __init__(self, session: Session, path: str | None = None) -> None:
        self.session = session
        self.path = path or protocol.socket_path()
        self.received = 0
        self.rejected = 0
        self._sock: socket.socket | None = None
        self._lock_fd: int | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ------------------------------------------------------------------ binding

    def bind(self) -> None:
        """Take the path: lock, replace a stale socket, bind with 0600 permissions.

        Raises:
            SocketInUse: Another live gpuwatch holds the path.
            SocketDirUnsafe: The directory is not private to this user.
        """
        directory = os.path.dirname(self.path)
        self._prepare_dir(directory)
        lock_path = self.path + ".lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise SocketInUse(f"another gpuwatch (pid {owner}) is already listening on {self.path}")
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd
        # We hold the lock, so a socket file here belongs to a gpuwatch that died.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        old_umask = os.umask(0o177)  # created 0600: only this user may send
        try:
            sock.bind(self.path)
        except OSError:
            sock.close()
            self._release_lock()
            raise
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        sock.settimeout(0.2)
        self._sock = sock

    def _prepare_dir(self, directory: str) -> None:
        default = os.environ.get(protocol.SOCKET_ENV) in (None, "")
        os.makedirs(directory, mode=0o700, exist_ok=True)
        st = os.stat(directory)
        if st.st_uid != os.getuid():
            raise SocketDirUnsafe(f"socket directory {directory} belongs to another user")
        if default and (st.st_mode & 0o077):
            # Our own default directory: make it private again.
            os.chmod(directory, 0o700)

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None

    # ------------------------------------------------------------------ running

    def start(self) -> None:
        """Bind (if not yet bound) and start the receiving thread."""
        if self._sock is None:
            self.bind()
        self._thread = threading.Thread(target=self._run, name="gpuwatch-receiver", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sock = self._sock
        assert sock is not None
        buf = bytearray(protocol.MAX_DATAGRAM + 1)
        view = memoryview(buf)
        while not self._stop.is_set():
            try:
                n = sock.recv_into(buf)
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue
            self.handle(bytes(view[:n]))

    def handle(self, data: bytes) -> None:
        """Validate one datagram and apply it; count it as rejected if it is bad."""
        try:
            if len(data) > protocol.MAX_DATAGRAM:
                raise protocol.ProtocolError("size")
            msg = protocol.decode(data)
        except protocol.ProtocolError as exc:
            self.rejected += 1
            self.session.count_reject(exc.reason)
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
        """Stop receiving, remove the socket file and release the path."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        self._release_lock()
