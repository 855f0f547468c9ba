"""A fork server: visitors' dashboards forked from a process that has already imported them.

A cold ``python -m gpuwatch replay`` spends most of its first seconds importing Textual and
the dashboard; eight visitors arriving at once paid that eight times over. This helper
imports it once (``preload``, named by the command line), then forks one child per visitor.

It is a process of its own, started by the server before any visitor comes: the server
runs threads (aiohttp's executor), and a fork of a threaded process may inherit a lock
held by a thread that the child does not have. The helper runs no thread: it waits on its
sockets with ``selectors`` and reaps its children on ``SIGCHLD`` through a wakeup pipe.

The wire, on the Unix socket the server passes as file descriptor ``FD``:

- the server sends one request per visitor: a JSON line (``{"argv": [...], "env": {...}}``)
  with four descriptors attached: the child's stdin, stdout and stderr, and the visitor's
  own control socket;
- on that control socket the helper writes ``pid N`` once the child is forked, then
  ``exit N`` when it has ended (and reaped), and closes it.

When the server's socket closes (the server stopped or died), the helper ends every
child's process group (SIGTERM, then SIGKILL after a grace) and exits: no process outlives
the server.

Run as ``python -m gpuwatch.serve.forkserver FD PRELOAD ENTRY [ARG...]`` where ``PRELOAD``
and ``ENTRY`` are ``module:function`` names: ``PRELOAD(*ARGS)`` is called once,
``ENTRY(argv)`` in each child, whose return value is the child's exit status.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

REQUEST_MAX = 1 << 16
"""Largest request line (argv and a few environment variables)."""
FDS = 4
"""Descriptors attached to each request: stdin, stdout, stderr, the control socket."""
GRACE = 3.0
"""Seconds children have to end after SIGTERM when the server is gone."""


def send_request(
    channel: socket.socket, argv: list[str], env: dict[str, str], fds: list[int]
) -> None:
    """Ask the helper behind ``channel`` for one child (the server's side of the wire)."""
    line = json.dumps({"argv": argv, "env": env}).encode() + b"\n"
    if len(line) > REQUEST_MAX:
        raise ValueError("request too long")
    socket.send_fds(channel, [line], fds)


def _named(name: str) -> Callable[..., Any]:
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


class Helper:
    """The helper's loop: requests in, children out, exits reported."""

    def __init__(self, channel: socket.socket, entry: Callable[[list[str]], int]) -> None:
        self.channel = channel
        self.entry = entry
        self.children: dict[int, socket.socket] = {}
        self.buffer = bytearray()
        self.pending_fds: list[int] = []
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the pipe
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the server, not us
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.channel, selectors.EVENT_READ)
        self.sel.register(self.wake_r, selectors.EVENT_READ)

    def run(self) -> None:
        while True:
            for key, _ in self.sel.select(1.0):
                if key.fileobj is self.channel and not self._read_requests():
                    self._end_children()
                    return
                if key.fd == self.wake_r:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self.wake_r, 512):
                            pass
            self._reap()

    def _read_requests(self) -> bool:
        """Read what the server sent; False once its socket has closed."""
        try:
            data, fds, _, _ = socket.recv_fds(self.channel, REQUEST_MAX, 64)
        except InterruptedError:
            return True
        except OSError:
            return False
        self.pending_fds += fds
        if not data:
            return False
        self.buffer += data
        while b"\n" in self.buffer:
            line, _, rest = bytes(self.buffer).partition(b"\n")
            self.buffer = bytearray(rest)
            fds, self.pending_fds = self.pending_fds[:FDS], self.pending_fds[FDS:]
            self._start(line, fds)
        return len(self.buffer) <= REQUEST_MAX  # longer: not the server speaking

    def _start(self, line: bytes, fds: list[int]) -> None:
        try:
            request = json.loads(line)
            argv = [str(a) for a in request["argv"]]
            env = {str(k): str(v) for k, v in request["env"].items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            request = None
        if request is None or len(fds) != FDS:
            for fd in fds:
                os.close(fd)
            return
        control = socket.socket(fileno=fds[3])
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            self._child(argv, env, fds)
        for fd in fds[:3]:
            os.close(fd)
        self.children[pid] = control
        with contextlib.suppress(OSError):
            control.sendall(f"pid {pid}\n".encode())

    def _child(self, argv: list[str], env: dict[str, str], fds: list[int]) -> None:
        code = 1
        try:
            os.setsid()  # its own group: the server ends it and all it starts at once
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for target, fd in enumerate(fds[:3]):
                os.dup2(fd, target)
            _close_from(3)  # the helper's sockets, other visitors' controls
            os.environ.update(env)
            code = int(self.entry(argv) or 0)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # a child never returns into the helper's loop
            with contextlib.suppress(Exception):
                import traceback

                traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            control = self.children.pop(pid, None)
            if control is not None:
                with contextlib.suppress(OSError):
                    control.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                control.close()

    def _end_children(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in list(self.children):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, sig)
            deadline = time.monotonic() + GRACE
            while self.children and time.monotonic() < deadline:
                self._reap()
                time.sleep(0.05)
        self._reap()


def _close_from(low: int) -> None:
    """Close every descriptor from ``low`` up (those open, not the whole range: the limit
    may be a million)."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        os.closerange(low, 65536)
        return
    for fd in fds:
        if fd >= low:
            with contextlib.suppress(OSError):
                os.close(fd)


def main(args: list[str]) -> int:
    """``FD PRELOAD ENTRY [ARG...]``: serve fork requests on socket ``FD`` until it closes."""
    fd, preload, entry = int(args[0]), args[1], args[2]
    channel = socket.socket(fileno=fd)
    _named(preload)(*args[3:])
    if threading.active_count() != 1:
        # Forking now could copy a lock held by another thread: refuse, the server falls
        # back to starting each visitor's process itself.
        print("gpuwatch serve: the fork server runs threads after preloading", file=sys.stderr)
        return 1
    channel.sendall(b"ready\n")
    Helper(channel, _named(entry)).run()
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(sys.argv[1:]))
