"""The ``/metrics`` server under hostile clients: idle and slow connections cost no
thread, time out, are capped, and a normal scrape is still answered (issue 23, item 8)."""

from __future__ import annotations

import gzip
import resource
import socket
import threading
import urllib.request
from collections.abc import Iterator

import pytest

from gpuwatch.prometheus import MetricsServer, http_server
from gpuwatch.session import Session

IDLE = 2000
"""Idle connections opened at once (the issue's slowloris)."""


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[MetricsServer]:
    monkeypatch.setattr(http_server, "HEAD_SECONDS", 1.0)
    served = MetricsServer(Session(), "127.0.0.1", 0)
    served.start()
    yield served
    served.stop()


def _descriptors(wanted: int) -> int:
    """Raise this process's descriptor limit toward ``wanted``; returns what it is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def test_idle_connections_hold_no_threads_and_a_scrape_is_answered(
    server: MetricsServer,
) -> None:
    count = min(IDLE, _descriptors(IDLE + 500) - 300)
    before = threading.active_count()
    socks = []
    try:
        for i in range(count):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            if i % 2:  # half of them start a request and never finish it
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            socks.append(sock)
        assert threading.active_count() <= before + 1, "a thread per connection"
        text = _scrape(server.url)  # answered while they all hang on
        assert "gpuwatch_build_info{" in text
        assert server._server is not None
        assert server._server.connections() <= http_server.MAX_CONNECTIONS
        assert threading.active_count() <= before + 1
    finally:
        for sock in socks:
            sock.close()


def test_a_connection_that_sends_nothing_is_closed(server: MetricsServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"GET /metr")  # and never the rest
        assert sock.recv(1) == b""  # closed by the server after HEAD_SECONDS
    assert server._server is not None and server._server.timed_out >= 1
    assert "gpuwatch_build_info{" in _scrape(server.url)


def _raw(server: MetricsServer, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(request)
        chunks = []
        while data := sock.recv(65536):
            chunks.append(data)
    return b"".join(chunks)


def test_answers_malformed_requests_other_methods_and_gzip(server: MetricsServer) -> None:
    assert _raw(server, b"\x00\xff nonsense\r\n\r\n").startswith(b"HTTP/1.0 400 ")
    assert _raw(server, b"POST /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.0 405 ")
    assert _raw(server, b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 5000).startswith(b"HTTP/1.0 431 ")
    answer = _raw(server, b"GET /metrics HTTP/1.1\r\nAccept-Encoding: gzip\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 ") and b"Content-Encoding: gzip" in head
    assert b"gpuwatch_build_info{" in gzip.decompress(body)
