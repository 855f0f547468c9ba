"""``gpuwatch serve`` in a real headless Chromium (Debian's), driven by Playwright.

The served 2.7B sample: the first frame, the optimizer.step peak and its breakdown, keys
(``2``: the Peaks table), the mouse (a click on a tab), the command palette, a window
resize, and a PNG of the page checked to be no blank. The page draws on a canvas, so the
text is read from the frames the page received (tests/support/vtscreen.py).

``SERVE_SCREENSHOT=PATH`` also writes the PNG there (README's docs/img/serve.png); not a
``GPUWATCH_`` name: conftest clears those.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiohttp", reason="gpuwatch serve needs the serve extra (aiohttp)")
pytest.importorskip("textual_serve", reason="gpuwatch serve needs the serve extra")
playwright_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip)")

from serveproc import SPIKE, serving  # noqa: E402
from support.browser import CHROMIUM, chromium  # noqa: E402
from vtscreen import Screen  # noqa: E402

pytestmark = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK), reason="no chromium (Debian's chromium package)"
)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    with chromium(tmp_path / "profile", 1400, 900) as context:
        yield context


class Watched:
    """What one page received and sent on its websocket."""

    def __init__(self, page: Any) -> None:
        self.screen = Screen()
        self.sent: list[Any] = []
        page.on("websocket", self._on_websocket)

    def _on_websocket(self, ws: Any) -> None:
        ws.on("framereceived", self._received)
        ws.on("framesent", self._sent)

    def _received(self, payload: bytes | str) -> None:
        if isinstance(payload, bytes):
            self.screen.feed(payload)

    def _sent(self, payload: bytes | str) -> None:
        if isinstance(payload, str):
            self.sent.append(json.loads(payload))

    def wait(self, page: Any, cond: Callable[[], object], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            page.wait_for_timeout(100)  # lets Playwright deliver the frames meanwhile
        text = "\n".join(line for line in self.screen.lines() if line)
        raise AssertionError(f"never saw {what}; the screen:\n{text}")

    def row_with(self, *texts: str) -> str | None:
        return next((line for line in self.screen.lines() if all(t in line for t in texts)), None)

    def sizes(self) -> list[tuple[int, int]]:
        return [(m[1]["width"], m[1]["height"]) for m in self.sent if m[0] == "resize"]


def _distinct_colours(context: Any, png: bytes) -> int:
    """Colours in ``png``, counted by Chromium itself on a blank page (no PIL needed)."""
    import base64

    page = context.new_page()
    try:
        return page.evaluate(
            """async (data) => {
                const img = new Image();
                img.src = "data:image/png;base64," + data;
                await img.decode();
                const canvas = document.createElement("canvas");
                canvas.width = img.width; canvas.height = img.height;
                const ctx = canvas.getContext("2d");
                ctx.drawImage(img, 0, 0);
                const px = ctx.getImageData(0, 0, img.width, img.height).data;
                const seen = new Set();
                for (let i = 0; i < px.length; i += 4 * 7) {
                    seen.add((px[i] << 16) | (px[i + 1] << 8) | px[i + 2]);
                }
                return seen.size;
            }""",
            base64.b64encode(png).decode(),
        )
    finally:
        page.close()


def test_the_sample_in_chromium(browser: Any, tmp_path: Path) -> None:
    with serving(["--bind", "0", str(SPIKE)]) as served:
        page = browser.new_page()
        watched = Watched(page)
        page.goto(served.url)
        assert "gpt-2.7b-h100-adamw-spike" in page.title()
        page.wait_for_selector("body.-first-byte", timeout=60_000)

        # The first frame: the cursor in an optimizer.step, its exact peak and breakdown.
        watched.wait(
            page, lambda: watched.row_with("peak in phase 53.61 GiB", "optimizer.step"), "the peak"
        )
        assert watched.row_with("weights 10.7G", "grads 10.7G", "optim 21.4G")
        assert watched.row_with("REPLAY")

        # The page's size follows the window: a smaller window, fewer columns.
        first = watched.sizes()[-1]
        page.set_viewport_size({"width": 1100, "height": 800})
        watched.wait(page, lambda: watched.sizes()[-1][0] < first[0], "a resize sent")
        page.set_viewport_size({"width": 1400, "height": 900})
        watched.wait(page, lambda: watched.sizes()[-1] == first, "the size back")

        # Keys: 2 opens the Peaks table (typed where xterm.js reads keys, as a user's are).
        page.focus(".xterm-helper-textarea")
        page.keyboard.press("2")
        watched.wait(
            page, lambda: watched.row_with("peak allocated", "peak reserved"), "the Peaks table"
        )
        watched.wait(page, lambda: watched.row_with("optimizer.step", "53.61 GiB"), "a peak row")

        # The mouse: a click on the Timelines tab brings the chart back.
        found = watched.screen.find("Timelines")
        assert found is not None
        box = page.locator(".xterm-screen").bounding_box()
        cols, rows = watched.sizes()[-1]
        x = box["x"] + (found[1] + 3) * box["width"] / cols
        y = box["y"] + (found[0] + 0.5) * box["height"] / rows
        page.mouse.click(x, y)
        watched.wait(
            page, lambda: not watched.row_with("peak allocated", "peak reserved"), "Timelines"
        )
        watched.wait(page, lambda: watched.row_with("peak in phase"), "the chart again")
        page.wait_for_timeout(500)
        png = page.screenshot(path=str(tmp_path / "serve.png"))

        # The command palette, as in the terminal.
        page.keyboard.press("Control+p")
        watched.wait(page, lambda: watched.screen.find("Search for commands"), "the palette")
        page.keyboard.press("Escape")

    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert _distinct_colours(browser, png) > 20  # the chart's colours, not a blank page
    shot = os.environ.get("SERVE_SCREENSHOT")
    if shot:
        Path(shot).write_bytes(png)


class _Other(http.server.BaseHTTPRequestHandler):
    """Another web service of the same host: records the cookies browsers send it, and
    serves a page with a link to the dashboard (a wiki, a chat)."""

    seen: list[tuple[str, str]] = []
    link = ""

    def do_GET(self) -> None:
        _Other.seen.append((self.path, self.headers.get("Cookie", "")))
        body = f'<!DOCTYPE html><a id="go" href="{_Other.link}">the dashboard</a>'.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_the_token_reaches_this_server_alone_and_a_link_gets_its_holder_in(
    browser: Any,
) -> None:
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Other)
    thread = threading.Thread(target=other.serve_forever, daemon=True)
    thread.start()
    q = other.server_address[1]
    try:
        with serving(["--bind", "0.0.0.0:0", str(SPIKE)]) as served:
            page = browser.new_page()
            page.goto(f"{served.base}/?token={served.token}")
            prefix = served.access_prefix()
            assert page.url == f"{served.base}{prefix}/"  # the token out of the address bar
            assert "gpt-2.7b-h100-adamw-spike" in page.title()
            page.wait_for_selector("body.-first-byte", timeout=60_000)
            (cookie,) = [c for c in browser.cookies() if c["name"] == "gpuwatch_session"]
            assert cookie["value"] != served.token and cookie["path"] == prefix + "/"

            # Another port of the same host, at its own paths: no cookie of ours reaches it.
            for path in ("/", "/static/textual.js", "/ws", "/anything?x=1"):
                page.goto(f"http://127.0.0.1:{q}{path}")
            assert _Other.seen and all("gpuwatch" not in c for _, c in _Other.seen), _Other.seen
            assert not browser.cookies(f"http://127.0.0.1:{q}/")

            # A link from another site (localhost is another site than 127.0.0.1) to the
            # dashboard: its holder gets in, the dashboard draws.
            _Other.link = f"{served.base}{prefix}/"
            page.goto(f"http://localhost:{q}/wiki")
            page.click("#go")
            page.wait_for_load_state()
            assert page.url == _Other.link and "gpt-2.7b-h100-adamw-spike" in page.title()
            page.wait_for_selector("body.-first-byte", timeout=60_000)

            # A visitor without it who follows the same link is refused.
            browser.clear_cookies()
            page.goto(f"http://localhost:{q}/wiki")
            page.click("#go")
            page.wait_for_load_state()
            assert "refused" in page.title(), page.title()
            page.close()
    finally:
        other.shutdown()
        other.server_close()
