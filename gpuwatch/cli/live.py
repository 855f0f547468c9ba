"""``gpuwatch`` (the live dashboard) and ``gpuwatch run``, and where they record.

Every live session records by default, to a new file in the sessions directory (capped,
oldest first: ``--sessions-max``); ``--record PATH`` names the file, ``--no-record`` turns
it off. Quitting says where the recording went.
"""

from __future__ import annotations

import argparse
import shlex
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from ._child import handling, launched, leave_if_requested, unwind_later, unwind_requested
from ._common import (
    EXIT_ERROR,
    EXIT_OK,
    CliError,
    Command,
    add_source_options,
    add_theme,
    checked_theme,
    command_after_dashes,
    configure_metrics,
    need_terminal,
    say,
)

if TYPE_CHECKING:
    from ..live_sources import LiveSources
    from ..tui.thresholds import Thresholds
    from ..tui.transport import Transport

SUFFIX = ".gpuwatch"  # the same as store._schema.SUFFIX, which --help must not import
SESSIONS_MAX_ENV = "GPUWATCH_SESSIONS_MAX"  # store.sessions.SESSIONS_MAX_ENV

NO_CAP = -1
"""``--sessions-max none``: told not to cap (None means "not given": the env var decides)."""


# --------------------------------------------------------------------------- options


def add_dashboard_options(p: argparse.ArgumentParser) -> None:
    """Options shared by the live dashboard and ``gpuwatch run``."""
    add_source_options(p)
    add_theme(p)
    add_record_options(p)
    from ..tui.thresholds import add_options  # no textual: --help stays light

    add_options(p)


_VIEW_SWITCHES = (
    (
        ("-1", "--once"),
        "print one table of every GPU and its processes on stdout and exit (torch's "
        "figures and phases from the running gpuwatch, if any; else NVML alone)",
    ),
    (("--json",), "with --once: one JSON document"),
    (
        ("--readonly",),
        "send no signal to any process from this dashboard (the Processes tab's keys)",
    ),
)


def live_dashboard(p: argparse.ArgumentParser) -> None:
    """Make ``p`` the live dashboard's parser: its options, and :func:`cmd_live` to run
    (``gpuwatch`` without a command and ``gpuwatch live`` are the same command)."""
    _live_options(p)
    p.set_defaults(func=cmd_live)


def _live_options(p: argparse.ArgumentParser) -> None:
    """The live dashboard's options: the dashboard's, and its views'."""
    add_dashboard_options(p)
    add_view_options(p)


def add_view_options(p: argparse.ArgumentParser) -> None:
    """``--once`` / ``--json`` / ``--readonly``: the live dashboard's (not ``run``'s)."""
    for flags, text in _VIEW_SWITCHES:
        p.add_argument(*flags, action="store_true", help=text)


def add_record_options(p: argparse.ArgumentParser) -> None:
    """``--record PATH`` / ``--no-record`` / ``--sessions-max`` for the live dashboard and run."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--record",
        metavar="PATH",
        help="record the session to PATH (default: a new file in the sessions directory, "
        "~/.local/share/gpuwatch/sessions on Linux)",
    )
    g.add_argument("--no-record", action="store_true", help="do not record this session")
    p.add_argument(
        "--sessions-max",
        metavar="SIZE",
        type=_size,
        help="cap on the sessions directory: before a session records there, the oldest "
        "finished recordings go until the rest fit (e.g. 500M, 2G, none; default "
        f"${SESSIONS_MAX_ENV} or 1G)",
    )


def _size(text: str) -> int:
    from ..store.sessions import parse_cap

    try:
        size = parse_cap(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))
    return NO_CAP if size is None else size


def _run_options(p: argparse.ArgumentParser) -> None:
    """The dashboard's options, where the command's output goes, and the command."""
    add_dashboard_options(p)
    p.add_argument(
        "--log",
        metavar="FILE",
        help="where the command's output goes (default: a file in gpuwatch's "
        "log directory, named in the Log tab)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")


# --------------------------------------------------------------------------- recording


def configure_recording(sources: LiveSources, args: argparse.Namespace) -> None:
    """Tell live sources where to record, from ``--record`` / ``--no-record``.

    An explicit ``--record PATH`` that cannot be written is an error; the default location
    failing only leaves a note in the dashboard. Recording to the default location first
    trims the sessions directory to its cap (``--sessions-max``).

    Raises:
        CliError: ``$GPUWATCH_SESSIONS_MAX`` is not a size.
    """
    if getattr(args, "no_record", False):
        return
    path = getattr(args, "record", None)
    if path:
        sources.record_to(path)
        return
    from ..fmt import fmt_bytes
    from ..store.sessions import cap_from_env, default_recording_path, prune

    cap: int | None = getattr(args, "sessions_max", None)
    if cap is None:
        try:
            cap = cap_from_env()
        except ValueError as exc:
            raise CliError(str(exc))
    elif cap == NO_CAP:
        cap = None
    target = default_recording_path()
    # Two sessions started in the same second on one host: do not collide.
    n = 1
    while target.exists():
        n += 1
        target = target.with_name(f"{target.stem}-{n}{SUFFIX}")
    if cap is not None:
        pruned = prune(target.parent, cap, keep=target)
        if pruned.removed:
            sources.session.note(
                f"sessions directory over {fmt_bytes(cap)}: removed the {len(pruned.removed)} "
                f"oldest recording(s), {fmt_bytes(pruned.freed)} (--sessions-max)"
            )
    sources.record_to(target, optional=True)


def recording_report(sources: LiveSources) -> str | None:
    """The line printed on quit: where the session was recorded and how to replay it."""
    from ..fmt import fmt_bytes

    recorder = sources.recorder
    if recorder is None or sources.record_path is None:
        return None
    if recorder.error is not None:
        return recorder.error
    path: Path = sources.record_path
    try:
        size = f" ({fmt_bytes(path.stat().st_size)})"
    except OSError:
        size = ""
    return f"recorded to {path}{size}; replay it: gpuwatch replay {shlex.quote(str(path))}"


def _report_recording(sources: LiveSources) -> None:
    """On quit, say where the session was recorded (nvitop users ask "where did it go?"),
    after what came too late to be recorded, if anything did."""
    if sources.receiver.cut_short:
        say(sources.receiver.cut_short)
    if sources.view_ended:
        say(sources.view_ended)
    feed = sources.feed
    if feed is not None and not sources.view_ended:
        its = f"; its recording: {feed.recording}" if feed.recording else ""
        say(f"viewed the gpuwatch on {sources.socket_path} (pid {feed.owner_pid}){its}")
    line = recording_report(sources)
    if line:
        say(line)


def _sources(args: argparse.Namespace) -> LiveSources:
    from ..live_sources import LiveSources

    sources = LiveSources(socket=args.socket, interval=args.interval / 1000)
    configure_recording(sources, args)
    configure_metrics(sources, args)
    return sources


def start_sources(sources: LiveSources) -> None:
    """Start the live sources; their refusal (a taken socket, a port in use) is one line.

    Raises:
        CliError: The sources could not start.
    """
    from ..live_sources import SourcesError

    try:
        sources.start()
    except SourcesError as exc:
        raise CliError(str(exc))


def _transport(sources: LiveSources) -> Transport:
    """What drives a live dashboard: the session's clock, the recording in the status bar."""
    from ..tui.transport import Transport

    return Transport(sources.session.now, lambda: sources.describe(warning=False), sources.warning)


