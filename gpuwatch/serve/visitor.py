"""One visitor: a ``gpuwatch replay`` process that draws through Textual's web driver.

The driver (``textual.drivers.web_driver``) writes ``__GANGLION__`` on stdout once it runs,
then packets: one type byte (``D`` terminal output, ``M`` JSON meta, ``P`` packed), four
bytes of big-endian length, the payload. It reads the same framing on stdin: ``D`` for
keys and mouse as a terminal would send them, ``M`` for resize, focus, blur and quit.

What the browser sends is the visitor's word: only the message kinds Textual's client
sends are passed on, sizes clamped; what the app asks of the page (open a URL, download a
file) is not passed back: nothing but the dashboard's frames leaves this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from .forking import Forked, ForkError, ForkServer

WEB_DRIVER = "textual.drivers.web_driver:WebDriver"
READY = b"__GANGLION__\n"
PACKET_MAX = 32 << 20
"""Largest packet read from the app (a full-screen frame is a few hundred KB)."""
STDIN_MAX = 64 << 10
"""Most characters of input one browser message may carry."""
STDERR_KEPT = 4096
QUIT_GRACE = 3.0
"""Seconds the app has to quit when asked, before it is terminated."""
SIZE_RANGE = (10, 1000)
"""Columns and rows a browser may ask for (clamped)."""


def clamp_size(value: Any, default: int) -> int:
    """A browser's column or row count, as an int within :data:`SIZE_RANGE`."""
    try:
        n = int(value)
    except (TypeError, ValueError, OverflowError):
        n = default
    return max(SIZE_RANGE[0], min(SIZE_RANGE[1], n))


def packet(kind: bytes, payload: bytes) -> bytes:
    """One packet of the web driver's framing."""
    return kind + len(payload).to_bytes(4, "big") + payload


def replay_argv(files: tuple[str, ...], theme: str | None, align: str) -> list[str]:
    """The arguments of each visitor's ``gpuwatch replay`` on the offer's files."""
    argv = ["replay", *files]
    if len(files) > 1:
        argv += ["--align", align]
    if theme:
        argv += ["--theme", theme]
    return argv


DRIVER_ENV = {"TEXTUAL_DRIVER": WEB_DRIVER, "TEXTUAL_COLOR_SYSTEM": "truecolor"}
"""What makes a dashboard draw for a browser (Textual reads it when imported)."""


class Visitor:
    """A visitor's app process and the pumps between it and the websocket.

    Args:
        argv: The ``gpuwatch`` arguments (no shell).
        send: Sends terminal output to the browser.
        close: Closes the browser's websocket (the app exited).
        forks: The fork server the process comes from; None (or one that is gone): a
            process of its own, ``python -m gpuwatch ARGV``.
    """

    def __init__(
        self,
        argv: list[str],
        send: Callable[[bytes], Awaitable[None]],
        close: Callable[[], Awaitable[Any]],
        forks: ForkServer | None = None,
    ) -> None:
        self.argv = argv
        self._send, self._close = send, close
        self.forks = forks
        self.process: asyncio.subprocess.Process | Forked | None = None
        self._pump: asyncio.Task[None] | None = None
        self._stderr = bytearray()
        self.ready = asyncio.Event()

    @property
    def forked(self) -> bool:
        """The process came from the fork server."""
        return isinstance(self.process, Forked)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def error(self) -> str:
        """The last line the app wrote on stderr (why it could not start), or ``""``."""
        lines = bytes(self._stderr).decode("utf-8", "replace").strip().splitlines()
        return lines[-1] if lines else ""

    async def start(self, width: int, height: int) -> None:
        """Start the app at ``width`` x ``height`` cells."""
        size = {"COLUMNS": str(width), "ROWS": str(height)}
        if self.forks is not None and self.forks.alive:
            with contextlib.suppress(ForkError):
                self.process = await self.forks.fork(self.argv, size)
        if self.process is None:
            await self._spawn({**os.environ, **DRIVER_ENV, **size})
        self._pump = asyncio.create_task(self._run())

    async def _spawn(self, env: dict[str, str]) -> None:
        """A process of its own (no fork server): a cold start."""
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gpuwatch",
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,  # its own group: stopping it reaches all it started
        )

    async def _read_stderr(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        while data := await self.process.stderr.read(4096):
            self._stderr += data
            del self._stderr[:-STDERR_KEPT]

    async def _run(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        stdout = self.process.stdout
        errors = asyncio.create_task(self._read_stderr())
        try:
            for _ in range(20):  # anything printed before the driver starts is skipped
                line = await stdout.readline()
                if not line or line == READY:
                    break
            if line == READY:
                self.ready.set()
                while True:
                    head = await stdout.readexactly(5)
                    size = int.from_bytes(head[1:], "big")
                    if size > PACKET_MAX:
                        break
                    payload = await stdout.readexactly(size)
                    if head[:1] == b"D":
                        await self._send(payload)
                    elif head[:1] == b"M" and _meta_type(payload) == "exit":
                        break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(errors, 1.0)
            with contextlib.suppress(Exception):
                await self._close()

    async def _write(self, data: bytes) -> None:
        if self.process is None or self.process.stdin is None:
            return
        try:
            self.process.stdin.write(data)
            await self.process.stdin.drain()
        except (ConnectionError, RuntimeError):
            pass  # the app has gone: the pump closes the page

    async def handle(self, text: str) -> str | None:
        """Pass on one message of the browser's; returns the reply to send, if any.

        Textual's client sends ``["stdin", str]``, ``["resize", {"width", "height"}]``,
        ``["ping", str]``, ``["focus"]`` and ``["blur"]``; anything else is dropped.
        """
        try:
            message = json.loads(text)
        except (ValueError, RecursionError):
            return None
        if not isinstance(message, list) or not message or not isinstance(message[0], str):
            return None
        kind, arg = message[0], message[1] if len(message) > 1 else None
        if kind == "stdin" and isinstance(arg, str) and len(arg) <= STDIN_MAX:
            await self._write(packet(b"D", arg.encode("utf-8", "replace")))
        elif kind == "resize" and isinstance(arg, dict):
            size = {"width": clamp_size(arg.get("width"), 80)}
            size["height"] = clamp_size(arg.get("height"), 24)
            await self._meta({"type": "resize", **size})
        elif kind in ("focus", "blur"):
            await self._meta({"type": kind})
        elif kind == "ping" and isinstance(arg, str) and len(arg) <= 64:
            return json.dumps(["pong", arg])
        return None

    async def _meta(self, data: dict[str, Any]) -> None:
        await self._write(packet(b"M", json.dumps(data).encode()))

    async def stop(self) -> None:
        """Ask the app to quit; terminate its process group if it has not within a grace."""
        process = self.process
        if process is None:
            return
        if process.returncode is None:
            await self._meta({"type": "quit"})
            try:
                await asyncio.wait_for(process.wait(), QUIT_GRACE)
            except asyncio.TimeoutError:
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(process.pid, sig)
                    try:
                        await asyncio.wait_for(process.wait(), QUIT_GRACE)
                        break
                    except asyncio.TimeoutError:
                        continue
        if self._pump is not None:
            with contextlib.suppress(Exception):
                await self._pump


def _meta_type(payload: bytes) -> str | None:
    try:
        value = json.loads(payload)
    except ValueError:
        return None
    return value.get("type") if isinstance(value, dict) else None
