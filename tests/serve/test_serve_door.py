"""``gpuwatch serve``'s door and its fork server, against a real server process.

- A crowd of unfinished connections (one header line each, then nothing) under a
  1,024-descriptor limit: the token holder is still served at once, stderr says it in a
  line or two, the server does not spin, and unfinished connections are closed in time.
- Visitors forked from the fork server: abrupt disconnects and a killed server leave no
  process behind.
- The index lists every valid file name, escaped, and opens each.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import resource
import shutil
import signal
import socket
import time
from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="gpuwatch serve needs the serve extra (aiohttp)")
pytest.importorskip("textual_serve", reason="gpuwatch serve needs the serve extra")

import aiohttp
import psutil
from conftest import fake_nvml_env, wait_for
from serveproc import SPIKE, Served, serving

from gpuwatch.serve.gate import REQUEST_WAIT, REQUEST_WAIT_ENV, request_wait

CROWD = 1100
LIMIT = 1024


def _crowd(port: int, n: int) -> list[socket.socket]:
    """``n`` connections that each send one header line and stop (no token needed)."""
    socks: list[socket.socket] = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        socks.append(s)
    for s in socks:
        for _ in range(100):
            try:
                s.send(b"GET / HTTP/1.1\r\n")
                break
            except BlockingIOError:
                time.sleep(0.01)
            except OSError:
                break  # closed by the server already (to make room): as it should
    return socks


def _timed_get(served: Served, path: str, cookie: str) -> tuple[int, float]:
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": f"127.0.0.1:{served.port}", "Cookie": cookie})
        status = conn.getresponse().status
    finally:
        conn.close()
    return status, time.monotonic() - start


def _closed(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest.fixture
def many_files() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < CROWD + 200:
        pytest.skip(f"this process may open only {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_crowd_of_unfinished_connections_does_not_lock_out_the_token_holder(
    many_files: None,
) -> None:
    with serving(["--bind", "0.0.0.0:0", str(SPIKE)], descriptors=LIMIT) as served:
        prefix, cookie = served.enter()
        server = psutil.Process(served.proc.pid)
        socks = _crowd(served.port, CROWD)
        try:
            # More connections than the server has descriptors for: the holder still gets in.
            status, took = _timed_get(served, prefix + "/", cookie)
            assert status == 200 and took < 2.0, (status, took)
            # And again after a while, the crowd still held open on our side.
            time.sleep(1.0)
            cpu0 = sum(server.cpu_times()[:2])
            t0 = time.monotonic()
            time.sleep(3.0)
            share = (sum(server.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
            assert share < 0.3, f"the server spins: {share:.0%} of a core"  # it was ~70%
            status, took = _timed_get(served, prefix + "/", cookie)
            assert status == 200 and took < 2.0, (status, took)
            open_now = server.num_fds()
            assert open_now < LIMIT, open_now
            # Everything unfinished is closed once its time is up: ours see the end.
            assert wait_for(lambda: all(_closed(s) for s in socks), timeout=REQUEST_WAIT + 10)
        finally:
            for s in socks:
                s.close()
        err = served.stderr()
        # One line with a count, not a line per refused connection.
        assert len(err) < 2000 and "Too many open files" not in err, err[-2000:]
        assert "connections that had sent no complete request" in err, err


def test_idle_unfinished_connections_are_closed_after_the_wait() -> None:
    # A shorter door than the default: waiting it out is the test, not its 10 seconds.
    wait = 3.0
    env = {**os.environ, REQUEST_WAIT_ENV: str(wait)}
    with serving(["--bind", "0.0.0.0:0", str(SPIKE)], env=env) as served:
        socks = _crowd(served.port, 100)
        try:
            time.sleep(wait / 2)
            assert not any(_closed(s) for s in socks)  # not before their time
            assert wait_for(lambda: all(_closed(s) for s in socks), timeout=wait + 5)
        finally:
            for s in socks:
                s.close()
        # Nothing to report: no connection was closed to make room.
        assert "connections" not in served.stderr()


def test_the_wait_comes_from_the_environment_when_it_is_a_positive_number() -> None:
    assert request_wait({}) == REQUEST_WAIT
    assert request_wait({REQUEST_WAIT_ENV: "2.5"}) == 2.5
    for odd in ("", "soon", "0", "-1", "nan", "inf"):
        assert request_wait({REQUEST_WAIT_ENV: odd}) == REQUEST_WAIT, odd


# ---------------------------------------------------------------------- the fork server


async def _visit(served: Served, abort: bool) -> None:
    session = aiohttp.ClientSession()
    try:
        ws = await session.ws_connect(
            f"{served.base}/ws?width=90&height=30", headers={"Origin": served.base}
        )
        async with asyncio.timeout(120):
            got = b""
            while len(got) < 1000:
                message = await ws.receive()
                assert message.type == aiohttp.WSMsgType.BINARY, message
                got += message.data
        if abort:
            # The TCP connection torn down under the page: no close frame, no goodbye.
            transport = ws._response.connection.transport
            transport.abort()
        else:
            await ws.close()
    finally:
        await session.close()


def test_visitors_are_forked_and_abrupt_disconnects_leave_no_process() -> None:
    with serving(["--bind", "0", "--max-visitors", "8", str(SPIKE)]) as served:
        assert wait_for(lambda: served.helper() is not None, timeout=30)
        helper = served.helper()
        assert helper is not None

        async def crowd() -> set[int]:
            seen: set[int] = set()
            for _ in range(6):
                tasks = [asyncio.create_task(_visit(served, abort=True)) for _ in range(5)]
                await asyncio.gather(*tasks)
                seen |= {p.pid for p in helper.children()}
                # Their places come free (each dashboard ended) before the next five.
                deadline = time.monotonic() + 30
                while served.started() and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
            return seen

        seen = asyncio.run(crowd())
        # Each dashboard was the helper's child (forked, not a cold interpreter) ...
        assert seen
        # ... and each ended, reaped by the helper: no process, no zombie.
        assert wait_for(lambda: not served.started(), timeout=30), served.started()
        assert wait_for(lambda: not helper.children(), timeout=10)
        assert not any(psutil.pid_exists(pid) for pid in seen)
        assert helper.num_threads() == 1  # it forks: no thread of its own, ever
        assert served.get("/")[0] == 200


def test_a_killed_server_leaves_no_process() -> None:
    with serving(["--bind", "0", str(SPIKE)]) as served:

        async def open_two() -> list[int]:
            session = aiohttp.ClientSession()
            sockets = []
            for _ in range(2):
                ws = await session.ws_connect(
                    f"{served.base}/ws?width=90&height=30", headers={"Origin": served.base}
                )
                await ws.receive()
                sockets.append(ws)
            pids = sorted(served.started())
            helper = served.helper()
            assert helper is not None
            served.proc.send_signal(signal.SIGKILL)  # no shutdown of its own
            served.proc.wait()
            await session.close()
            return [*pids, helper.pid]

        left = asyncio.run(open_two())
        assert len(left) == 3
        assert wait_for(lambda: not any(_alive(pid) for pid in left), timeout=20), [
            p for p in left if _alive(p)
        ]
        served.proc.returncode = 0  # killed on purpose: serving() asks for a clean exit


def test_without_the_fork_server_a_visitor_still_gets_a_dashboard() -> None:
    with serving(["--bind", "0", str(SPIKE)]) as served:
        assert wait_for(lambda: served.helper() is not None, timeout=30)
        helper = served.helper()
        assert helper is not None
        helper.kill()
        assert wait_for(lambda: not _alive(helper.pid), timeout=10)
        for _ in range(2):
            asyncio.run(_visit(served, abort=False))  # a cold process of its own, drawn
        assert wait_for(lambda: not served.started(), timeout=30)
        said = served.stderr()
        assert said.count("the fork server is not running") == 1, said


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ---------------------------------------------------------------------- names


NAMES = ["my run.gpuwatch", "résumé.gpuwatch", "a+b.gpuwatch", "<b>x<b>&%41.gpuwatch"]


def test_the_index_lists_every_valid_name_and_browsing_starts_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    sessions = data / "gpuwatch" / "sessions"
    sessions.mkdir(parents=True)
    for name in NAMES:
        shutil.copy(SPIKE, sessions / name)
    (sessions / ".hidden.gpuwatch").write_bytes(SPIKE.read_bytes())
    env = fake_nvml_env(dict(os.environ, XDG_DATA_HOME=str(data)), {"gpus": 1})
    env["GPUWATCH_SOCKET"] = str(tmp_path / "gw.sock")
    with serving(["--bind", "0"], env=env) as served:
        status, _, index = served.get("/")
        assert status == 200
        for link, shown in [
            ("/r/my%20run.gpuwatch", "my run.gpuwatch"),
            ("/r/r%C3%A9sum%C3%A9.gpuwatch", "résumé.gpuwatch"),
            ("/r/a%2Bb.gpuwatch", "a+b.gpuwatch"),
            ("/r/%3Cb%3Ex%3Cb%3E%26%2541.gpuwatch", "&lt;b&gt;x&lt;b&gt;&amp;%41.gpuwatch"),
        ]:
            assert f'href="{link}"' in index and f">{shown}</a>" in index, (link, index)
            status, _, page = served.get(link)
            assert status == 200 and f"replay {shown}" in page, (link, status)
        assert "<b>x" not in index and ".hidden" not in index
        # Browsing old recordings started no recorder and no new recording.
        assert not served.started()
        assert sorted(p.name for p in sessions.iterdir()) == sorted([*NAMES, ".hidden.gpuwatch"])
