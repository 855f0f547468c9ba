"""A small client of Prometheus' HTTP API: instant and range queries, the scrape interval.

Standard library only (``http.client``), over keep-alive connections: a refresh's queries
reuse the connections the last one left idle instead of a new TCP (and TLS) handshake
each. Redirects are never followed, no proxy from the environment is used (a token must
reach the server the user named), and each socket operation has the timeout. Every
answer is hostile until checked: its size is capped (:data:`MAX_BYTES`), its JSON must
have the shape Prometheus documents
(``{"status": "success", "data": {"resultType": ..., "result": [...]}}``), and label
names, values and numbers are checked one by one; what does not fit is dropped or the
whole answer is refused with one line. Credentials (a bearer token or basic auth) go in
the ``Authorization`` header and nowhere else: no message this module makes contains them.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import re
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple, TypeGuard

from ..fmt import first_line

MAX_BYTES = 32 << 20
"""Largest answer read (16 hosts x 8 GPUs of every family is ~1 MB; a range query of a
host over an hour at 1 s a few MB)."""

MAX_SERIES = 100_000
"""Most series one answer may hold; more is refused as hostile (or a --match too wide)."""

MAX_POINTS = 11_000
"""Most points of one range series (Prometheus itself refuses more than 11,000)."""

MAX_LABEL = 1024
"""Longest label name or value kept; a longer one drops its series."""

DEFAULT_TIMEOUT = 5.0
"""Seconds a query may take, connecting included, before it counts as failed."""

MAX_IDLE = 8
"""Idle keep-alive connections kept for the next queries (a refresh runs a few at once)."""

_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\\n]|\\.)*)"\s*')
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


class PromError(Exception):
    """A query that got no usable answer: one line, never a credential, never a traceback.

    Attributes:
        gone: The server did not answer at all (refused, unreachable, timed out, TLS):
            asking it again at once is pointless.
    """

    def __init__(self, message: str, gone: bool = False) -> None:
        super().__init__(message)
        self.gone = gone


class Series(NamedTuple):
    """One series of an answer: its labels and its points ``(unix seconds, value)``.

    A named tuple: an answer makes thousands a refresh, and a tuple is the cheapest
    immutable record to make.
    """

    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...]

    @property
    def value(self) -> float:
        """The newest value (an instant query has one point)."""
        return self.points[-1][1]


@dataclass(frozen=True)
class Auth:
    """Credentials: a bearer token or ``user:password`` for basic auth (never both)."""

    token: str | None = None
    basic: str | None = None

    def header(self) -> str | None:
        if self.token:
            return f"Bearer {self.token}"
        if self.basic:
            return "Basic " + base64.b64encode(self.basic.encode()).decode("ascii")
        return None

    def __repr__(self) -> str:  # a repr in a log must not carry the secret
        return f"Auth(token={'***' if self.token else None}, basic={'***' if self.basic else None})"


def parse_matchers(text: str) -> list[tuple[str, str, str]]:
    """``{job="x", env=~"prod.*"}`` as ``[(label, op, quoted value), ...]``.

    Raises:
        ValueError: Not a list of label matchers in braces.
    """
    text = text.strip()
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError(f'expected {{label="value", ...}}, got {text!r}')
    body = text[1:-1].strip().rstrip(",")
    found: list[tuple[str, str, str]] = []
    pos = 0
    while pos < len(body):
        m = _MATCHER.match(body, pos)
        if m is None:
            raise ValueError(f"not a label matcher at {body[pos : pos + 30]!r}")
        found.append((m.group(1), m.group(2), m.group(3)))
        pos = m.end()
        if pos < len(body):
            if body[pos] != ",":
                raise ValueError(f"expected ',' between matchers at {body[pos : pos + 30]!r}")
            pos += 1
    return found


def quote(value: str) -> str:
    """A PromQL string literal's inside for ``value`` (``"`` and ``\\`` escaped)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def selector(metric: str, matchers: Iterable[tuple[str, str, str]]) -> str:
    """``metric{l="v",...}`` with the matchers (already quoted PromQL string insides)."""
    inner = ",".join(f'{name}{op}"{value}"' for name, op, value in matchers)
    return f"{metric}{{{inner}}}" if inner else metric


