"""What every command shares: exit statuses, the one-line error, output, option types, and
how a command's parser is made from what it declares (:class:`Command`).

Standard library only at import time: ``gpuwatch --help`` loads no numpy, textual or
sqlite3.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple, NoReturn, TypeVar

if TYPE_CHECKING:
    from ..live_sources import LiveSources

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


class CliError(Exception):
    """A user-facing failure: printed as one line, exit status ``code``."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def say(text: str, *, end: str = "\n", overwrite: bool = False) -> None:
    """One line from gpuwatch on stderr, made printable (paths and names may be hostile).

    Args:
        text: The line, without the ``gpuwatch: `` prefix.
        end: What ends it (``""`` for a status line rewritten in place).
        overwrite: Clear the terminal line first (a status line on a terminal).
    """
    from ..fmt import printable

    clear = "\r\x1b[K" if overwrite else ""
    try:
        line = f"{clear}gpuwatch: {printable(text)}" if text else clear
        print(line, end=end, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        # The terminal is gone (closed pipe, hung up): what gpuwatch has to say is lost,
        # what it records and the job it runs are not.
        pass


def isatty(stream: object) -> bool:
    """Whether ``stream`` is a terminal (False for a closed or replaced one)."""
    try:
        # Any object may stand in for a stream: one without isatty() is not a terminal.
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return False


def need_terminal(instead: str) -> None:
    """Refuse a full-screen command where there is no terminal to draw it on.

    Without one (``| head``, ``</dev/null >out.txt``, cron) the dashboard would never
    return, spin a core and write escape codes into a file; on ``TERM=dumb`` it cannot
    draw at all. Say so at once, with what works there instead.

    Args:
        instead: What to use instead, e.g. ``"gpuwatch info FILE"``.

    Raises:
        CliError: No terminal on stdin and stdout, or ``TERM=dumb``.
    """
    if os.environ.get("TEXTUAL_DRIVER"):
        return  # Textual draws through the driver named (gpuwatch serve's web driver)
    if os.environ.get("TERM") == "dumb":
        raise CliError(f"TERM=dumb cannot show the full-screen dashboard; use {instead}")
    if not (isatty(sys.stdin) and isatty(sys.stdout)):
        raise CliError(
            f"the dashboard needs a terminal on stdin and stdout; without one use {instead}"
        )


class Progress:
    """A status line on stderr while long work runs (a week's recording takes a minute).

    Shown only on a terminal, and only once the work has taken ``delay`` seconds; it is
    rewritten in place every ``every`` seconds and cleared when the work ends. What it says
    comes from :attr:`status`: a string, or a callable asked each time.

    Args:
        delay: Seconds before the line first appears.
        every: Seconds between rewrites.
        enabled: False: never shown (the work writes to the same terminal itself).
    """

    def __init__(self, delay: float = 1.0, every: float = 0.5, enabled: bool = True) -> None:
        self.status: str | Callable[[], str] = ""
        self._delay, self._every, self._enabled = delay, every, enabled
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown = False

    def __enter__(self) -> Progress:
        if self._enabled and isatty(sys.stderr):
            self._start = time.monotonic()
            self._thread = threading.Thread(target=self._run, name="gpuwatch-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._shown:
            say("", end="", overwrite=True)

    def _run(self) -> None:
        wait = self._delay
        while not self._stop.wait(wait):
            wait = self._every
            try:
                text = self.status() if callable(self.status) else self.status
            except Exception:  # a status that cannot be said is not worth stopping for
                continue
            if text:
                say(f"{text} · {time.monotonic() - self._start:.0f} s", end="", overwrite=True)
                self._shown = True


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and still exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see '{self.prog} --help')\n")


class Command(NamedTuple):
    """A subcommand as its module declares it; :func:`add_commands` makes its parser.

    Attributes:
        name: The word after ``gpuwatch``.
        help: Its line in ``gpuwatch --help``.
        options: Adds its options and arguments to its parser.
        run: Runs it on the parsed arguments; returns the exit status.
        description: What its own ``--help`` says first (None: nothing).
        usage: Its usage line, where argparse's own would list every option (None: argparse's).
    """

    name: str
    help: str
    options: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str | None = None
    usage: str | None = None


def add_commands(sub: argparse._SubParsersAction, commands: Iterable[Command]) -> None:
    """Add a parser to ``sub`` for each of ``commands``, in their order (``--help``'s)."""
    for command in commands:
        p = sub.add_parser(
            command.name, help=command.help, description=command.description, usage=command.usage
        )
        command.options(p)
        p.set_defaults(func=command.run)


N = TypeVar("N", int, float)


def bounded(
    parse: Callable[[str], N], lo: N, hi: N, *, noun: str, name: str, unit: str = ""
) -> Callable[[str], N]:
    """An argparse ``type`` for a number in ``[lo, hi]``: ``parse`` reads it, and a bad
    value says ``not NOUN: 'TEXT'`` or ``the NAME must be between LO and HI UNIT``."""

    def check(text: str) -> N:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {noun}: {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"the {name} must be between {lo:g} and {hi:g}{unit}")
        return value

    check.__name__ = name
    return check


interval_ms = bounded(
    float, 10.0, 60_000.0, noun="a number of milliseconds", name="interval", unit=" ms"
)
"""``--interval MS``: a number of milliseconds between 10 and 60000."""


DEFAULT_METRICS_HOST = "127.0.0.1"


def metrics_address(text: str) -> tuple[str, int]:
    """``--prometheus [HOST:]PORT``: ``9400``, ``0.0.0.0:9400``, ``[::1]:9400``.

    Only this machine can scrape unless a host is given: the port alone binds loopback.
    Port 0 picks a free port.

    Raises:
        argparse.ArgumentTypeError: Not a port, or an IPv6 address without brackets.
    """
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host = DEFAULT_METRICS_HOST
    elif text.startswith("[") and not host.endswith("]"):
        raise argparse.ArgumentTypeError(f"expected [IPv6 ADDRESS]:PORT, got {text!r}")
    elif host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        import ipaddress

        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an IPv6 address: [{host}]")
    elif ":" in host:
        raise argparse.ArgumentTypeError(
            f"put an IPv6 address in brackets, e.g. [::1]:9400 (got {text!r})"
        )
    elif not host:
        raise argparse.ArgumentTypeError(f"no host before ':' in {text!r} (e.g. 0.0.0.0:9400)")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"not a port (0 to 65535): {port!r}")
    return host, int(port)


