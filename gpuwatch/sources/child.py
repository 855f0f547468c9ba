"""gpuwatch's own child processes: how one is started, stopped, reaped, and how it speaks.

A child (the annotation relay, the GPU sampler) writes *frames* on its stdout, a pipe only
gpuwatch reads; its stdin is its *lifeline*, a pipe whose other end only gpuwatch holds.

- A frame is :data:`FRAME` (payload length, ``uint32`` little-endian; a tag, ``int32``
  little-endian, whose meaning is the child's: the relay's sender pid, the sampler's 0)
  followed by the payload. The first frame is :data:`READY` (length 0, tag 0): the child
  has started and does what it is for. A frame longer than its reader's limit is not one a
  child of ours wrote: the reader stops there and says so.
- The lifeline carries at most one byte, :data:`DRAIN`: deliver what is held, then exit.
  Closed without it (gpuwatch stopped without waiting, or died), the child exits at once.
- gpuwatch reaps every child it starts: it waits for the exit, then kills what is late.

The child side (:func:`frames_out`, :func:`lifeline_said`) uses the standard library
only, and so does this module: a child started ``bare`` runs without ``site`` and without
the ``gpuwatch`` package's ``__init__`` (which loads the training-side client), so that
the relay starts as fast as an interpreter can.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence

FRAME = struct.Struct("<Ii")
"""A frame's header: the payload's length, and the child's tag for it."""

READY = FRAME.pack(0, 0)
"""A child's first frame: it has started and does what it is for."""

DRAIN = b"D"
"""The one byte a lifeline carries: deliver what you hold, then exit."""

LIFELINE_FD = 0
"""The child's end of its lifeline (its stdin)."""

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../gpuwatch

# argv[1] says what to run: the module, and either the parent's sys.path (the whole package,
# its imports included) or, for a bare child, the package directory alone. A bare child gets
# the packages as empty shells: their modules import each other by relative name, and no
# package's __init__ runs.
_BOOT = (
    "import sys, json, types, importlib\n"
    "spec = json.loads(sys.argv[1])\n"
    "if spec['bare']:\n"
    "    parts = spec['module'].split('.')[:-1]\n"
    "    for i in range(len(parts)):\n"
    "        shell = types.ModuleType('.'.join(parts[: i + 1]))\n"
    "        shell.__path__ = [spec['package'] + ''.join('/' + p for p in parts[1 : i + 1])]\n"
    "        sys.modules[shell.__name__] = shell\n"
    "else:\n"
    "    sys.path[:] = spec['path']\n"
    "sys.exit(importlib.import_module(spec['module']).main(sys.argv[2:]))\n"
)


