"""The HTML ``gpuwatch serve`` answers with, and the few static files it serves.

Every name and title comes from a recording or a lock file: each is escaped here. The
static files are a fixed list (Textual's web client, its stylesheet and fonts from the
``textual-serve`` package): a URL picks one by name, never by path.
"""

from __future__ import annotations

import importlib.util
from html import escape
from pathlib import Path

from ..fmt import printable

SECURITY_HEADERS = {
    # The page runs no inline script; it talks only to this server (the client's ``?ping=``
    # fetch of another address included) and may not be framed by another site.
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; connect-src 'self'; "
    "style-src 'self' 'unsafe-inline'; font-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

_STATIC = {
    "textual.js": ("js/textual.js", "application/javascript"),
    "xterm.css": ("css/xterm.css", "text/css"),
    "RobotoMono.ttf": ("fonts/RobotoMono-VariableFont_wght.ttf", "font/ttf"),
    "RobotoMono-Italic.ttf": ("fonts/RobotoMono-Italic-VariableFont_wght.ttf", "font/ttf"),
}


def client_dir() -> Path | None:
    """``textual_serve/static`` of the installed ``textual-serve``, found without importing it."""
    spec = importlib.util.find_spec("textual_serve")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "static"
    return path if (path / "js" / "textual.js").is_file() else None


def static_file(name: str, root: Path) -> tuple[Path, str] | None:
    """``(file, content type)`` for a static name, or None: only the fixed list."""
    found = _STATIC.get(name)
    return (root / found[0], found[1]) if found is not None else None


_FONTS = """
@font-face { font-family: 'Roboto Mono'; src: url('BASE/static/RobotoMono.ttf'); }
@font-face { font-family: 'Roboto Mono'; font-style: italic;
             src: url('BASE/static/RobotoMono-Italic.ttf'); }
"""
_STYLE = """
html, body { margin: 0; height: 100%; background: #0c181f; color: #e0e6ea;
             font-family: 'Roboto Mono', monospace; }
.textual-terminal { position: absolute; inset: 0; opacity: 0; }
body.-first-byte .textual-terminal { opacity: 1; }
.note { position: absolute; inset: 0; display: flex; align-items: center;
        justify-content: center; text-align: center; }
body.-first-byte .starting, .ended { display: none; }
body.-closed .ended { display: flex; background: #0c181f; z-index: 10; }
main { max-width: 72em; margin: 2em auto; padding: 0 1em; }
a { color: #8fd3ff; }
li { margin: 0.6em 0; }
.summary { color: #9aa7ae; }
"""


def _page(title: str, body: str, head: str = "", body_class: str = "", base: str = "") -> str:
    cls = f' class="{body_class}"' if body_class else ""
    style = _FONTS.replace("BASE", escape(base)) + _STYLE
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title><style>{style}</style>{head}</head>"
        f"<body{cls}>{body}</body></html>\n"
    )


def app_page(title: str, websocket_url: str, font_size: int = 16, base: str = "") -> str:
    """The page that runs one visitor's dashboard (Textual's client over the websocket);
    ``base``: the server's path prefix."""
    static = escape(base) + "/static"
    head = (
        f'<link rel="stylesheet" href="{static}/xterm.css">'
        f'<script src="{static}/textual.js"></script>'
    )
    body = (
        f'<div class="note starting">{escape(title)}<br>starting…</div>'
        '<div class="note ended"><div>The dashboard ended.<br>'
        '<a href="">Open it again</a></div></div>'
        f'<div id="terminal" class="textual-terminal" '
        f'data-session-websocket-url="{escape(websocket_url)}" '
        f'data-font-size="{int(font_size)}"></div>'
    )
    return _page(f"gpuwatch: {title}", body, head, base=base)


def index_page(entries: list[tuple[str, str, str]], base: str = "") -> str:
    """The list of what is offered: ``(link, name, summary)`` each, the live session first.

    A link is a path below ``base`` (the server's prefix), already percent-encoded; a name
    is any file name, shown as printable text.
    """
    items = "".join(
        f'<li><a href="{escape(base + link)}">{escape(printable(name))}</a><br>'
        f'<span class="summary">{escape(summary)}</span></li>'
        for link, name, summary in entries
    )
    if not items:
        items = "<li>nothing to show: no recording in the sessions directory</li>"
    body = f"<main><h1>gpuwatch</h1><ul>{items}</ul></main>"
    return _page("gpuwatch: sessions", body, base=base)


def message_page(title: str, text: str) -> str:
    """A page that only says something: busy, refused, not found."""
    return _page(
        f"gpuwatch: {title}", f"<main><h1>{escape(title)}</h1><p>{escape(text)}</p></main>"
    )
