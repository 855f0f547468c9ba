"""``gpuwatch serve`` against a real server process: tokens, origins, paths, the cap, live.

The browser itself is driven in tests/e2e/test_serve_browser.py; here the pages and websockets
are asked for with raw HTTP (paths sent exactly as written) and aiohttp's websocket client.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="gpuwatch serve needs the serve extra (aiohttp)")
pytest.importorskip("textual_serve", reason="gpuwatch serve needs the serve extra")

import aiohttp
import psutil
from conftest import ROOT, fake_nvml_env, wait_for
from serveproc import SPIKE, Served, serving
from vtscreen import Screen

from gpuwatch.serve.access import Access, TokenError, is_loopback, read_token

HOSTILE = "<script>alert(1)</script>\x1b[2J"


def _children(served: Served) -> set[int]:
    """What the server started: its dashboards, and the ``record`` of a live session (not
    that record's own helpers, the relay and the GPU sampler, which come when they come),
    nor the fork server the dashboards come from."""
    return served.started()


async def _ws(
    served: Served,
    path: str = "/ws",
    cookie: str | None = None,
    origin: str | None = None,
    width: int = 100,
    height: int = 30,
) -> tuple[aiohttp.ClientSession, aiohttp.ClientWebSocketResponse]:
    headers = {"Origin": origin or served.base}
    if cookie is not None:
        headers["Cookie"] = cookie
    session = aiohttp.ClientSession()
    try:
        ws = await session.ws_connect(
            f"{served.base}{path}?width={width}&height={height}", headers=headers
        )
    except BaseException:
        await session.close()
        raise
    return session, ws


async def _first_frame(
    ws: aiohttp.ClientWebSocketResponse, timeout: float = 60.0, size: int = 1000
) -> bytes:
    """Terminal output from the visitor's dashboard (its first ``size`` bytes)."""
    got = b""
    async with asyncio.timeout(timeout):
        while len(got) < size:
            message = await ws.receive()
            assert message.type == aiohttp.WSMsgType.BINARY, message
            got += message.data
    return got


# ---------------------------------------------------------------------- the rules


def test_access_rules() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    local = Access(loopback=True, port=8765)
    assert local.host_refused("127.0.0.1:8765") is None
    assert local.host_refused("[::1]:8765") is None
    assert local.host_refused("evil.example:8765")  # DNS rebinding
    assert local.origin_refused({"Origin": "http://evil.example"}, "127.0.0.1:8765")
    assert local.origin_refused({"Origin": "http://127.0.0.1:8765"}, "127.0.0.1:8765") is None
    framed = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Dest": "iframe"}
    assert local.origin_refused(framed, "127.0.0.1:8765")
    visit = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Dest": "document"}
    assert local.origin_refused(visit, "127.0.0.1:8765") is None  # a link followed
    remote = Access(loopback=False, port=1, token="s3cret-token-0123456789")
    assert remote.token_ok("s3cret-token-0123456789")
    assert not remote.token_ok("s3cret-token-012345678") and not remote.token_ok(None)
    # The prefix and the session value: this server's alone (its token and its port).
    same_token = Access(loopback=False, port=2, token="s3cret-token-0123456789")
    assert remote.prefix.startswith("/") and len(remote.prefix) == 23
    assert remote.prefix != same_token.prefix and remote.session != same_token.session
    assert remote.session_ok(remote.session) and not remote.session_ok(same_token.session)
    assert remote.session != remote.token and not remote.session_ok(remote.token)
    assert local.prefix == "" and local.session is None and local.session_ok(None)


def test_token_file(tmp_path: Path) -> None:
    good = tmp_path / "token"
    good.write_text("abcdefghijklmnopqrstuvwxyz\nignored\n")
    assert read_token(str(good)) == "abcdefghijklmnopqrstuvwxyz"
    for bad in ("short\n", "has a space in it somewhere\n", "é" * 20):
        good.write_text(bad)
        with pytest.raises(TokenError):
            read_token(str(good))
    with pytest.raises(TokenError):
        read_token(str(tmp_path / "absent"))


# ---------------------------------------------------------------------- the command line


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--bind", "nowhere:port"], "not a port"),
        (["--max-visitors", "0"], "between 1 and 256"),
        (["--token-file", "/nonexistent/token"], "cannot read the token file"),
        (["/nonexistent.gpuwatch"], "nonexistent.gpuwatch"),
        (["--theme", "no-such-theme", str(SPIKE)], "unknown theme"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], said: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "serve", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 2, out
    assert said in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


# ---------------------------------------------------------------------- the token


def test_other_bind_needs_the_token_on_page_and_websocket() -> None:
    with serving(["--bind", "0.0.0.0:0", str(SPIKE)]) as served:
        token = served.token
        assert token and len(token) >= 16, served.url
        status, headers, body = served.get("/")
        assert status == 403 and "token" in body
        assert headers["X-Frame-Options"] == "DENY"  # a refusal may not be framed either
        status, _, _ = served.get("/?token=" + "x" * len(token))
        assert status == 403
        status, _, _ = served.get("/static/textual.js")
        assert status == 403
        # The prefix alone (in an address bar, a shared link) opens nothing.
        prefix = served.access_prefix()
        for path in ("/", "/ws", "/static/textual.js"):
            assert served.get(prefix + path)[0] == 403, path

        async def refused() -> int:
            with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
                await _ws(served)
            return caught.value.status

        assert asyncio.run(refused()) == 403
        assert _children(served) == set()  # nothing started for a refused visitor

        # The token, once: a session cookie scoped to this server's prefix, and the
        # address bar loses the token.
        status, headers, _ = served.get(f"/?token={token}")
        assert status == 303 and headers["Location"] == prefix + "/"
        set_cookie = headers["Set-Cookie"]
        cookie = set_cookie.split(";")[0]
        assert "HttpOnly" in set_cookie and "SameSite=Lax" in set_cookie, set_cookie
        assert f"Path={prefix}/" in set_cookie, set_cookie
        assert token not in set_cookie  # a session value, never the token itself
        # Never a redirect to another site ("//host" is one).
        status, headers, _ = served.get(f"//evil.example/?token={token}")
        assert status == 303 and headers["Location"] == prefix + "/", headers
        status, headers, _ = served.get(f"{prefix}/static/xterm.css?token={token}")
        assert status == 303 and headers["Location"] == f"{prefix}/static/xterm.css"
        status, headers, body = served.get(prefix + "/", {"Cookie": cookie})
        assert status == 200 and "gpt-2.7b-h100-adamw-spike" in body
        assert headers["X-Frame-Options"] == "DENY"
        assert f'src="{prefix}/static/textual.js"' in body and f"{prefix}/ws" in body
        assert served.get(prefix + "/static/textual.js", {"Cookie": cookie})[0] == 200
        # The cookie outside the prefix, or a forged one, opens nothing.
        assert served.get("/", {"Cookie": cookie})[0] == 403
        forged = "gpuwatch_session=" + token
        assert served.get(prefix + "/", {"Cookie": forged})[0] == 403

        # Another origin, token or not, is refused on the page and the websocket.
        status, _, _ = served.get(prefix + "/", {"Cookie": cookie, "Origin": "http://evil.example"})
        assert status == 403

        async def visits() -> tuple[int, bytes]:
            with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
                await _ws(served, prefix + "/ws", cookie=cookie, origin="http://evil.example")
            session, ws = await _ws(served, prefix + "/ws", cookie=cookie)
            try:
                frame = await _first_frame(ws)
                # What a page sends is its word: none of this stops its dashboard.
                for bad in (
                    "not json",
                    "[]",
                    "{}",
                    '["stdin", 5]',
                    '["resize", "x"]',
                    '["resize", {"width": 1e300, "height": -4}]',
                    '["open_url", "x"]',
                    '["stdin", "' + "x" * 70_000 + '"]',
                    "[" * 10_000,
                ):
                    await ws.send_str(bad)
                await ws.send_str('["ping", "still there"]')
                async with asyncio.timeout(30):
                    while True:
                        message = await ws.receive()
                        assert message.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT)
                        if message.type == aiohttp.WSMsgType.TEXT:
                            assert message.json() == ["pong", "still there"]
                            break
                return caught.value.status, frame
            finally:
                await ws.close()
                await session.close()

        status, frame = asyncio.run(visits())
        assert status == 403
        assert b"REPLAY" in frame  # the visitor's own dashboard drew


