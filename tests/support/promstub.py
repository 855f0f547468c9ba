"""A scripted server on a real socket that answers as Prometheus' HTTP API does.

For what a real Prometheus cannot be made to do on demand: check a bearer token, echo a
credential back, answer slowly, with hostile JSON, or with a certificate nobody trusts.
Every request it gets is kept (path, query, headers) so a test can see what was sent.
The real Prometheus is in tests/e2e/test_cluster_e2e.py.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

GiB = 1 << 30


def vector(series: list[tuple[dict[str, str], float]], t: float | None = None) -> dict:
    """A successful instant query's answer."""
    t = time.time() if t is None else t
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": m, "value": [t, repr(float(v))]} for m, v in series],
        },
    }


def gpu_series(
    host: str, gpus: int, used_gib: float = 10, total_gib: float = 80, name: str = "H100"
) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The GPU families of one host's exporter, ``used_gib`` + index GiB on GPU index (its
    utilisation 50% + index, its temperature 60 °C + index, its power 300 W + index)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for i in range(gpus):
        labels = {"gpu": str(i), "uuid": f"GPU-{i}", "name": name, "host": host}
        labels["instance"] = f"{host}:9400"
        out.setdefault("gpuwatch_gpu_up", []).append((labels, 1))
        out.setdefault("gpuwatch_gpu_memory_used_bytes", []).append((labels, (used_gib + i) * GiB))
        out.setdefault("gpuwatch_gpu_memory_total_bytes", []).append((labels, total_gib * GiB))
        out.setdefault("gpuwatch_gpu_utilization_ratio", []).append((labels, 0.5 + i / 100))
        out.setdefault("gpuwatch_gpu_temperature_celsius", []).append((labels, 60 + i))
        out.setdefault("gpuwatch_gpu_power_watts", []).append((labels, 300 + i))
    out.setdefault("up", []).append(({"instance": f"{host}:9400", "job": "gpuwatch"}, 1))
    return out


def rank_series(
    host: str,
    gpu: int,
    rank: int,
    pid: int,
    peaks: dict[str, float],
    step: int = 10,
    **job: str,
) -> dict[str, list[tuple[dict[str, str], float]]]:
    """One rank's process families: its step, current phase and per-phase peaks (bytes);
    ``job``: its job labels (``job_id=...``, ``slurm_job=...``)."""
    base = {"pid": str(pid), "rank": str(rank), "gpu": str(gpu), "host": host, **job}
    out: dict[str, list[tuple[dict[str, str], float]]] = {
        "gpuwatch_process_step": [(base, step)],
        "gpuwatch_process_phase_info": [({**base, "phase": "forward"}, 1)],
        "gpuwatch_process_phase_peak_allocated_bytes": [
            ({**base, "phase": name}, v) for name, v in peaks.items()
        ],
    }
    return out


def _unquote(text: str) -> str:
    """A PromQL string literal's inside as the string it stands for."""
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), text)


def merge(*parts: dict[str, list]) -> dict[str, list]:
    out: dict[str, list] = {}
    for part in parts:
        for k, v in part.items():
            out.setdefault(k, []).extend(v)
    return out


@dataclass
class Request:
    path: str
    params: dict[str, str]
    headers: dict[str, str]
    peer: int = 0
    """The client's port: requests with one peer came over one connection."""


