"""The aiohttp server of ``gpuwatch serve``: pages, websockets, the visitor cap.

Routes, and nothing else (any other path is 404):

- ``/``: the dashboard of the named files, or (without files) the index;
- ``/live``, ``/r/NAME``: the live session, a recording of the sessions directory;
- ``/ws``, ``/ws/live``, ``/ws/r/NAME``: their websockets, one app process each;
- ``/static/NAME``: Textual's web client (a fixed list, see :mod:`.pages`).

With a token, all of them under the server's prefix (``/<prefix>/``, see :mod:`.access`);
``/?token=`` is then the one way in. Every request passes :class:`~.access.Access` first
(Host, origin, token), and every connection :class:`~.gate.Gate` (the cap, the timeouts).
Visitors' processes come from the fork server (:mod:`.forkserver`) when it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import WSMsgType, web

from ..fmt import printable
from .access import Access
from .forking import ForkServer
from .gate import Gate, connection_cap, listen, raise_descriptor_limit, request_wait
from .offers import LIVE, Catalog, Offer, OfferError, link
from .pages import SECURITY_HEADERS, app_page, index_page, message_page, static_file
from .visitor import DRIVER_ENV, Visitor, clamp_size, replay_argv

DEFAULT_VISITORS = 4
"""Visitors at once by default: each runs a dashboard process of its own (its memory and a
share of a core)."""
WS_MESSAGE_MAX = 1 << 17


@dataclass
class Settings:
    """How the server runs.

    Attributes:
        catalog: What it offers.
        access: Who may see it.
        client: Textual's web client files (``textual_serve/static``).
        max_visitors: Visitors (app processes) at once.
        theme: ``--theme`` for every visitor's dashboard.
        align: ``--align`` for several files.
        say: Where it tells what happens (one line each).
        fork: ``(preload, entry)`` for the fork server (``module:function`` each), or
            None: each visitor's process starts cold.
    """

    catalog: Catalog
    access: Access
    client: Path
    max_visitors: int = DEFAULT_VISITORS
    theme: str | None = None
    align: str = "wall"
    say: Callable[[str], None] = field(default=lambda text: None)
    fork: tuple[str, str] | None = None


class Server:
    """Serves the dashboard; one :class:`~.visitor.Visitor` per open websocket."""

    def __init__(self, settings: Settings, gate: Gate | None = None) -> None:
        self.settings = settings
        self.visitors: set[Visitor] = set()
        self.gate = gate
        self.forks: ForkServer | None = None
        self._said_cold = False

    # ------------------------------------------------------------------ the app

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=1 << 16)
        base = self.settings.access.prefix
        routes = [web.get(f"{base}/static/{{name}}", self._static)]
        if self.settings.catalog.has_index:
            routes += [
                web.get(f"{base}/", self._index),
                web.get(f"{base}/live", self._page),
                web.get(f"{base}/r/{{name}}", self._page),
                web.get(f"{base}/ws/live", self._websocket),
                web.get(f"{base}/ws/r/{{name}}", self._websocket),
            ]
        else:
            routes += [web.get(f"{base}/", self._page), web.get(f"{base}/ws", self._websocket)]
        app.add_routes(routes)
        app.on_shutdown.append(self._on_shutdown)
        return app

    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        access = self.settings.access
        host = request.headers.get("Host", "")
        why = access.host_refused(host) or access.origin_refused(request.headers, host)
        if why is None and access.token is not None:
            # The path as sent (still percent-encoded: no line break can reach a header).
            path = request.raw_path.split("?")[0]
            inside = path.startswith(access.prefix + "/")
            given = request.query.get("token")
            if given is not None and access.token_ok(given) and request.method == "GET":
                # Keep it, as this server's session cookie, and take it out of the address
                # bar (and history): back to the page asked for, under the prefix.
                moved = web.Response(
                    status=303, headers={"Location": path if inside else access.prefix + "/"}
                )
                moved.set_cookie(
                    access.COOKIE,
                    access.session or "",
                    httponly=True,
                    samesite="Lax",  # a holder following a link gets in
                    path=access.prefix + "/",
                )
                _secure(moved)
                return moved
            if not inside or not access.session_ok(request.cookies.get(access.COOKIE)):
                why = "a token is needed: open the address gpuwatch serve printed"
        if why is None and self.gate is not None:
            self.gate.trust(request.protocol)
        response: web.StreamResponse
        if why is not None:
            response = _html(message_page("refused", why), 403)
            response.force_close()  # nothing more on a refused connection
        else:
            try:
                response = await handler(request)
            except web.HTTPNotFound:
                response = _html(message_page("not found", "nothing at this address"), 404)
        if not isinstance(response, web.WebSocketResponse):
            _secure(response)
        return response

    # ------------------------------------------------------------------ pages

    def _offer(self, request: web.Request) -> Offer | None:
        path = request.path.removeprefix(self.settings.access.prefix).removeprefix("/ws")
        if path in ("", "/"):
            key = ""
        elif path == f"/{LIVE}":
            key = LIVE
        else:
            key = request.match_info.get("name", "\0")
        return self.settings.catalog.find(key)

    def _busy(self) -> web.Response | None:
        if len(self.visitors) < self.settings.max_visitors:
            return None
        text = (
            f"All {self.settings.max_visitors} places are taken (each visitor runs a "
            "dashboard of its own on this machine). Try again when someone leaves."
        )
        response = _html(message_page("busy", text), 503)
        response.headers["Retry-After"] = "30"
        return response

    async def _admit(self, request: web.Request) -> Offer | web.Response:
        """The offer the URL names (404 for none), or the busy page past the cap."""
        try:
            offer = await asyncio.to_thread(self._offer, request)
        except OfferError as exc:
            self.settings.say(str(exc))
            response = _html(message_page("the live session cannot start", str(exc)), 503)
            response.headers["Retry-After"] = "30"
            return response
        if offer is None:
            raise web.HTTPNotFound()
        return self._busy() or offer

    async def _page(self, request: web.Request) -> web.StreamResponse:
        offer = await self._admit(request)
        if isinstance(offer, web.Response):
            return offer
        scheme = "wss" if request.secure else "ws"
        base = self.settings.access.prefix
        rest = request.raw_path.split("?")[0].removeprefix(base)
        ws_path = base + "/ws" + ("" if rest == "/" else rest)
        url = f"{scheme}://{request.headers.get('Host', '')}{ws_path}"
        # The client's own font size option (textual-serve's ?fontsize=), within reason.
        font = min(clamp_size(request.query.get("fontsize"), 16), 48)
        return _html(app_page(offer.title, url, font, base))

    async def _index(self, request: web.Request) -> web.StreamResponse:
        entries = await asyncio.to_thread(self._entries)
        return _html(index_page(entries, self.settings.access.prefix))

    def _entries(self) -> list[tuple[str, str, str]]:
        from ..store.info import one_line
        from ..store.recording import RecordingError, open_recording

        catalog = self.settings.catalog
        entries: list[tuple[str, str, str]] = []
        if catalog.live is not None:
            live = catalog.live.offer()
            entries.append(("/live", "live session", live.title))
        for path in catalog.listed():
            try:
                rec = open_recording(path)
            except RecordingError as exc:
                entries.append((link(path.name), path.name, printable(exc)))
                continue
            try:
                summary = one_line(rec)
            except RecordingError as exc:
                summary = printable(exc)
            finally:
                rec.close()
            entries.append((link(path.name), path.name, summary))
        return entries

    async def _static(self, request: web.Request) -> web.StreamResponse:
        found = static_file(request.match_info["name"], self.settings.client)
        if found is None or not found[0].is_file():
            raise web.HTTPNotFound()
        response = web.FileResponse(found[0], headers={"Content-Type": found[1]})
        response.headers["Cache-Control"] = "max-age=3600"
        return response

    # ------------------------------------------------------------------ websockets

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        offer = await self._admit(request)
        if isinstance(offer, web.Response):
            return offer
        ws = web.WebSocketResponse(heartbeat=15, max_msg_size=WS_MESSAGE_MAX)
        argv = replay_argv(offer.files, self.settings.theme, self.settings.align)
        visitor = Visitor(argv, ws.send_bytes, ws.close, self.forks)
        self.visitors.add(visitor)  # before any await: the cap holds under a burst
        try:
            await ws.prepare(request)
            width = clamp_size(request.query.get("width"), 80)
            height = clamp_size(request.query.get("height"), 24)
            await visitor.start(width, height)
            if self.forks is not None and not visitor.forked and not self._said_cold:
                self._said_cold = True
                self.settings.say(
                    "the fork server is not running: each visitor's dashboard starts as a "
                    "process of its own (slower)"
                )
            async for message in ws:
                if message.type != WSMsgType.TEXT:
                    continue
                reply = await visitor.handle(message.data)
                if reply is not None:
                    await ws.send_str(reply)
        finally:
            await visitor.stop()
            self.visitors.discard(visitor)
            if not visitor.ready.is_set() and visitor.error():
                self.settings.say(f"a visitor's dashboard could not start: {visitor.error()}")
        return ws

    async def _on_shutdown(self, app: web.Application) -> None:
        await asyncio.gather(*(v.stop() for v in list(self.visitors)), return_exceptions=True)
        if self.forks is not None:
            await self.forks.stop()


def _html(text: str, status: int = 200) -> web.Response:
    response = web.Response(text=text, status=status, content_type="text/html")
    response.headers["Cache-Control"] = "no-store"
    return response


def _secure(response: web.StreamResponse) -> None:
    for key, value in SECURITY_HEADERS.items():
        response.headers.setdefault(key, value)


async def serve(settings: Settings, host: str, port: int, ready: Callable[[int], None]) -> None:
    """Serve until SIGINT or SIGTERM; ``ready(port)`` once listening (port 0: the one got)."""
    loop = asyncio.get_running_loop()
    limit = raise_descriptor_limit()
    gate = Gate(connection_cap(limit, settings.max_visitors), settings.say)
    loop.set_exception_handler(gate.loop_error)
    server = Server(settings, gate)
    runner: web.AppRunner | None = None
    # Our own accepting (not aiohttp's site, nor asyncio's server): each connection is
    # counted by the gate from accept() on.
    sock = listen(host, port, backlog=min(gate.cap, 4096))
    try:
        if settings.fork is not None:
            # Warmed on a recording served (the command line's, or the newest listed) in
            # the visitors' theme: what it parsed and drew, their processes inherit.
            catalog = settings.catalog
            warm = catalog.files[:1] or [str(p) for p in catalog.listed()[:1]]
            args = (settings.theme or "", *warm)
            forks = ForkServer(*settings.fork, {**os.environ, **DRIVER_ENV}, args)
            forks.start()
            server.forks = forks
        bound = sock.getsockname()[1]
        settings.access.port = bound  # the prefix depends on it: before the routes
        runner = web.AppRunner(
            server.app(), access_log=None, handle_signals=False, keepalive_timeout=request_wait()
        )
        await runner.setup()
        assert runner.server is not None
        gate.serve(sock, runner.server)
        ready(bound)
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        gate.close()
        if runner is not None:
            with contextlib.suppress(Exception):
                await runner.cleanup()
        if server.forks is not None:
            await server.forks.stop()