def test_loopback_refuses_another_host_name() -> None:
    with serving(["--bind", "0", str(SPIKE)]) as served:
        assert served.token is None
        assert served.get("/")[0] == 200
        status, _, body = served.get("/", {"Host": f"rebound.example:{served.port}"})
        assert status == 403 and "loopback" in body


# ---------------------------------------------------------------------- paths


def test_path_traversal_is_404_and_touches_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    sessions = data / "gpuwatch" / "sessions"
    sessions.mkdir(parents=True)
    inside = sessions / "20261123-060331-vm.gpuwatch"
    shutil.copy(SPIKE, inside)
    with sqlite3.connect(inside) as db:  # a label is the recording's word: hostile here
        db.execute("UPDATE meta SET value = ? WHERE key = 'label'", (HOSTILE,))
    outside = tmp_path / "secret.gpuwatch"
    shutil.copy(SPIKE, outside)
    (sessions / "20261124-000000-link.gpuwatch").symlink_to(outside)
    env = fake_nvml_env(dict(os.environ, XDG_DATA_HOME=str(data)), {"gpus": 1})
    env["GPUWATCH_SOCKET"] = str(tmp_path / "gw.sock")
    with serving(["--bind", "0"], env=env) as served:
        started = _children(served)
        status, _, index = served.get("/")
        assert status == 200
        assert inside.name in index and "link" not in index and "secret" not in index
        assert "<script>" not in index and "&lt;script&gt;" in index
        assert served.get(f"/r/{inside.name}")[0] == 200  # what is listed opens
        attempts = [
            "/static/../../../../etc/passwd",
            "/static/..%2f..%2f..%2fetc%2fpasswd",
            "/static/%2e%2e/%2e%2e/etc/passwd",
            "/static/textual.js/../../../etc/passwd",
            "/static/..%5c..%5cetc%5cpasswd",
            "//etc/passwd",
            "/r/..%2F..%2F..%2Fsecret.gpuwatch",
            f"/r/..%2f..%2f..%2f{outside.name}",
            f"/r/{outside}",
            "/r/20261124-000000-link.gpuwatch",
            "/r/%2e%2e",
            "/ws/r/20261124-000000-link.gpuwatch",
            f"/ws/r/..%2f..%2f{outside.name}",
            "/r/.gpuwatch",
            "/download/anything",
        ]
        for path in attempts:
            status, _, body = served.get(path)
            assert status == 404, (path, status, body[:200])
            assert "root:" not in body and "SQLite" not in body
        assert _children(served) == started  # no dashboard was started for any of them


