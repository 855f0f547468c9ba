"""The annotation socket's path, taken safely: a private directory, only stale sockets
replaced, the socket bound 0600 and removed only while it is still ours.

Nothing but a stale socket is ever removed, and no directory gpuwatch did not create is
ever chmod'ed. Each refusal is a :class:`SocketError` whose text is one line that says
what to do.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat

RECEIVE_BUFFER = 4 * 1024 * 1024
"""Bytes asked for the socket's receive buffer (the kernel may give less)."""


class SocketError(RuntimeError):
    """The socket path cannot be used; ``str()`` is one line that says what to do."""


class SocketInUse(SocketError):
    """Another live gpuwatch (or another program) already listens on the socket path."""


class SocketDirUnsafe(SocketError):
    """The socket's directory is a link, belongs to someone else or is open to others."""


class SocketPathTaken(SocketError):
    """Something that is not a stale socket sits at the socket path (or its lock file)."""


Identity = tuple[int, int]
"""A file's ``(st_dev, st_ino)``: the socket file we bound, not one that replaced it."""


def prepare_dir(directory: str, ours: bool) -> None:
    """Make sure the socket's directory exists and belongs to this user.

    Args:
        directory: Where the socket goes.
        ours: gpuwatch's default directory (created 0700, refused unless private); else
            the user's own choice, created if missing but never changed.

    Raises:
        SocketDirUnsafe: It cannot be created or is not this user's (or, ``ours``, not
            private).
    """
    if ours:
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


def refuse_non_socket(path: str) -> None:
    """Refuse a path held by anything but a socket: gpuwatch replaces only stale sockets.

    Raises:
        SocketPathTaken: Something else is there.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketPathTaken(
            f"{path} exists and is not a socket; gpuwatch will not replace it: "
            "choose another --socket path"
        )


def remove_stale_socket(path: str) -> None:
    """Remove a socket at ``path`` that nobody listens on; refuse one that is alive.

    Call it holding the path's lock: a socket file there then belongs to a gpuwatch that
    died, unless some other program listens on it.

    Raises:
        SocketInUse: Something listens on it.
        SocketPathTaken: Something that is not a socket appeared there.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):  # appeared since the first look
        refuse_non_socket(path)
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


def bind_private(path: str) -> tuple[socket.socket, Identity]:
    """A datagram socket bound at ``path``, 0600 (only this user may send), asking for each
    sender's credentials; and the identity of its file.

    Raises:
        OSError: It cannot be created or bound.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    old_umask = os.umask(0o177)  # created 0600 from the start: no moment open to others
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        sock.bind(path)
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    st = os.lstat(path)
    return sock, (st.st_dev, st.st_ino)


def unlink_ours(path: str, identity: Identity) -> None:
    """Remove the socket file at ``path`` only if it is the one we bound, never one that
    replaced it since."""
    with contextlib.suppress(OSError):
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) == identity:
            os.unlink(path)