class Child:
    """A child process of gpuwatch, the pipe of its frames and its lifeline.

    Args:
        proc: The process.
        frames: The read end of the pipe it writes frames to.
        lifeline: The write end of its lifeline.
    """

    def __init__(self, proc: subprocess.Popen[bytes], frames: int, lifeline: int) -> None:
        self.proc = proc
        self.frames: int | None = frames
        self._lifeline: int | None = lifeline
        self._closing = threading.Lock()  # the reader and the stopper may both close frames

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.proc.pid

    @classmethod
    def start(
        cls,
        module: str,
        args: Sequence[str] = (),
        *,
        bare: bool = False,
        pass_fds: Sequence[int] = (),
        pipe_size: int | None = None,
    ) -> Child | None:
        """Start ``python -m``-like ``module``'s ``main(args)`` in a child; None if it cannot.

        The child is isolated (``-I``: nothing from its environment or the user's site
        directory), out of the terminal's process group (Ctrl-C goes to gpuwatch, which
        stops its children once it has finished with them), and its stderr goes nowhere.

        Args:
            module: A module of this package, e.g. ``gpuwatch.sources.relay``.
            args: Its ``main``'s arguments.
            bare: Without ``site`` and without running the package's ``__init__``:
                ``module`` and what it imports must need the standard library only.
                Otherwise the child imports from this process's ``sys.path``.
            pass_fds: Descriptors the child inherits (a socket it reads).
            pipe_size: Bytes the frame pipe holds, where the system lets us choose.
        """
        spec = {
            "module": module,
            "bare": bare,
            "package": _PACKAGE,
            "path": [] if bare else sys.path,
        }
        flags = ["-I", "-S"] if bare else ["-I"]
        life_r, life_w = os.pipe()
        data_r, data_w = os.pipe()
        if pipe_size is not None:
            with contextlib.suppress(OSError, AttributeError):
                fcntl.fcntl(data_r, fcntl.F_SETPIPE_SZ, pipe_size)
        try:
            proc = subprocess.Popen(
                [sys.executable, *flags, "-c", _BOOT, json.dumps(spec), *args],
                stdin=life_r,
                stdout=data_w,
                stderr=subprocess.DEVNULL,
                pass_fds=tuple(pass_fds),
                start_new_session=True,
            )
        except OSError:
            for fd in (life_r, life_w, data_r, data_w):
                os.close(fd)
            return None
        os.close(life_r)
        os.close(data_w)
        return cls(proc, data_r, life_w)

    def wait_ready(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for :data:`READY`; False: late, dead or not ours."""
        fd = self.frames
        if fd is None or not select.select([fd], [], [], timeout)[0]:
            return False
        try:
            return os.read(fd, len(READY)) == READY
        except OSError:
            return False

    def read(self, on_frame: Callable[[int, bytes], None], limit: int, size: int) -> bool:
        """Hand every frame to ``on_frame(tag, payload)`` until the pipe ends.

        Frames are read many at a time into one buffer, made once: a fresh buffer per read
        (and joining what was left over) grows the reading thread's malloc arena and keeps
        it grown. Only a frame longer than the buffer makes it larger, for that frame.

        Args:
            on_frame: Called in order, on this thread.
            limit: The longest payload a frame of this child has.
            size: Bytes read at most at once (about what the pipe holds).

        Returns:
            True when the pipe ended (the child exited or closed it), False when a frame
            longer than ``limit`` came: not one our child wrote, and reading stops there.
        """
        fd = self.frames
        assert fd is not None
        header = FRAME.size
        buf = bytearray(size)
        view = memoryview(buf)
        have = 0
        while True:
            try:
                got = os.readv(fd, [view[have:]])
            except OSError:
                return True
            if not got:
                return True
            have += got
            at = 0
            need = 0  # bytes of the frame still coming, its header included
            while have - at >= header:
                length, tag = FRAME.unpack_from(buf, at)
                if length > limit:
                    return False
                end = at + header + length
                if end > have:
                    need = header + length
                    break
                on_frame(tag, bytes(view[at + header : end]))
                at = end
            if at:
                buf[: have - at] = bytes(view[at:have])  # the part of a frame still coming
                have -= at
            if need > len(buf) or (not have and len(buf) > size):  # grow for it, or back
                grown = bytearray(max(need, size))
                grown[:have] = view[:have]
                view.release()
                buf, view = grown, memoryview(grown)

    def close_lifeline(self, drain: bool) -> None:
        """Tell the child to stop: after delivering what it holds (``drain``), or at once."""
        fd, self._lifeline = self._lifeline, None
        if fd is None:
            return
        if drain:
            with contextlib.suppress(OSError):  # it died already: closing says the same
                os.write(fd, DRAIN)
        os.close(fd)

    def reap(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the child to exit, then kill it.

        Returns:
            True when it exited on its own, False when it had to be killed.
        """
        self.close_lifeline(drain=False)
        try:
            self.proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return False

    def close_frames(self) -> None:
        """Close the frame pipe (once no thread reads it any more)."""
        with self._closing:
            fd, self.frames = self.frames, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


# --------------------------------------------------------------------------- the child side


def frames_out() -> int:
    """In the child: the descriptor to write frames to, ours alone.

    Stdout is pointed at ``/dev/null`` afterwards, so that a stray ``print`` of any module
    cannot corrupt the frames.
    """
    fd = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    return fd


def frame(tag: int, payload: bytes) -> bytes:
    """``payload`` framed with ``tag``."""
    return FRAME.pack(len(payload), tag) + payload


def lifeline_said(fd: int = LIFELINE_FD) -> bool:
    """In the child: wait for the lifeline; True when gpuwatch said :data:`DRAIN`, False when
    it closed it without a word (stopped without waiting, or died)."""
    try:
        said = os.read(fd, 1)
    except OSError:
        return False
    return said == DRAIN