# ---------------------------------------------------------------------- the cap


def test_visitors_over_the_cap_get_the_busy_page() -> None:
    args = ["--bind", "0", "--max-visitors", "1", "--theme", "gpuwatch-light", str(SPIKE)]
    with serving(args) as served:

        async def crowd() -> None:
            session, ws = await _ws(served)
            try:
                # The theme asked for: gpuwatch-light's background, in true colour.
                assert b"48;2;250;250;250" in await _first_frame(ws, size=20_000)
                status, headers, body = served.get("/")
                assert status == 503 and "busy" in body and headers["Retry-After"]
                with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
                    await _ws(served)
                assert caught.value.status == 503
            finally:
                await ws.close()
                await session.close()

        asyncio.run(crowd())
        # The visitor left: its dashboard process ends, and its place is free again.
        assert wait_for(lambda: served.get("/")[0] == 200, timeout=20)
        assert wait_for(lambda: not _children(served), timeout=20)


# ---------------------------------------------------------------------- live


def _live_env(tmp_path: Path) -> dict[str, str]:
    env = fake_nvml_env(dict(os.environ, XDG_DATA_HOME=str(tmp_path / "data")), {"gpus": 1})
    env["GPUWATCH_SOCKET"] = str(tmp_path / "gw.sock")
    return env


