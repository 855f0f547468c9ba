"""The ``gpuwatch`` command: live dashboard, run, record, replay, info, export, estimate.

Heavy modules (textual, numpy, the samplers) are imported inside the command that needs
them, so ``gpuwatch --help`` is quick and errors reach the user as one line.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

from . import __version__

if TYPE_CHECKING:
    from .live import LiveSources

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
    from .fmt import printable

    clear = "\r\x1b[K" if overwrite else ""
    try:
        line = f"{clear}gpuwatch: {printable(text)}" if text else clear
        print(line, end=end, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        # The terminal is gone (closed pipe, hung up): what gpuwatch has to say is lost,
        # what it records and the job it runs are not.
        pass


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and still exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see '{self.prog} --help')\n")


def _interval_ms(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of milliseconds: {text!r}")
    if not 10 <= value <= 60_000:
        raise argparse.ArgumentTypeError("the interval must be between 10 and 60000 ms")
    return value


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
        type=_interval_ms,
        default=100.0,
        metavar="MS",
        help="NVML sampling interval in ms (default 100, i.e. 10 Hz; at least 10, i.e. 100 Hz)",
    )
    p.add_argument(
        "--socket",
        metavar="PATH",
        help="annotation socket (default: $GPUWATCH_SOCKET or a per-user path)",
    )
    p.add_argument(
        "--prometheus",
        type=metrics_address,
        metavar="[HOST:]PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (HOST defaults to "
        "127.0.0.1; 0.0.0.0:PORT for every interface; port 0 picks a free one)",
    )


def configure_metrics(sources: LiveSources, args: argparse.Namespace) -> None:
    """Tell live sources to serve Prometheus metrics, from ``--prometheus``."""
    address = getattr(args, "prometheus", None)
    if address is not None:
        sources.serve_metrics(*address)


def add_dashboard_options(p: argparse.ArgumentParser) -> None:
    """Options shared by the live dashboard and ``gpuwatch run``."""
    add_source_options(p)
    p.add_argument(
        "--theme", metavar="NAME", help="colour theme (default: $GPUWATCH_THEME or gpuwatch-dark)"
    )
    from .store.cli import add_record_options

    add_record_options(p)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (subcommands register themselves here)."""
    parser = Parser(
        prog="gpuwatch",
        description="Where did my GPU memory go? Live timelines of nvidia-smi used memory "
        "against torch allocated, reserved and predicted memory, lined up with the "
        "training phases an instrumented script reports.",
        epilog="Run without a command for the live dashboard. "
        "See 'gpuwatch COMMAND --help' for each command.",
    )
    parser.add_argument("--version", action="version", version=f"gpuwatch {__version__}")
    add_dashboard_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    live = sub.add_parser("live", help="the live dashboard (the default command)")
    add_dashboard_options(live)
    live.set_defaults(func=cmd_live)
    run = sub.add_parser(
        "run",
        help="the dashboard plus a command, instrumented with no code change",
        description="Start the dashboard and COMMAND as a child process whose Python "
        "processes get automatic phases (forward, backward, optimizer.step, zero_grad, "
        "eval, data) once they import torch. Its output goes to a log shown in the "
        "dashboard's Log tab; its exit status becomes gpuwatch's.",
        usage="gpuwatch run [options] -- COMMAND [ARGS...]",
    )
    add_dashboard_options(run)
    run.add_argument(
        "--log",
        metavar="FILE",
        help="where the command's output goes (default: a file in gpuwatch's "
        "log directory, named in the Log tab)",
    )
    run.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    run.set_defaults(func=cmd_run)
    # estimate: predicted memory per phase before any run (gpuwatch/estimate_cli.py).
    from .estimate_cli import add_parser as add_estimate

    add_estimate(sub)
    parser.set_defaults(func=cmd_live)
    from .store.cli import register as register_store

    register_store(sub)
    _top_level_wins(parser, sub)
    return parser