def user_keymap() -> dict[str, str]:
    """The user's keymap (``keymap.toml``, see :mod:`gpuwatch.tui.keymap`).

    Raises:
        CliError: The file cannot be used (one line: which file, and why).
    """
    from ..tui.keymap import KeymapError, load_keymap

    try:
        return load_keymap()
    except KeymapError as exc:
        raise CliError(str(exc)) from None


def user_thresholds(args: argparse.Namespace) -> Thresholds:
    """``--mem-util-thresh`` / ``--gpu-util-thresh`` over ``config.toml``'s thresholds.

    Raises:
        CliError: The config file or a flag cannot be used (one line: why).
    """
    from ..tui.thresholds import ConfigError, from_args

    try:
        return from_args(args)
    except ConfigError as exc:
        raise CliError(str(exc)) from None


# --------------------------------------------------------------------------- commands


def cmd_live(args: argparse.Namespace) -> int:
    """The live dashboard of every GPU and the host (``--once``: one table of it)."""
    if getattr(args, "once", False) or getattr(args, "json", False):
        from .once import cmd_once

        return cmd_once(args)
    theme = checked_theme(args)
    keymap = user_keymap()
    thresholds = user_thresholds(args)
    need_terminal("gpuwatch record --out FILE (and gpuwatch info FILE to read it)")
    sources = _sources(args)
    start_sources(sources)
    try:
        from ..tui.app import GpuwatchApp

        app = GpuwatchApp(
            sources.session,
            theme_name=theme,
            transport=_transport(sources),
            keymap=keymap,
            thresholds=thresholds,
        )
        app.readonly = bool(getattr(args, "readonly", False))
        app.run()
    finally:
        sources.stop()
    _report_recording(sources)
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    """The dashboard plus a launched command; exits with the command's status."""
    command = command_after_dashes(args.command)
    if not command:
        raise CliError("gpuwatch run needs a command, e.g. gpuwatch run -- python train.py")
    theme = checked_theme(args)
    keymap = user_keymap()
    thresholds = user_thresholds(args)
    need_terminal("gpuwatch record --out FILE -- COMMAND (and gpuwatch info FILE to read it)")
    sources = _sources(args)
    # Until the dashboard takes SIGTERM and SIGHUP over, they are noted and unwind gpuwatch
    # at the next step, which stops the command on its way out (the dashboard quits on
    # them, with the same effect).
    with handling({signal.SIGTERM: unwind_later, signal.SIGHUP: unwind_later}) as again:
        start_sources(sources)
        try:
            leave_if_requested()  # before the command starts: it never does
            with launched(command, socket_path=sources.socket_path, log_path=args.log) as child:
                from ..tui.app import GpuwatchApp

                leave_if_requested()
                GpuwatchApp(
                    sources.session,
                    theme_name=theme,
                    transport=_transport(sources),
                    keymap=keymap,
                    thresholds=thresholds,
                    child=child,
                    quit_if=lambda: unwind_requested() is not None,
                ).run()
                again()  # while the command is stopped, a signal must not end gpuwatch
        finally:
            sources.stop()
    _report_recording(sources)
    from ..launch import describe_returncode

    ended = describe_returncode(child.returncode)
    say(f"{shlex.join(command)}: {ended} (output in {child.log_path})")
    hint = child.torch_hint()
    if hint:
        say(hint)
    status = child.exit_status
    return EXIT_ERROR if status is None else status


COMMANDS = (
    Command(
        "live",
        help="the live dashboard (the default command)",
        options=_live_options,
        run=cmd_live,
    ),
    Command(
        "run",
        help="the dashboard plus a command, instrumented with no code change",
        description="Start the dashboard and COMMAND as a child process whose Python "
        "processes get automatic phases (forward, backward, optimizer.step, zero_grad, "
        "eval, data) once they import torch. Its output goes to a log shown in the "
        "dashboard's Log tab; its exit status becomes gpuwatch's.",
        usage="gpuwatch run [options] -- COMMAND [ARGS...]",
        options=_run_options,
        run=cmd_run,
    ),
)
