"""A real ``gpuwatch serve`` in a child process, for the serve tests and the benchmark."""

from __future__ import annotations

import contextlib
import http.client
import os
import resource
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psutil

ROOT = Path(__file__).resolve().parents[2]  # tests/support/ -> the repository
SPIKE = ROOT / "samples" / "gpt-2.7b-h100-adamw-spike.gpuwatch"


@dataclass
class Served:
    """A running server: its process and the address it printed (with ``?token=``)."""

    proc: subprocess.Popen[str]
    url: str
    errors: Path | None = None

    def stderr(self) -> str:
        """What the server wrote on stderr so far."""
        return self.errors.read_text(errors="replace") if self.errors is not None else ""

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

    def access_prefix(self) -> str:
        """The path prefix the server's token gives it (as :mod:`gpuwatch.serve.access` does)."""
        from gpuwatch.serve.access import Access

        return Access(loopback=False, port=self.port, token=self.token).prefix

    def enter(self) -> tuple[str, str]:
        """With a token: ``(prefix, cookie)`` from the first visit (``/?token=``)."""
        status, headers, _ = self.get(f"/?token={self.token}")
        assert status == 303, (status, headers)
        prefix = headers["Location"].rstrip("/")
        return prefix, headers["Set-Cookie"].split(";")[0]

    def helper(self) -> psutil.Process | None:
        """The fork server, if it runs."""
        for p in psutil.Process(self.proc.pid).children():
            with contextlib.suppress(psutil.Error):
                if "gpuwatch.serve.forkserver" in p.cmdline():
                    return p
        return None

    def started(self) -> set[int]:
        """What the server started besides its fork server: its visitors' dashboards
        (forked by the helper, or its own children) and a live session's ``record``."""
        found: set[int] = set()
        helper = self.helper()
        with contextlib.suppress(psutil.Error):
            found |= {p.pid for p in psutil.Process(self.proc.pid).children()}
        if helper is not None:
            found.discard(helper.pid)
            with contextlib.suppress(psutil.Error):
                found |= {p.pid for p in helper.children()}
        return found

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
    args: list[str],
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
    descriptors: int | None = None,
) -> Iterator[Served]:
    """``gpuwatch serve ARGS`` until the block ends; it must then stop cleanly (exit 0).

    ``descriptors``: the server's limit on open files (soft and hard), as on a machine
    whose hard limit is that.
    """
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")

    def limit() -> None:
        if descriptors is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, descriptors))

    # stderr to a file: a pipe nobody reads while the test runs would stop a talkative server.
    errors = Path(tempfile.mkstemp(prefix="gpuwatch-serve-", suffix=".err")[1])
    with errors.open("w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatch", "serve", *args],
            stdout=subprocess.PIPE,
            stderr=err_file,
            text=True,
            env=env,
            cwd=ROOT,
            preexec_fn=limit if descriptors is not None else None,
        )
    try:
        url = _first_line(proc, timeout, errors)
        yield Served(proc, url, errors)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        err = errors.read_text(errors="replace")
        errors.unlink()  # whatever the block did
    assert proc.returncode == 0, f"gpuwatch serve exited {proc.returncode}: {err}"


def _first_line(proc: subprocess.Popen[str], timeout: float, errors: Path) -> str:
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
    proc.wait()
    err = errors.read_text(errors="replace")
    raise AssertionError(f"gpuwatch serve printed no address: {err}")
