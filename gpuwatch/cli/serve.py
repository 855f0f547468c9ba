"""``gpuwatch serve``: the dashboard in a browser (``docs/serve.md``).

With files, each visitor replays them (several merged, as ``replay`` does); without, the
live session of this machine (the replay of the live gpuwatch's growing recording, a
``gpuwatch record`` started if none runs) and the sessions directory, on an index page.
"""

from __future__ import annotations

import argparse
import importlib.util
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from ._common import (
    EXIT_OK,
    CliError,
    Command,
    add_align,
    add_socket,
    add_theme,
    bounded,
    checked_theme,
    metrics_address,
    say,
)

if TYPE_CHECKING:
    from ..serve.offers import Live

DEFAULT_BIND = "127.0.0.1:8765"


def _bind(text: str) -> tuple[str, int]:
    """``--bind [HOST:]PORT``: the port alone binds loopback."""
    return metrics_address(text)


_visitors = bounded(int, 1, 256, noun="a number of visitors", name="number of visitors")


def _options(p: argparse.ArgumentParser) -> None:
    """What to serve, where, to whom, and how it looks."""
    p.add_argument("file", metavar="FILE", nargs="*", help="a recording to serve; several merge")
    p.add_argument(
        "--bind",
        type=_bind,
        default=_bind(DEFAULT_BIND),
        metavar="[HOST:]PORT",
        help=f"where to listen (default {DEFAULT_BIND}, this machine only; port 0 picks a "
        "free one). Any address other than loopback needs a token: one is made and printed "
        "unless --token-file gives it",
    )
    p.add_argument(
        "--token-file",
        metavar="FILE",
        help="read the token visitors must give from FILE's first line (16 to 256 "
        "printable characters); also required on loopback when given",
    )
    p.add_argument(
        "--max-visitors",
        type=_visitors,
        default=4,
        metavar="N",
        help="visitors at once (each runs a dashboard process); more get a 'busy' page (default 4)",
    )
    add_align(p)
    add_theme(p, " of every visitor's dashboard")
    add_socket(p, "without FILEs: the annotation socket of the live session")


def _need_extra() -> None:
    missing = [m for m in ("aiohttp", "textual_serve") if importlib.util.find_spec(m) is None]
    if missing:
        raise CliError(
            f"gpuwatch serve needs {' and '.join(missing)}: pip install 'gpuwatch[serve]'"
        )


def preload_visitor(theme: str = "", *files: str) -> None:
    """The fork server's preload: what ``gpuwatch replay`` imports, Textual included, and
    one headless drawing of the dashboard on the first of ``files`` (if any) in ``theme``
    (``""``: the default one)."""
    from ..store import player, recording  # noqa: F401
    from ..tui.preload import preload, warm
    from . import recordings  # noqa: F401

    preload()
    if files:
        warm(files[0], theme or None)


def _address(host: str, port: int) -> str:
    if host in ("0.0.0.0", "::"):
        host = socket.gethostname()
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C or SIGTERM."""
    theme = checked_theme(args)
    _need_extra()
    from ..serve.access import Access, is_loopback

    host, port = args.bind
    loopback = is_loopback(host)
    token = _token(args, loopback)
    files: list[str] = args.file
    for f in files:
        _check_file(f)
    import asyncio

    from ..serve.offers import Catalog
    from ..serve.pages import client_dir
    from ..serve.server import Settings, serve

    client = client_dir()
    if client is None:
        raise CliError("textual-serve has no web client files: pip install 'gpuwatch[serve]'")
    live = None if files else _live(args.socket)
    catalog = Catalog(files) if live is None else Catalog([], _sessions_dir(), live)
    settings = Settings(
        catalog=catalog,
        access=Access(loopback=loopback, port=port, token=token),
        client=client,
        max_visitors=args.max_visitors,
        theme=theme,
        align=args.align,
        say=say,
        fork=(f"{__name__}:preload_visitor", "gpuwatch.cli:main"),
    )

    def ready(bound: int) -> None:
        url = _address(host, bound)
        what = catalog.single().title if files else "the live session and recordings"
        say(f"serving {what} on {url} (Ctrl-C stops)")
        if token is not None:
            # On stdout alone: the one line a script reads to find the address.
            print(f"{url}?token={token}", flush=True)
        else:
            print(url, flush=True)

    try:
        asyncio.run(serve(settings, host, port, ready))
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    finally:
        if live is not None:
            live.stop()
    return EXIT_OK


def _token(args: argparse.Namespace, loopback: bool) -> str | None:
    """The token visitors must give: ``--token-file``'s, a new one off loopback, else none.

    Raises:
        CliError: The token file cannot be used.
    """
    from ..serve.access import TokenError, new_token, read_token

    if args.token_file:
        try:
            return read_token(args.token_file)
        except TokenError as exc:
            raise CliError(str(exc))
    return None if loopback else new_token()


def _sessions_dir() -> Path:
    from ..store.sessions import sessions_dir

    return sessions_dir()


def _live(sock: str | None) -> Live:
    """The live session of this machine (nothing is started to browse: only a visit to
    /live does).

    Raises:
        CliError: The running gpuwatch cannot be followed.
    """
    from ..protocol import socket_path
    from ..serve.offers import Live, OfferError

    live = Live(sock or socket_path())
    try:
        live.check()
    except OfferError as exc:
        raise CliError(str(exc))
    return live


def _check_file(path: str) -> None:
    """A named file that is not a readable recording is one line, exit 2, before serving."""
    from ..store.recording import RecordingError, open_recording

    try:
        open_recording(path).close()
    except RecordingError as exc:
        raise CliError(str(exc))


COMMANDS = (
    Command(
        "serve",
        help="serve the dashboard to a web browser (live, or recordings)",
        description="Serve the dashboard to web browsers, one dashboard process per visitor. "
        "With FILEs, each visitor replays them (several merged into one session, as "
        "'replay' does). Without, visitors get an index: the live session of this machine "
        "(the running gpuwatch's recording, followed as it grows; 'gpuwatch record' is "
        "started if none runs) and the recordings of the sessions directory, newest first. "
        "Needs the serve extra: pip install 'gpuwatch[serve]'.",
        options=_options,
        run=cmd_serve,
    ),
)