@dataclass
class Stub:
    """What the server answers; change the attributes while it runs."""

    families: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)
    scrape_interval: str = "1s"
    token: str | None = None
    """When set, a request without ``Authorization: Bearer TOKEN`` gets a 401."""
    delay: float = 0.0
    ramp: bool = False
    """Range queries' values grow with time (t mod 1000 added), so joins can be checked."""
    raw: Callable[[str, dict[str, str]], tuple[int, bytes]] | None = None
    """Answers instead of the API: ``(path, params) -> (status, body)``."""
    requests: list[Request] = field(default_factory=list)

    def select(self, query: str) -> list[tuple[dict[str, str], float]]:
        """The series a query names: ``family{...}`` (other expressions: none), every
        family of ``{__name__=~"a|b"}`` (and of ``or (family{...} != 1)``, its series
        that are not 1), and the operands of ``label_replace(EXPR,
        "gpuwatch_role", "ROLE", "", "") or ...`` with their role label."""
        tagged = re.findall(r'label_replace\((.*?), "gpuwatch_role", "(\w+)", "", ""\)', query)
        if tagged:
            return [
                ({**m, "gpuwatch_role": role}, v)
                for expr, role in tagged
                for m, v in self.select(expr)
            ]
        names = re.match(r'\{__name__=~"([a-zA-Z0-9_:|]+)"', query)
        not_one = re.findall(r"\((\w+)(?:\{[^}]*\})? != 1\)", query)  # or (family != 1)
        if names or not_one:  # families by name: each series says its own
            # ``instance=~"a|b"`` in the selector is honoured, as Prometheus does (the
            # view asks a GPU row's figures of the targets near its view only).
            head = query.split(" or ", 1)[0]
            targets = re.search(r'[{,]instance=~"((?:[^"\\]|\\.)*)"', head)
            regex = re.compile(_unquote(targets.group(1))) if targets else None
            return [
                ({"__name__": family, **m}, v)
                for family in (names.group(1).split("|") if names else [])
                for m, v in self.families.get(family, [])
                if regex is None or regex.fullmatch(m.get("instance", ""))
            ] + [
                ({"__name__": family, **m}, v)
                for family in not_one
                for m, v in self.families.get(family, [])
                if v != 1
            ]
        return self.families.get(query.split("{", 1)[0].strip(), [])

    def answer(self, path: str, params: dict[str, str]) -> tuple[int, Any]:
        if path == "/api/v1/status/config":
            yaml = f"global:\n  scrape_interval: {self.scrape_interval}\n"
            return 200, {"status": "success", "data": {"yaml": yaml}}
        if path in ("/api/v1/query", "/api/v1/query_range"):
            series = self.select(params.get("query", ""))
            if path.endswith("range"):
                # One point per step, as Prometheus evaluates a range query: at start,
                # start + step, ... up to end (its value moves with t when ramp is set).
                t0, t1, step = float(params["start"]), float(params["end"]), float(params["step"])
                times = [round(t0 + i * step, 3) for i in range(int((t1 - t0) / step + 1e-6) + 1)]
                result = [
                    {
                        "metric": m,
                        "values": [
                            [t, repr(float(v) + (t % 1000 if self.ramp else 0))] for t in times
                        ],
                    }
                    for m, v in series
                ]
                return 200, {
                    "status": "success",
                    "data": {"resultType": "matrix", "result": result},
                }
            return 200, vector(series, float(params.get("time", time.time())))
        return 404, {"status": "error", "errorType": "not_found", "error": "no such path"}


class PromStub:
    """The server, on 127.0.0.1 (http, or https with ``cert``/``key``).

    Args:
        keep_alive: Answer in HTTP/1.1 and keep each connection open for the next request,
            as Prometheus does (else HTTP/1.0: one request per connection).
        idle_timeout: Seconds a kept connection may wait for its next request before the
            server closes it.
    """

    def __init__(
        self,
        stub: Stub,
        cert: Path | None = None,
        key: Path | None = None,
        *,
        keep_alive: bool = False,
        idle_timeout: float | None = None,
    ) -> None:
        self.stub = stub
        self._open: set[socket.socket] = set()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"
            timeout = idle_timeout

            def setup(self) -> None:
                super().setup()
                owner._open.add(self.connection)

            def finish(self) -> None:
                owner._open.discard(self.connection)
                super().finish()

            def do_GET(self) -> None:
                parts = urllib.parse.urlsplit(self.path)
                params = dict(urllib.parse.parse_qsl(parts.query))
                s = owner.stub
                headers = dict(self.headers.items())
                s.requests.append(Request(parts.path, params, headers, self.client_address[1]))
                if s.delay:
                    time.sleep(s.delay)
                if s.token is not None and self.headers.get("Authorization") != f"Bearer {s.token}":
                    status, body = 401, b"Unauthorized\n"
                elif s.raw is not None:
                    status, body = s.raw(parts.path, params)
                else:
                    status, answer = s.answer(parts.path, params)
                    body = json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up (a timeout test)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        scheme = "http"
        if cert is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop, closing the kept connections too (as a stopped Prometheus does)."""
        self.server.shutdown()
        self.server.server_close()
        for conn in list(self._open):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its client


def self_signed(directory: Path) -> tuple[Path, Path] | None:
    """A self-signed certificate for 127.0.0.1 made by ``openssl req`` (None: no openssl)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        return None
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key
