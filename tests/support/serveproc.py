"""A real ``gpuwatch serve`` in a child process, for the serve tests and the benchmark."""

from __future__ import annotations

import contextlib
import http.client
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]  # tests/support/ -> the repository
SPIKE = ROOT / "samples" / "gpt-2.7b-h100-adamw-spike.gpuwatch"


@dataclass
class Served:
    """A running server: its process and the address it printed (with ``?token=``)."""

    proc: subprocess.Popen[str]
    url: str

    @property
    def port(self) -> int:
        return urlsplit(self.url).port or 80

    @property
    def base(self) -> str:
        """``http://127.0.0.1:PORT`` (a 0.0.0.0 bind is reached on loopback too)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def token(self) -> str | None:
        query = urlsplit(self.url).query
        return query.removeprefix("token=") if query.startswith("token=") else None

    def get(
        self, path: str, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], str]:
        """One raw GET of ``path`` exactly as written (no client normalises it)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
            sent = {"Host": f"127.0.0.1:{self.port}", **(headers or {})}
            for key, value in sent.items():
                conn.putheader(key, value)
            conn.endheaders()
            response = conn.getresponse()
            body = response.read().decode("utf-8", "replace")
            return response.status, dict(response.getheaders()), body
        finally:
            conn.close()


@contextlib.contextmanager
def serving(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 60.0
) -> Iterator[Served]:
    """``gpuwatch serve ARGS`` until the block ends; it must then stop cleanly (exit 0)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwatch", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        url = _first_line(proc, timeout)
        yield Served(proc, url)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    err = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == 0, f"gpuwatch serve exited {proc.returncode}: {err}"


def _first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sel.select(0.2):
            line = proc.stdout.readline().strip()
            if line:
                return line
        if proc.poll() is not None:
            break
    proc.kill()
    err = proc.stderr.read() if proc.stderr else ""
    raise AssertionError(f"gpuwatch serve printed no address: {err}")