def _top_level_wins(parser: argparse.ArgumentParser, sub: argparse._SubParsersAction) -> None:
    """Let ``gpuwatch --no-record live`` mean what it says.

    argparse applies a subcommand's defaults after the top-level options were parsed, so an
    option shared by both would silently fall back to its default. A subcommand's copy of a
    top-level option therefore sets nothing unless given; the top level holds the default.
    """
    shared = {a.dest for a in parser._actions if a.option_strings}
    for child in set(sub.choices.values()):
        for action in child._actions:
            if action.option_strings and action.dest in shared and action.dest != "help":
                action.default = argparse.SUPPRESS


def _theme_name(args: argparse.Namespace) -> str | None:
    import os

    return args.theme or os.environ.get("GPUWATCH_THEME") or None


def check_theme(name: str | None) -> None:
    """Fail early, with the list of themes, when ``--theme`` names none of them."""
    if name is None:
        return
    from .tui.theme import builtin_themes

    names = [t.name for t in builtin_themes()]
    if name not in names and name not in ("textual-dark", "textual-light"):
        raise CliError(f"unknown theme {name!r}; choose one of: {', '.join(names)}")


def cmd_live(args: argparse.Namespace) -> int:
    """The live dashboard of every GPU and the host."""
    from .live import LiveSources

    theme = _theme_name(args)
    check_theme(theme)
    from .store.cli import configure_recording

    sources = LiveSources(socket=args.socket, interval=args.interval / 1000)
    configure_recording(sources, args)
    configure_metrics(sources, args)
    sources.start()
    try:
        from .tui.app import GpuwatchApp

        app = GpuwatchApp(sources.session, theme_name=theme, subtitle=sources.describe)
        app.run()
    finally:
        sources.stop()
    report_recording(sources)
    return EXIT_OK


def report_recording(sources: LiveSources) -> None:
    """On quit, say where the session was recorded (nvitop users ask "where did it go?")."""
    from .store.cli import recording_report

    line = recording_report(sources)
    if line:
        say(line)


def command_after_dashes(words: Sequence[str]) -> list[str]:
    """The command given after ``--`` (argparse keeps the ``--`` in a REMAINDER)."""
    words = list(words or [])
    return words[1:] if words[:1] == ["--"] else words


def cmd_run(args: argparse.Namespace) -> int:
    """The dashboard plus a launched command; exits with the command's status."""
    import shlex

    from . import launch
    from .live import LiveSources
    from .store.cli import configure_recording

    command = command_after_dashes(args.command)
    if not command:
        raise CliError("gpuwatch run needs a command, e.g. gpuwatch run -- python train.py")
    theme = _theme_name(args)
    check_theme(theme)
    sources = LiveSources(socket=args.socket, interval=args.interval / 1000)
    configure_recording(sources, args)
    configure_metrics(sources, args)

    def terminated(signum: int, frame: object) -> None:
        # Until the dashboard takes these signals over: unwind, so the command is stopped.
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, terminated) for sig in (signal.SIGTERM, signal.SIGHUP)}
    sources.start()
    child = None
    try:
        try:
            child = launch.start(command, socket_path=sources.socket_path, log_path=args.log)
        except launch.LaunchError as exc:
            raise CliError(str(exc))  # not found, not executable: bad input
        from .tui.app import GpuwatchApp

        GpuwatchApp(sources.session, theme_name=theme, subtitle=sources.describe, child=child).run()
    finally:
        if child is not None and child.running:
            child.stop()  # INT, then TERM, then KILL to its process group
        sources.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert child is not None
    report_recording(sources)
    say(
        f"{shlex.join(command)}: {launch.describe_returncode(child.returncode)} "
        f"(output in {child.log_path})"
    )
    hint = launch.torch_hint(child)
    if hint:
        say(hint)
    status = child.exit_status
    return EXIT_ERROR if status is None else status


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpuwatch`` console script and ``python -m gpuwatch``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except CliError as exc:
        say(str(exc))
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `gpuwatch info FILE | head`: the reader left; say nothing more.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_ERROR


__all__ = ["CliError", "build_parser", "main"]