def test_live_starts_gpuwatch_record_when_none_runs(tmp_path: Path) -> None:
    env = _live_env(tmp_path)
    sessions = tmp_path / "data" / "gpuwatch" / "sessions"
    with serving(["--bind", "0"], env=env) as served:
        # Browsing starts nothing: only opening the live session does.
        status, _, index = served.get("/")
        assert status == 200
        assert "opening it starts gpuwatch record" in index, index
        assert not _children(served) and not list(sessions.glob("*.gpuwatch"))
        status, _, page = served.get("/live")
        assert status == 200 and "<title>gpuwatch: live session of" in page
        assert "gpuwatch serve started gpuwatch record" in page, page
        recordings = list(sessions.glob("*.gpuwatch"))
        assert len(recordings) == 1 and recordings[0].name in page
        assert len(_children(served)) == 1
        served.get("/live")  # a second visit follows the same recorder
        assert len(list(sessions.glob("*.gpuwatch"))) == 1 and len(_children(served)) == 1
    # Stopping the server stops the recorder it started: the recording is finished.
    from gpuwatch.store.recording import open_recording

    rec = open_recording(recordings[0])
    try:
        assert rec.complete
    finally:
        rec.close()


def test_live_follows_a_running_gpuwatch(tmp_path: Path) -> None:
    env = _live_env(tmp_path)
    out = tmp_path / "running.gpuwatch"
    env["PYTHONPATH"] = str(ROOT)
    record = subprocess.Popen(
        [sys.executable, "-m", "gpuwatch", "record", "--out", str(out)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_for(out.exists, timeout=30)
        with serving(["--bind", "0"], env=env) as served:
            status, _, page = served.get("/live")
            assert status == 200
            assert f"following the running gpuwatch (pid {record.pid})" in page
            assert "running.gpuwatch" in page

            async def visit() -> bytes:
                session, ws = await _ws(served, "/ws/live")
                try:
                    return await _first_frame(ws)
                finally:
                    await ws.close()
                    await session.close()

            assert b"REPLAY" in asyncio.run(visit())
        assert record.poll() is None  # not ours to stop
    finally:
        record.terminate()
        record.wait(30)


def test_stopping_the_server_ends_its_visitors() -> None:
    apps: set[int] = set()
    with serving(["--bind", "0", str(SPIKE)]) as served:

        async def visit() -> None:
            session, ws = await _ws(served)
            await _first_frame(ws)
            apps.update(_children(served))
            helper = served.helper()
            assert helper is not None
            apps.add(helper.pid)
            served.proc.terminate()  # with the page still open
            async with asyncio.timeout(30):
                while not ws.closed:
                    await ws.receive()
            await session.close()

        asyncio.run(visit())
    assert apps and not any(psutil.pid_exists(pid) for pid in apps)


def test_several_files_are_one_merged_session() -> None:
    other = ROOT / "samples" / "gpt2-small-h100.gpuwatch"
    with serving(["--bind", "0", "--align", "start", str(SPIKE), str(other)]) as served:
        status, _, page = served.get("/")
        assert status == 200 and "replay of 2 recordings merged" in page

        async def visit() -> tuple[bytes, list[str]]:
            # 160x45: the replay opens with its cursor on a mark, and the status bar reads
            # the mark before the count (at 100 columns the count gives way to it); the
            # panels, titled by file, show from 3 x 12 rows (fewer: the overview instead).
            session, ws = await _ws(served, width=160, height=45)
            try:
                frame = await _first_frame(ws, size=80_000)
                (app,) = [psutil.Process(pid) for pid in _children(served)]
                return frame, app.cmdline()
            finally:
                await ws.close()
                await session.close()

        frame, argv = asyncio.run(visit())
        # Forked from the fork server (its command line is the helper's): one dashboard.
        assert "gpuwatch.serve.forkserver" in argv, argv
        screen = Screen()
        screen.feed(frame)
        # One session: both files' instrumented processes, devices named by their file.
        assert screen.find("2 instrumented") and screen.find("replay of 2 recordings")
        assert screen.find("gpt-2.7b-h100-adamw-spike · GPU 0")
