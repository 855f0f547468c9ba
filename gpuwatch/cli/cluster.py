"""``gpuwatch cluster --prometheus URL``: every GPU the series name, live (docs/cluster.md).

Credentials come from a file or the environment, never from the command line (where
``ps`` shows them): ``--token-file``, ``$GPUWATCH_PROMETHEUS_TOKEN``, ``--basic-auth-file``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from typing import TYPE_CHECKING, Any

from ._common import (
    EXIT_ERROR,
    EXIT_OK,
    CliError,
    Command,
    add_theme,
    bounded,
    check_theme,
    need_terminal,
    theme_name,
)

if TYPE_CHECKING:
    from ..cluster import Auth

TOKEN_ENV = "GPUWATCH_PROMETHEUS_TOKEN"
SORTS = ("memory", "headroom", "host", "rank")
"""gpuwatch.cluster.model.SORTS, written out: importing it loads ssl for every command
(tests/cluster/test_cluster_client.py holds the two in step)."""
MAX_SECRET = 64 << 10
"""Largest token or basic-auth file read (a JWT is a few kB)."""


_timeout = bounded(float, 0.1, 300.0, noun="a number of seconds", name="timeout", unit=" seconds")


def _options(p: argparse.ArgumentParser) -> None:
    """Where Prometheus is, which series to show, how to sign in, and the view."""
    p.add_argument(
        "--prometheus",
        required=True,
        metavar="URL",
        help="Prometheus' base URL, e.g. http://prometheus:9090 (https:// verifies the "
        "certificate unless --insecure)",
    )
    p.add_argument("--job", metavar="NAME", help='only series of this scrape job (job="NAME")')
    p.add_argument(
        "--match",
        metavar="'{LABEL=\"VALUE\",...}'",
        help='label matchers added to every query, e.g. \'{cluster="a100",env=~"prod.*"}\'',
    )
    p.add_argument(
        "--token-file",
        metavar="FILE",
        help=f"send the bearer token in FILE (default: ${TOKEN_ENV} when set)",
    )
    p.add_argument(
        "--basic-auth-file",
        metavar="FILE",
        help="basic auth: FILE holds USER:PASSWORD on its first line",
    )
    p.add_argument("--ca-file", metavar="FILE", help="verify an https server with this CA bundle")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="do not verify the https server's certificate (credentials may then reach "
        "whoever answers)",
    )
    p.add_argument(
        "--timeout",
        type=_timeout,
        default=5.0,
        metavar="SECONDS",
        help="how long a query may take before the figures are marked stale (default 5)",
    )
    p.add_argument(
        "--sort", choices=SORTS, default="host", help="the grid's first order (default host)"
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="print the grid, the summary and the ranks once as text and exit (no terminal "
        "needed; exit status 1 when Prometheus could not be read)",
    )
    add_theme(p)


def _secret(path: str, what: str) -> str:
    """The first line of a credentials file (its contents are never printed)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SECRET + 1)
    except OSError as exc:
        raise CliError(f"cannot read the {what} file {path}: {exc.strerror or exc}")
    if len(raw) > MAX_SECRET:
        raise CliError(f"the {what} file {path} is larger than {MAX_SECRET >> 10} KiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CliError(f"the {what} file {path} is not UTF-8 text")
    lines = text.splitlines()
    value = lines[0].strip() if lines else ""
    if not value or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise CliError(f"the {what} file {path} has no {what} on its first line")
    return value


def auth_from(args: argparse.Namespace) -> Auth:
    """Credentials from ``--token-file``, ``--basic-auth-file`` or the environment."""
    from ..cluster import Auth

    if args.token_file and args.basic_auth_file:
        raise CliError("give --token-file or --basic-auth-file, not both")
    if args.basic_auth_file:
        basic = _secret(args.basic_auth_file, "basic auth")
        if ":" not in basic:
            raise CliError(f"the basic auth file {args.basic_auth_file} must hold USER:PASSWORD")
        return Auth(basic=basic)
    if args.token_file:
        return Auth(token=_secret(args.token_file, "token"))
    token = os.environ.get(TOKEN_ENV, "").strip()
    if token and any(ord(c) < 32 or ord(c) == 127 for c in token):
        raise CliError(f"${TOKEN_ENV} holds control characters")
    return Auth(token=token or None)


def matchers_from(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """``--match`` and ``--job`` as label matchers."""
    from ..cluster import parse_matchers
    from ..cluster.client import quote

    found: list[tuple[str, str, str]] = []
    if args.match:
        try:
            found = parse_matchers(args.match)
        except ValueError as exc:
            raise CliError(f"--match: {exc}")
    if args.job is not None:
        if not args.job:
            raise CliError("--job: empty job name")
        found.append(("job", "=", quote(args.job)))
    return found


def cmd_cluster(args: argparse.Namespace) -> int:
    """Check the options, then show the view (or print it once with ``--once``)."""
    from ..cluster import PromClient

    theme = theme_name(args)
    if not args.once:
        check_theme(theme)
    matchers = matchers_from(args)
    auth = auth_from(args)
    if args.ca_file and not os.path.isfile(args.ca_file):
        raise CliError(f"--ca-file: no such file: {args.ca_file}")
    try:
        client = PromClient(
            args.prometheus,
            auth,
            insecure=args.insecure,
            timeout=args.timeout,
            ca_file=args.ca_file,
        )
    except ValueError as exc:
        raise CliError(f"--prometheus: {exc}")
    if args.once:
        return _once(client, matchers, args.sort)
    from .live import user_keymap  # a bad keymap is one line before the screen

    keymap = user_keymap()
    need_terminal("gpuwatch cluster --once (the grid as text)")
    from ..tui.cluster import ClusterApp

    app = ClusterApp(client, matchers, sort=args.sort, theme=theme, keymap=keymap)
    app.run()
    return EXIT_OK


def _once(client: Any, matchers: list[tuple[str, str, str]], sort: str) -> int:
    from ..cluster import Cluster, fetch
    from ..cluster.text import report

    cluster = Cluster()
    answers = fetch(client, matchers)
    cluster.apply(answers)
    # On a terminal the grid's columns fit its width; piped, every column is printed.
    width = shutil.get_terminal_size((1000, 24)).columns if sys.stdout.isatty() else 1000
    for line in report(cluster, time.time(), sort, width=width):
        print(line)
    sys.stdout.flush()
    return EXIT_ERROR if cluster.refreshed is None else EXIT_OK


COMMANDS = (
    Command(
        "cluster",
        help="every GPU of a cluster, live, from Prometheus",
        description="Show every GPU that gpuwatch exporters report to Prometheus: a cell per "
        "GPU grouped by host (used/total, rank, phase, the last step's exact peak against "
        "its prediction, its state), the ranks side by side, and a host's timelines on "
        "enter. Reads Prometheus' HTTP API; refreshes at Prometheus' scrape interval "
        "(at most once a second).",
        usage="gpuwatch cluster --prometheus URL [options]",
        options=_options,
        run=cmd_cluster,
    ),
)
