"""The server's side of the fork server (:mod:`.forkserver`): starting it, asking it for
visitors' processes, and a process object the visitor drives as it would a subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Mapping

from .forkserver import send_request

READY_WAIT = 120.0
"""Seconds the helper has to import the dashboard (a loaded machine is slow)."""
STREAM_LIMIT = 1 << 16


class ForkError(Exception):
    """The fork server is not there (not started, not ready, or gone)."""


class Forked:
    """A visitor's process forked by the helper: the parts of asyncio's ``Process`` a
    :class:`~.visitor.Visitor` uses (pid, returncode, the three pipes, ``wait``)."""

    def __init__(
        self,
        pid: int,
        control: asyncio.StreamReader,
        control_writer: asyncio.StreamWriter,
        stdin: asyncio.StreamWriter,
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
    ) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self._control, self._control_writer = control, control_writer
        self._waited: asyncio.Task[int] = asyncio.ensure_future(self._wait_exit())

    async def _wait_exit(self) -> int:
        line = await self._control.readline()
        code = -1  # the helper went away without saying: the child was ended with it
        if line.startswith(b"exit "):
            with contextlib.suppress(ValueError):
                code = int(line[5:])
        self.returncode = code
        self._control_writer.close()
        with contextlib.suppress(Exception):
            self.stdin.close()
        return code

    async def wait(self) -> int:
        return await asyncio.shield(self._waited)


class ForkServer:
    """The helper process and the socket to it.

    Args:
        preload: ``module:function`` the helper calls once (imports the dashboard).
        entry: ``module:function`` each child calls with its argv (the CLI's main).
        env: The helper's environment (and so its children's).
        args: What ``preload`` is called with (a recording to draw once, headless).
    """

    def __init__(
        self, preload: str, entry: str, env: Mapping[str, str], args: tuple[str, ...] = ()
    ) -> None:
        self.preload, self.entry, self.env, self.args = preload, entry, dict(env), args
        self.proc: subprocess.Popen[bytes] | None = None
        self.channel: socket.socket | None = None
        self._ready: asyncio.Task[bool] | None = None

    def start(self) -> None:
        """Start the helper (it imports in the background: :meth:`fork` waits for it)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = [sys.executable, "-m", "gpuwatch.serve.forkserver", str(theirs.fileno())]
        try:
            self.proc = subprocess.Popen(
                [*argv, self.preload, self.entry, *self.args],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,  # Ctrl-C in the terminal is the server's to handle
            )
        finally:
            theirs.close()
        self.channel = ours
        self._ready = asyncio.ensure_future(self._wait_ready())

    async def _wait_ready(self) -> bool:
        assert self.channel is not None
        channel = self.channel
        channel.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(READY_WAIT):
                said = await loop.sock_recv(channel, 16)
        except (TimeoutError, OSError):
            return False
        return said == b"ready\n"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def fork(self, argv: list[str], env: Mapping[str, str]) -> Forked:
        """A child running ``entry(argv)`` with ``env`` added to the helper's.

        Raises:
            ForkError: The helper is not there or did not answer.
        """
        if self._ready is None or not await asyncio.shield(self._ready) or not self.alive:
            raise ForkError("the fork server is not running")
        assert self.channel is not None
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fds = [stdin_r, stdout_w, stderr_w, theirs.fileno()]
        try:
            for _ in range(500):  # a full socket: the helper is reading, try again shortly
                try:
                    send_request(self.channel, argv, dict(env), fds)
                    break
                except BlockingIOError:
                    await asyncio.sleep(0.01)
            else:
                raise ForkError("the fork server does not read its requests")
        except BaseException as exc:
            for fd in (stdin_w, stdout_r, stderr_r):
                os.close(fd)
            control.close()
            if isinstance(exc, OSError):
                raise ForkError(f"the fork server is gone: {exc}") from None
            raise
        finally:
            for fd in (stdin_r, stdout_w, stderr_w):
                os.close(fd)
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=control)
        try:
            async with asyncio.timeout(30):
                line = await reader.readline()
            if not line.startswith(b"pid "):
                raise ForkError("the fork server did not start the dashboard")
            pid = int(line[4:])
        except (TimeoutError, ValueError, ForkError) as exc:
            writer.close()
            for fd in (stdin_w, stdout_r, stderr_r):
                os.close(fd)
            raise ForkError(str(exc) or "the fork server did not answer") from None
        stdin = await _writer(stdin_w)
        stdout = await _reader(stdout_r)
        stderr = await _reader(stderr_r)
        return Forked(pid, reader, writer, stdin, stdout, stderr)

    async def stop(self) -> None:
        """Close the socket: the helper ends its children and exits; wait for it."""
        if self._ready is not None and not self._ready.done():
            self._ready.cancel()
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            await asyncio.to_thread(proc.wait, 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait)


async def _reader(fd: int) -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=STREAM_LIMIT)
    pipe = os.fdopen(fd, "rb", buffering=0)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    return reader


async def _writer(fd: int) -> asyncio.StreamWriter:
    loop = asyncio.get_running_loop()
    pipe = os.fdopen(fd, "wb", buffering=0)
    transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.streams.FlowControlMixin(loop=loop), pipe
    )
    return asyncio.StreamWriter(transport, protocol, None, loop)
