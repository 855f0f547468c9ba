"""The recording commands: ``record``, ``replay``, ``info``, ``export``, and ``--record``.

Registered by :func:`gpuwatch.cli.build_parser`; this module imports only the standard
library at import time, so ``gpuwatch --help`` stays quick.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cli import (
    EXIT_ERROR,
    EXIT_OK,
    CliError,
    _theme_name,
    add_source_options,
    check_theme,
    say,
)

if TYPE_CHECKING:
    from ..live import LiveSources
    from ..session import Session
    from .multi import Opened
    from .recording import Recording

SUFFIX = ".gpuwatch"  # the same as _schema.SUFFIX, which this module must not import
SESSIONS_MAX_ENV = "GPUWATCH_SESSIONS_MAX"  # sessions.SESSIONS_MAX_ENV


# --------------------------------------------------------------------------- --record


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


NO_CAP = -1
"""``--sessions-max none``: told not to cap (None means "not given": the env var decides)."""


def _size(text: str) -> int:
    from .sessions import parse_size

    try:
        size = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))
    return NO_CAP if size is None else size


def default_recording_path(now: datetime.datetime | None = None) -> Path:
    """``<user data dir>/sessions/<start time>-<host>.gpuwatch`` (platformdirs convention)."""
    from .sessions import default_recording_path as path

    return path(now)


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
    from .sessions import cap_from_env, prune

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
                f"sessions directory over {_fmt_size(cap)}: removed the {len(pruned.removed)} "
                f"oldest recording(s), {_fmt_size(pruned.freed)} (--sessions-max)"
            )
    sources.record_to(target, optional=True)


def _fmt_size(n: int) -> str:
    from ..fmt import fmt_bytes

    return fmt_bytes(n)


def recording_report(sources: LiveSources) -> str | None:
    """The line printed on quit: where the session was recorded and how to replay it."""
    recorder = sources.recorder
    if recorder is None or sources.record_path is None:
        return None
    if recorder.error is not None:
        return recorder.error
    path = sources.record_path
    try:
        size = f" ({_fmt_size(path.stat().st_size)})"
    except OSError:
        size = ""
    return f"recorded to {path}{size}; replay it: gpuwatch replay {shlex.quote(str(path))}"


# --------------------------------------------------------------------------- helpers


def _open(path: str) -> Recording:
    from .recording import RecordingError, open_recording

    try:
        return open_recording(path)
    except RecordingError as exc:
        raise CliError(str(exc))


def _load(paths: list[str], align: str = "wall") -> Opened:
    """Open and load one recording, or several merged; a bad file is one line, exit 2."""
    from .multi import load_many
    from .recording import RecordingError

    try:
        return load_many(paths, align=align, progress=_loading if len(paths) > 1 else None)
    except RecordingError as exc:
        raise CliError(str(exc))


def _loading(i: int, n: int, path: Path) -> None:
    """Progress while several files load (each is read whole before they can be merged)."""
    if sys.stderr.isatty():
        size = path.stat().st_size if path.exists() else 0
        print(
            f"\r\x1b[Kgpuwatch: loading {i + 1}/{n} {path.name} ({size / 1e6:.1f} MB)",
            end="\n" if i + 1 == n else "",
            file=sys.stderr,
            flush=True,
        )


_FILES_HELP = "a recording; several are merged into one session (see --align)"


def _add_align(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--align",
        choices=("wall", "start"),
        default="wall",
        help="with several files: line them up by wall clock (default; hosts of one job) "
        "or by their starts (runs made at different times)",
    )


def _speed(text: str) -> float:
    try:
        value = float(text.lower().lstrip("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a speed: {text!r}")
    if not 0.25 <= value <= 64:
        raise argparse.ArgumentTypeError("the speed must be between 0.25 and 64")
    return value


def _duration(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}")
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError("the duration must be a positive number of seconds")
    return value


# --------------------------------------------------------------------------- commands


def register(sub: Any) -> None:
    """Add ``record``, ``replay``, ``info`` and ``export`` to the subcommand parsers."""
    p = sub.add_parser(
        "record",
        help="record a session to a file, without a terminal (batch jobs)",
        description="Record NVML, host and annotation data to FILE until SIGINT/SIGTERM "
        "or --duration. Scripts send to the same socket as for the dashboard. With "
        "'-- COMMAND', run COMMAND instrumented (as 'gpuwatch run' does) and record until it "
        "exits; SIGINT/SIGTERM go to the command, and its exit status becomes gpuwatch's.",
        usage="gpuwatch record --out FILE [options] [-- COMMAND [ARGS...]]",
    )
    p.add_argument("--out", required=True, metavar="FILE", help="the recording to create")
    p.add_argument("--duration", type=_duration, metavar="SECONDS", help="stop after this")
    add_source_options(p)
    p.add_argument("--label", default="", help="a description stored in the file")
    p.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    p.add_argument(
        "--log", metavar="FILE", help="with a COMMAND: write its output to FILE (default: ours)"
    )
    p.add_argument(
        "command", nargs=argparse.REMAINDER, help="a command to run instrumented, after --"
    )
    p.set_defaults(func=cmd_record)

    p = sub.add_parser(
        "replay",
        help="play a recording back in the dashboard",
        description="Replay a recording (also one still being written: it follows the tail). "
        "Several files (the hosts of one job, or several runs) replay as one session, lined "
        "up by each file's wall clock, their devices named by host.",
    )
    p.add_argument("file", metavar="FILE", nargs="+", help=_FILES_HELP)
    _add_align(p)
    p.add_argument("--theme", metavar="NAME", help="colour theme")
    p.add_argument(
        "--speed", type=_speed, default=1.0, metavar="X", help="playback speed, 0.25 to 64"
    )
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser(
        "info",
        help="summarise a recording",
        description="Summarise a recording, or several merged as 'replay' shows them.",
    )
    p.add_argument("file", metavar="FILE", nargs="+", help=_FILES_HELP)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _add_align(p)
    p.set_defaults(func=cmd_info)

    from .export import FORMATS, TABLES

    p = sub.add_parser(
        "export",
        help="write a recording's tables as CSV or JSON lines",
        description="Write flat tables (see docs/recording.md) for pandas / polars. Several "
        "files are merged as 'replay' shows them (device keys start with each file's host).",
    )
    p.add_argument("file", metavar="FILE", nargs="+", help=_FILES_HELP)
    _add_align(p)
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="csv",
        help="csv (a header row, also for an empty table) or jsonl (one JSON object a "
        "row: an empty table is an empty file); default csv",
    )
    p.add_argument("--table", choices=sorted(TABLES), help="only this table")
    p.add_argument(
        "--out",
        metavar="DIR",
        help="directory for <table>.<format> files (default: STEM-export in the current "
        "directory, STEM being the first FILE's name without its suffix: run.gpuwatch -> "
        "./run-export/; with --table and no --out, the table goes to stdout)",
    )
    p.add_argument("--force", action="store_true", help="overwrite table files that exist in DIR")
    p.set_defaults(func=cmd_export)


def _auto_label(session: Session) -> str:
    gpus = [d for d in session.devices.values() if d.kind == "gpu"]
    what = f"{len(gpus)}-GPU recording" if gpus else "CPU recording (no GPU seen)"
    argv = next((p.hello.get("argv") for p in session.processes.values() if p.hello), None)
    return f"{what} on {socket.gethostname()}" + (f" of {' '.join(argv)[:120]}" if argv else "")


def cmd_record(args: argparse.Namespace) -> int:
    """Record until SIGINT/SIGTERM or ``--duration``, with a status line on stderr."""
    from .. import launch
    from ..cli import command_after_dashes, configure_metrics
    from ..live import LiveSources

    out = Path(args.out)
    if out.exists() and not args.force:
        raise CliError(f"{out} already exists (use --force to overwrite it)")
    command = command_after_dashes(getattr(args, "command", None) or [])
    sources = LiveSources(socket=args.socket, interval=args.interval / 1000)
    sources.record_to(out, label=args.label, overwrite=args.force)
    configure_metrics(sources, args)
    stop = threading.Event()
    child: launch.Child | None = None
    forward: launch.SignalForwarder | None = None

    def on_signal(signum: int, frame: Any) -> None:
        if forward is None or not forward.child.running:
            stop.set()
            return
        # The job decides when to stop; recording goes on until it has.
        forward(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    # A terminal that hangs up stops neither the recording nor the job (a batch command).
    # A handler, not SIG_IGN: an ignored signal would stay ignored in the job after exec.
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, _hung_up)
    try:
        sources.start()
        recorder = sources.recorder
        assert recorder is not None
        tty = sys.stderr.isatty()
        started = time.monotonic()
        say(f"recording to {out} (socket {sources.socket_path}); Ctrl-C or SIGTERM stops")
        if sources.metrics is not None:
            say(f"metrics on {sources.metrics.url}")
        if command:
            try:
                child = launch.start(
                    command, socket_path=sources.socket_path, log_path=args.log or "-"
                )
                forward = launch.SignalForwarder(child)
            except launch.LaunchError as exc:
                raise CliError(str(exc))  # not found, not executable: bad input
        deadline = None if args.duration is None else started + args.duration
        reported = False
        while not stop.is_set():
            if child is not None and not child.running:
                break
            if recorder.error is not None and not reported:
                # The recording is lost, the job is not: it runs on to its own end.
                reported = True
                if tty:
                    say("", end="", overwrite=True)
                say(recorder.error + ("; the command runs on" if child is not None else ""))
                if child is None:
                    break
            wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if wait <= 0 or stop.wait(wait):
                break
            if tty and recorder.error is None:
                say(_status(sources, started), end="", overwrite=True)
        if not args.label:
            recorder.writer.set_label(_auto_label(sources.session))
    finally:
        if child is not None and child.running:
            child.stop()
        sources.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if tty:
        say("", end="", overwrite=True)
    if recorder.error is None:
        say(_status(sources, started))
    elif not reported:
        say(recorder.error)
    if child is not None:
        say(f"{shlex.join(command)}: {launch.describe_returncode(child.returncode)}")
        hint = launch.torch_hint(child)  # with --log; else the child's own line said it
        if hint:
            say(hint)
        return EXIT_ERROR if child.exit_status is None else child.exit_status
    return EXIT_ERROR if recorder.error is not None else EXIT_OK


def _hung_up(signum: int, frame: Any) -> None:
    """SIGHUP under ``record``: the terminal went away; recording and job go on."""


def _status(sources: LiveSources, started: float) -> str:
    s = sources.session
    phases = sum(len(p.phases) for p in s.processes.values())
    recorder = sources.recorder
    rows = recorder.rows_written if recorder is not None else 0
    size = recorder.path.stat().st_size if recorder is not None and recorder.path.exists() else 0
    return (
        f"recorded {time.monotonic() - started:.0f} s · {len(s.processes)} processes · "
        f"{phases} phases · {rows} rows · {size / 1e6:.1f} MB in {sources.record_path}"
    )


def cmd_replay(args: argparse.Namespace) -> int:
    """Open the dashboard on a recording (or several merged), playing from its start."""
    from .player import Player, open_replay
    from .recording import RecordingError

    theme = _theme_name(args)
    check_theme(theme)
    files: list[str] = args.file
    if len(files) == 1:
        try:
            player = open_replay(files[0], speed=args.speed)
        except RecordingError as exc:
            raise CliError(str(exc))
        label = player.loader.recording.label if player.loader is not None else ""
        subtitle = f"replay {Path(files[0]).name}" + (f" · {label}" if label else "")
    else:
        opened = _load(files, args.align)
        opened.close()  # all loaded: the files are not needed any more
        player = Player(opened.session, speed=args.speed)
        names = ", ".join(p.origin for p in opened.parts)
        subtitle = f"replay of {len(files)} recordings merged ({args.align} clock): {names}"
    try:
        from ..tui.replay import ReplayApp

        ReplayApp(player, theme_name=theme, subtitle=subtitle).run()
    finally:
        player.close()
    return EXIT_OK


def cmd_info(args: argparse.Namespace) -> int:
    """Print what a recording holds."""
    from .info import format_summary, summarize_opened

    opened = _load(args.file, args.align)
    try:
        info = summarize_opened(opened)
    finally:
        opened.close()
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(format_summary(info))  # every line made printable there
    return EXIT_OK


def export_dir(first: str) -> Path:
    """Where ``export`` writes without ``--out``: ``./<stem>-export`` (run.gpuwatch: run-export)."""
    return Path(Path(first).stem + "-export")


def cmd_export(args: argparse.Namespace) -> int:
    """Write the recording's tables as CSV or JSON lines."""
    from .export import TABLES, table, write

    names = [args.table] if args.table else list(TABLES)
    out = Path(args.out) if args.out else export_dir(args.file[0])
    to_stdout = bool(args.table and not args.out)
    if not to_stdout and not args.force:
        # Refuse before loading anything: a second export must not eat the first's files.
        taken = [out / f"{name}.{args.format}" for name in names]
        existing = [p for p in taken if p.exists()]
        if existing:
            if len(existing) == 1:
                raise CliError(f"{existing[0]} already exists (use --force to overwrite it)")
            raise CliError(
                f"{existing[0]} and {len(existing) - 1} more files already exist in {out} "
                "(use --force to overwrite them)"
            )
    opened = _load(args.file, args.align)
    empty: list[str] = []
    try:
        if to_stdout:
            write(table(opened, args.table), args.format, sys.stdout)
            return EXIT_OK
        try:
            out.mkdir(parents=True, exist_ok=True)
            total = 0
            for name in names:
                with open(out / f"{name}.{args.format}", "w", newline="") as f:
                    rows = write(table(opened, name), args.format, f)
                total += rows
                if rows == 0:
                    empty.append(name)
        except OSError as exc:
            raise CliError(f"cannot write to {out}: {exc.strerror or exc}")  # a bad --out
    finally:
        opened.close()
    note = ""
    if empty:
        what = "empty files" if args.format == "jsonl" else "a header row only"
        note = f" ({', '.join(empty)}: no rows, {what})"
    say(f"wrote {len(names)} tables, {total} rows, to {out}{os.sep}{note}")
    return EXIT_OK