def duration_seconds(text: str) -> float | None:
    """A Prometheus duration (``15s``, ``1m30s``, ``500ms``) in seconds; None if not one."""
    pos, total = 0, 0.0
    while pos < len(text):
        m = _DURATION.match(text, pos)
        if m is None:
            return None
        total += int(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return total if pos else None


class PromClient:
    """Prometheus' HTTP API at ``url``.

    Args:
        url: The server's base URL (``http://host:9090``, ``https://...``, a path prefix
            allowed).
        auth: Credentials, sent with every request.
        insecure: Skip TLS certificate verification (``--insecure``).
        timeout: Seconds each request may take.
        ca_file: A CA bundle to verify the server with, instead of the system's.

    Raises:
        ValueError: Not an http(s) URL with a host.
    """

    def __init__(
        self,
        url: str,
        auth: Auth | None = None,
        *,
        insecure: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
        ca_file: str | None = None,
    ) -> None:
        parts = urllib.parse.urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http:// or https:// URL: {url!r}")
        if parts.username or parts.password:
            raise ValueError("put credentials in --basic-auth-file, not in the URL")
        if parts.query or parts.fragment:
            raise ValueError(f"the URL must not have a query or fragment: {url!r}")
        self.base = urllib.parse.urlunsplit(
            (parts.scheme, parts.netloc, parts.path.rstrip("/"), "", "")
        )
        self.auth = auth or Auth()
        self.timeout = timeout
        self._prefix = parts.path.rstrip("/")
        self._host = parts.hostname
        try:
            self._port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ValueError(f"not a port in {url!r}") from None
        self._context: ssl.SSLContext | None = None
        if parts.scheme == "https":
            context = ssl.create_default_context(cafile=ca_file)
            if insecure:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            self._context = context
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self.requests = 0
        self.connections = 0
        """Connections opened so far (each a TCP, and TLS, handshake)."""

    def __repr__(self) -> str:
        return f"PromClient({self.base!r})"

    # ------------------------------------------------------------------ API

    def query(self, promql: str, at: float | None = None) -> list[Series]:
        """An instant query's vector (a scalar answer counts as one series without labels)."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._result(self._get("/api/v1/query", params), promql)

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[Series]:
        """A range query's matrix, ``step`` seconds apart."""
        params = {
            "query": promql,
            "start": f"{start:.3f}",
            "end": f"{end:.3f}",
            "step": f"{max(step, 0.001):.3f}",
        }
        return self._result(self._get("/api/v1/query_range", params), promql)

    def scrape_interval(self) -> float | None:
        """The shortest scrape interval in Prometheus' loaded configuration (None: unknown).

        Read from ``/api/v1/status/config`` (YAML text in JSON): every ``scrape_interval``
        line, the global one included.
        """
        data = self._get("/api/v1/status/config", {})
        yaml = data.get("yaml") if isinstance(data, dict) else None
        if not isinstance(yaml, str):
            return None
        found = [
            duration_seconds(m.group(1))
            for m in re.finditer(r"^\s*scrape_interval:\s*['\"]?([0-9a-z]+)", yaml, re.M)
        ]
        values = [v for v in found if v]
        return min(values) if values else None

    def redact(self, text: str) -> str:
        """``text`` (a server's words) without our credentials, should it echo them."""
        header = self.auth.header()
        for secret in (self.auth.token, self.auth.basic, header, header and header.split()[-1]):
            if secret:
                text = text.replace(secret, "***")
        return text

    # ------------------------------------------------------------------ transport

    def close(self) -> None:
        """Close the idle connections (one in use closes when its query ends)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _get(self, path: str, params: Mapping[str, str]) -> object:
        target = self._prefix + path + ("?" + urllib.parse.urlencode(params) if params else "")
        headers = {"Accept": "application/json"}
        header = self.auth.header()
        if header is not None:
            headers["Authorization"] = header
        self.requests += 1
        try:
            status, body = self._exchange(target, headers)
        except PromError:
            raise
        except (OSError, ValueError, http.client.HTTPException) as exc:
            # Refused, unreachable, timed out, TLS, reset, a malformed status line.
            raise self._gone(exc) from None
        return self._decode(status, body)

    def _exchange(self, target: str, headers: dict[str, str]) -> tuple[int, bytes]:
        """One GET on an idle connection, else a new one: its status and capped body.

        A reused connection the server closed while idle fails before any answer: the
        GET (which changes nothing) is sent again once on a new connection. A timeout is
        never retried (it would double the wait).
        """
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is not None:
            try:
                return self._send(conn, target, headers)
            except (ConnectionError, http.client.BadStatusLine, http.client.CannotSendRequest):
                conn.close()  # RemoteDisconnected is both a ConnectionError and a BadStatusLine
        return self._send(self._connect(), target, headers)

    def _connect(self) -> http.client.HTTPConnection:
        self.connections += 1
        if self._context is not None:
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=self.timeout, context=self._context
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)

    def _send(
        self, conn: http.client.HTTPConnection, target: str, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        try:
            conn.request("GET", target, headers=headers)
            answer = conn.getresponse()
            body = _read_capped(answer)
        except BaseException:
            conn.close()
            raise
        # Kept for the next query only when this answer was read to its end.
        if answer.will_close or not answer.isclosed():
            conn.close()
        else:
            with self._lock:
                keep = len(self._idle) < MAX_IDLE
                if keep:
                    self._idle.append(conn)
            if not keep:
                conn.close()
        return answer.status, body

    def _gone(self, reason: object) -> PromError:
        """The error for a request that got no HTTP answer."""
        if isinstance(reason, ssl.SSLCertVerificationError):
            why = _why(reason.verify_message or str(reason))
            return PromError(
                f"{self.base}: TLS certificate not trusted ({why}); --insecure skips the check",
                gone=True,
            )
        if isinstance(reason, (TimeoutError, socket.timeout)):
            return PromError(f"{self.base}: no answer within {self.timeout:g} s", gone=True)
        if isinstance(reason, OSError) and reason.strerror:
            return PromError(f"{self.base}: unreachable ({_why(reason.strerror)})", gone=True)
        return PromError(f"{self.base}: unreachable ({_why(str(reason))})", gone=True)

    def _decode(self, status: int, body: bytes) -> object:
        try:
            answer = json.loads(body)
        except (ValueError, RecursionError):
            answer = None
        if not isinstance(answer, dict):
            if status in (401, 403):
                raise PromError(f"{self.base}: HTTP {status}: credentials refused")
            if status != 200:
                raise PromError(f"{self.base}: HTTP {status}")
            raise PromError(f"{self.base}: the answer is not Prometheus' JSON")
        if answer.get("status") not in ("success", "error"):  # JSON of another API
            if status in (401, 403):
                raise PromError(f"{self.base}: HTTP {status}: credentials refused")
            why = f"HTTP {status}, " if status != 200 else ""
            raise PromError(
                f"{self.base}: {why}JSON of another shape, not Prometheus' API answer "
                '(no "status")'
            )
        if answer.get("status") != "success":
            error = answer.get("error")
            kind = answer.get("errorType")
            text = _why(error) if isinstance(error, str) else f"HTTP {status}"
            if isinstance(kind, str) and _NAME.match(kind):
                text = f"{kind}: {text}"
            if status in (401, 403):
                text = f"HTTP {status}: credentials refused"
            raise PromError(f"{self.base}: {self.redact(text)}")
        return answer.get("data")

    def _result(self, data: object, promql: str) -> list[Series]:
        if not isinstance(data, dict):
            raise PromError(f"{self.base}: the answer has no data")
        kind, result = data.get("resultType"), data.get("result")
        if kind in ("scalar", "string"):
            point = _point(result)
            return [Series({}, (point,))] if point is not None else []
        if kind not in ("vector", "matrix") or not isinstance(result, list):
            raise PromError(f"{self.base}: unexpected result type for {first_line(promql, 60)}")
        if len(result) > MAX_SERIES:
            raise PromError(f"{self.base}: {len(result)} series, more than {MAX_SERIES}")
        out = []
        for item in result:
            series = _series(item, kind)
            if series is not None:
                out.append(series)
        return out


def _read_capped(answer: http.client.HTTPResponse) -> bytes:
    """The answer's body, at most :data:`MAX_BYTES` (a redirect is an answer like any
    other: never followed, its status said as the error)."""
    body = answer.read(MAX_BYTES + 1)
    if len(body) > MAX_BYTES:
        raise PromError(f"the answer is larger than {MAX_BYTES >> 20} MiB")
    return body


def _why(reason: object) -> str:
    """A reason as one short printable line."""
    return first_line(reason, 160) or type(reason).__name__


def _point(raw: object) -> tuple[float, float] | None:
    """A sample ``[unix seconds, "value"]``; None if it is not one (exact types only: a
    bool is no time, a number no value string)."""
    if type(raw) is not list or len(raw) != 2:
        return None
    t, v = raw
    if type(v) is not str or len(v) > 64 or (type(t) is not float and type(t) is not int):
        return None
    try:
        value = float(v)
    except ValueError:
        return None
    t = float(t)
    if not math.isfinite(t):
        return None
    return t, value


_NAMES_SEEN: set[str] = set()
"""Label names already checked (a handful repeat over every series of every answer)."""
MAX_NAMES_SEEN = 4096


def _labels(metric: dict[object, object]) -> TypeGuard[dict[str, str]]:
    """Whether every label of ``metric`` is a valid name with a string value of at most
    :data:`MAX_LABEL` characters. The dict is the JSON decoder's own: once checked it is
    kept as it is rather than copied."""
    for k, v in metric.items():
        if type(v) is not str or len(v) > MAX_LABEL:
            return False
        if k not in _NAMES_SEEN:
            if not isinstance(k, str) or len(k) > MAX_LABEL or not _NAME.match(k):
                return False
            if len(_NAMES_SEEN) < MAX_NAMES_SEEN:
                _NAMES_SEEN.add(k)
    return True


def _series(item: object, kind: str) -> Series | None:
    if not isinstance(item, dict):
        return None
    metric = item.get("metric")
    if not isinstance(metric, dict):
        return None
    if not _labels(metric):
        return None
    labels = metric
    if kind == "vector":
        point = _point(item.get("value"))
        return Series(labels, (point,)) if point is not None else None
    raw = item.get("values")
    if not isinstance(raw, list) or len(raw) > MAX_POINTS:
        return None
    points = tuple(p for p in map(_point, raw) if p is not None)
    return Series(labels, points) if points else None