def add_source_options(p: argparse.ArgumentParser) -> None:
    """``--interval``, ``--socket`` and ``--prometheus``: how the live sources run."""
    p.add_argument(
        "--interval",
        type=interval_ms,
        default=100.0,
        metavar="MS",
        help="NVML sampling interval in ms (default 100, i.e. 10 Hz; at least 10, i.e. 100 Hz)",
    )
    add_socket(p)
    p.add_argument(
        "--prometheus",
        type=metrics_address,
        metavar="[HOST:]PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (HOST defaults to "
        "127.0.0.1; 0.0.0.0:PORT for every interface; port 0 picks a free one)",
    )


def add_socket(p: argparse.ArgumentParser, what: str = "annotation socket") -> None:
    """``--socket PATH``, the annotation socket (protocol.socket_path resolves the default);
    ``what``: what it is to the command."""
    p.add_argument(
        "--socket",
        metavar="PATH",
        help=f"{what} (default: $GPUWATCH_SOCKET or a per-user path)",
    )


def add_align(p: argparse.ArgumentParser) -> None:
    """``--align``: how the recordings of a command that merges several line up."""
    p.add_argument(
        "--align",
        choices=("wall", "start"),
        default="wall",
        help="with several files: line them up by wall clock (default; hosts of one job) "
        "or by their starts (runs made at different times)",
    )


def configure_metrics(sources: LiveSources, args: argparse.Namespace) -> None:
    """Tell live sources to serve Prometheus metrics, from ``--prometheus``."""
    address = getattr(args, "prometheus", None)
    if address is not None:
        sources.serve_metrics(*address)


def theme_name(args: argparse.Namespace) -> str | None:
    """The theme asked for: ``--theme``, else ``$GPUWATCH_THEME``, else None (the default)."""
    return getattr(args, "theme", None) or os.environ.get("GPUWATCH_THEME") or None


def add_theme(p: argparse.ArgumentParser, whose: str = "") -> None:
    """``--theme NAME``, read by :func:`theme_name`; ``whose``: what it colours."""
    p.add_argument(
        "--theme",
        metavar="NAME",
        help=f"colour theme{whose} (default: $GPUWATCH_THEME or gpuwatch-dark)",
    )


def checked_theme(args: argparse.Namespace) -> str | None:
    """:func:`theme_name`, refused by :func:`check_theme` when it names no theme."""
    name = theme_name(args)
    check_theme(name)
    return name


def check_theme(name: str | None) -> None:
    """Fail early, with the list of themes, when ``--theme`` names none of them."""
    if name is None:
        return
    from ..tui.theme import builtin_themes

    names = [t.name for t in builtin_themes()]
    if name not in names and name not in ("textual-dark", "textual-light"):
        raise CliError(f"unknown theme {name!r}; choose one of: {', '.join(names)}")


def command_after_dashes(words: Sequence[str]) -> list[str]:
    """The command given after ``--`` (argparse keeps the ``--`` in a REMAINDER)."""
    words = list(words or [])
    return words[1:] if words[:1] == ["--"] else words


def seconds(text: str) -> float:
    """``--duration SECONDS``: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}")
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError("the duration must be a positive number of seconds")
    return value
