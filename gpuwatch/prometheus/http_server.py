"""The HTTP server behind ``--prometheus``: one thread, whatever its clients do.

prometheus_client's own server starts a thread per connection and never times one out:
each idle connection would hold a thread, and many of them would starve the samplers of
the CPU. :class:`ScrapeServer` serves a WSGI app (prometheus_client's
``make_wsgi_app``: content negotiation and gzip stay its own) from one thread over a
selector. A connection has :data:`HEAD_SECONDS` to send its request and
:data:`WRITE_SECONDS` to take the answer; at most :data:`MAX_CONNECTIONS` are open, and
a new one makes room by closing the oldest that has not sent a whole request yet, so an
honest scrape (a request in one packet) is answered whatever else is connected. One
request per connection (HTTP/1.0, ``Connection: close``), as prometheus_client's server.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

HEAD_SECONDS = 5.0
"""Most seconds a connection may take to send its request (Prometheus sends it at once)."""

WRITE_SECONDS = 10.0
"""Most seconds a client may take to read the answer."""

LINGER_SECONDS = 1.0
"""Seconds the request's leftovers are read after answering, so closing does not reset
the connection under an answer the client has not read yet."""

MAX_CONNECTIONS = 64
"""Connections open at once; past it the oldest still sending its request is closed."""

MAX_HEAD = 16 << 10
"""Most bytes of a request's line and headers."""

_READ, _WRITE, _LINGER = 0, 1, 2

App = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _Conn:
    """One client: what it sent, what it is sent, and until when."""

    __slots__ = ("deadline", "inbox", "outbox", "sock", "state")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.state = _READ
        self.inbox = bytearray()
        self.outbox = memoryview(b"")


class ScrapeServer:
    """Serves ``app`` on ``host:port`` from one daemon thread.

    Args:
        host: Address to bind (a name, IPv4 or IPv6).
        port: TCP port; 0 picks a free one (see :attr:`port`).
        app: The WSGI application answering each request.

    Raises:
        OSError: The address cannot be bound (in use, not this machine's, unknown).
    """

    def __init__(self, host: str, port: int, app: App) -> None:
        self.app = app
        family, _, _, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            # A restarted gpuwatch gets its port back while old connections linger.
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind(address)
            self._listener.listen(128)
            self._listener.setblocking(False)
        except BaseException:
            self._listener.close()
            raise
        self.server_address = self._listener.getsockname()
        self.port = int(self.server_address[1])
        self.refused = 0  # connections closed to make room for newer ones
        self.timed_out = 0  # connections closed for taking too long
        self._conns: dict[int, _Conn] = {}  # in the order they were accepted
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._stop = False
        self.thread = threading.Thread(target=self._run, name="gpuwatch-metrics", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def connections(self) -> int:
        """Connections open now."""
        return len(self._conns)

    def stop(self) -> None:
        """Stop serving, close every connection and release the port."""
        self._stop = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=5)
        for conn in list(self._conns.values()):
            self._close(conn)
        self._selector.close()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        next_sweep = time.monotonic()
        while not self._stop:
            try:
                events = self._selector.select(timeout=0.25)
            except OSError:  # the selector was closed under us: stopping
                return
            for key, _ in events:
                if key.data is None:
                    self._accept()
                elif key.data == "wake":
                    return
                else:
                    self._serve(key.data)
            now = time.monotonic()
            if now >= next_sweep:
                next_sweep = now + 0.25
                for conn in [c for c in self._conns.values() if c.deadline < now]:
                    self.timed_out += conn.state != _LINGER
                    self._close(conn)

    def _accept(self) -> None:
        for _ in range(MAX_CONNECTIONS):  # a burst, then the others' turn
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, a connection reset before accept
                return
            sock.setblocking(False)
            if len(self._conns) >= MAX_CONNECTIONS and not self._make_room():
                sock.close()
                self.refused += 1
                continue
            conn = _Conn(sock, time.monotonic() + HEAD_SECONDS)
            self._conns[sock.fileno()] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _make_room(self) -> bool:
        """Close the oldest connection already answered, else the oldest still sending its
        request; False if every one is being answered."""
        for state in (_LINGER, _READ):
            for conn in self._conns.values():
                if conn.state == state:
                    self.refused += state == _READ
                    self._close(conn)
                    return True
        return False

    def _close(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        if self._conns.pop(fd, None) is None:
            return
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(conn.sock)
        conn.sock.close()

    def _serve(self, conn: _Conn) -> None:
        try:
            if conn.state == _WRITE:
                self._write(conn)
            else:
                self._read(conn)
        except OSError:  # reset by the peer, or gone
            self._close(conn)

    def _read(self, conn: _Conn) -> None:
        data = conn.sock.recv(4096)
        if not data:
            self._close(conn)
            return
        if conn.state == _LINGER:
            return  # leftovers of a request already answered
        conn.inbox += data
        end = conn.inbox.find(b"\r\n\r\n")
        if end < 0:
            end = conn.inbox.find(b"\n\n")
        if end < 0 and len(conn.inbox) <= MAX_HEAD:
            return
        if end < 0:
            answer = _plain("431 Request Header Fields Too Large", "request head too large")
        else:
            answer = self._answer(bytes(conn.inbox[:end]))
        conn.inbox = bytearray()
        conn.outbox = memoryview(answer)
        conn.state = _WRITE
        conn.deadline = time.monotonic() + WRITE_SECONDS
        self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)  # most answers fit the socket's buffer at once

    def _write(self, conn: _Conn) -> None:
        sent = conn.sock.send(conn.outbox)
        conn.outbox = conn.outbox[sent:]
        if len(conn.outbox):
            return
        conn.sock.shutdown(socket.SHUT_WR)
        conn.state = _LINGER
        conn.deadline = time.monotonic() + LINGER_SECONDS
        self._selector.modify(conn.sock, selectors.EVENT_READ, conn)

    # ------------------------------------------------------------------ HTTP

    def _answer(self, head: bytes) -> bytes:
        """The whole response to one request head (the app's, or 400)."""
        lines = head.decode("latin-1").replace("\r\n", "\n").split("\n")
        words = lines[0].split()
        if len(words) != 3 or not words[2].startswith("HTTP/"):
            return _plain("400 Bad Request", "malformed request line")
        method, target, _ = words
        path, _, query = target.partition("?")
        environ: dict[str, Any] = {
            "REQUEST_METHOD": method,
            "PATH_INFO": urllib.parse.unquote(path),
            "QUERY_STRING": query,
            "SERVER_NAME": str(self.server_address[0]),
            "SERVER_PORT": str(self.port),
            "SERVER_PROTOCOL": "HTTP/1.0",
            "wsgi.url_scheme": "http",
        }
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                key = "HTTP_" + name.strip().upper().replace("-", "_")
                environ[key] = value.strip()
        started: list[tuple[str, list[tuple[str, str]]]] = []

        def start_response(status: str, headers: list[tuple[str, str]], *_: Any) -> None:
            started.append((status, headers))

        try:
            body = b"".join(self.app(environ, start_response))
        except Exception:  # a collector's bug is this scrape's 500, never the server's end
            return _plain("500 Internal Server Error", "collecting the metrics failed")
        status, headers = started[0]
        return _response(status, headers, body)


def _response(status: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    lines = [f"HTTP/1.0 {status}"]
    lines += [f"{name}: {value}" for name, value in headers]
    lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


def _plain(status: str, text: str) -> bytes:
    return _response(status, [("Content-Type", "text/plain; charset=utf-8")], f"{text}\n".encode())
