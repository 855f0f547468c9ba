"""``gpuwatch record``: a session to a file, without a terminal (batch jobs).

With ``-- COMMAND`` the command runs instrumented, as under ``gpuwatch run``, and recording
lasts until it exits: SIGINT and SIGTERM go to the job (it decides when to stop), a
terminal that hangs up stops neither, and a recording that fails (a full disk) is said in
one line while the job runs on to its own end. The job's exit status becomes gpuwatch's.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._child import Handler, handling, hung_up, launched
from ._common import (
    EXIT_ERROR,
    EXIT_OK,
    CliError,
    Command,
    add_source_options,
    command_after_dashes,
    configure_metrics,
    say,
    seconds,
)

if TYPE_CHECKING:
    from ..launch import LaunchedCommand, SignalForwarder
    from ..live_sources import LiveSources
    from ..session import Session


KILLS = ("none", "sigint", "sigterm")
"""``--kill``: what the end of ``--duration`` does to the command."""
KILL_GRACE = 10.0
"""Seconds the command has to end after ``--kill``'s signal before SIGKILL."""
CHILD_POLL = 0.1
"""Seconds between looks at whether the command has ended: its end ends the recording, and
``gpuwatch record -- CMD`` should follow it promptly (a sweep's scripts run one by one)."""
STATUS_EVERY = 1.0
"""Seconds between status lines on a terminal."""


def _options(p: argparse.ArgumentParser) -> None:
    """The file, when to stop, the live sources, and the command to run."""
    p.add_argument("--out", required=True, metavar="FILE", help="the recording to create")
    p.add_argument(
        "--duration",
        type=seconds,
        metavar="SECONDS",
        help="stop recording after this; with a COMMAND, --kill says what happens to it",
    )
    p.add_argument(
        "--kill",
        choices=KILLS,
        help="with --duration and a COMMAND, what the end of the duration does to the "
        "command's process group: sigterm (the default; SIGKILL 10 s later if it still "
        "runs), sigint (as Ctrl-C: Python prints a KeyboardInterrupt traceback), or none "
        "(the recording ends, the command runs on and gpuwatch waits for it; its exit status "
        "becomes gpuwatch's). A command stopped by sigterm or sigint counts as success: "
        "gpuwatch exits 0",
    )
    add_source_options(p)
    p.add_argument("--label", default="", help="a description stored in the file")
    p.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    p.add_argument(
        "--log", metavar="FILE", help="with a COMMAND: write its output to FILE (default: ours)"
    )
    p.add_argument(
        "command", nargs=argparse.REMAINDER, help="a command to run instrumented, after --"
    )


class _Job:
    """What ``gpuwatch record`` waits on: its signals, and the command it started (if any).

    SIGINT and SIGTERM stop the recording, or, while the command runs, go to it (the job
    decides when to stop; recording goes on until it has).
    """

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.child: LaunchedCommand | None = None
        self.forward: SignalForwarder | None = None
        self.stopped = False  # the command stopped by gpuwatch at the end of --duration

    def on_signal(self, signum: int, frame: Any) -> None:
        if self.forward is None or not self.forward.child.running:
            self.stop.set()
            return
        self.forward(signum)

    def handlers(self) -> dict[int, Handler]:
        return {
            signal.SIGINT: self.on_signal,
            signal.SIGTERM: self.on_signal,
            signal.SIGHUP: hung_up,
        }


def cmd_record(args: argparse.Namespace) -> int:
    """Record until SIGINT/SIGTERM or ``--duration``, with a status line on stderr.

    Beside a running gpuwatch (a dashboard), this one records through it: it attaches as
    a view of its session (see :mod:`gpuwatch.sources.views`) and takes over when it quits.
    """
    from ..live_sources import LiveSources
    from .live import start_sources

    out = Path(args.out)
    if out.exists() and not args.force:
        raise CliError(f"{out} already exists (use --force to overwrite it)")
    command = command_after_dashes(getattr(args, "command", None) or [])
    if args.kill is not None and (not command or args.duration is None):
        raise CliError("--kill needs --duration and a COMMAND (after --)")
    sources = LiveSources(socket=args.socket, interval=args.interval / 1000)
    sources.record_to(out, label=args.label, overwrite=args.force)
    configure_metrics(sources, args)
    job = _Job()
    tty = sys.stderr.isatty()
    with handling(job.handlers()):
        start_sources(sources)
        started = time.monotonic()
        try:
            _say_started(sources, out)
            reported = _record(args, sources, job, command, started, tty)
        finally:
            sources.stop()
    return _finish(args, sources, job, command, (started, tty, reported))


def _say_started(sources: LiveSources, out: Path) -> None:
    feed = sources.feed
    if feed is not None:
        say(
            f"recording to {out} through the gpuwatch on {sources.socket_path} "
            f"(pid {feed.owner_pid}; this one takes over when it quits); Ctrl-C or SIGTERM stops"
        )
    else:
        say(f"recording to {out} (socket {sources.socket_path}); Ctrl-C or SIGTERM stops")
    if sources.metrics is not None:
        say(f"metrics on {sources.metrics.url}")


def _record(
    args: argparse.Namespace,
    sources: LiveSources,
    job: _Job,
    command: list[str],
    started: float,
    tty: bool,
) -> bool:
    """Start the command (if any) and wait; returns whether a failure was said."""
    from ..launch import SignalForwarder

    recorder = sources.recorder
    assert recorder is not None
    with ExitStack() as stack:
        if command:
            job.child = stack.enter_context(
                launched(command, socket_path=sources.socket_path, log_path=args.log or "-")
            )
            job.forward = SignalForwarder(job.child)
        child = job.child
        reported, elapsed = _wait(args, sources, child, job.stop, started, tty)
        if child is not None:
            sources.session.child_exited(child.pid, child.exit_status)
        if not args.label:
            recorder.writer.set_label(_auto_label(sources.session))
        if elapsed and child is not None and child.running:
            job.stopped = _end_of_duration(args.kill or "sigterm", sources, child, tty)
    return reported


def _finish(
    args: argparse.Namespace,
    sources: LiveSources,
    job: _Job,
    command: list[str],
    how: tuple[float, bool, bool],
) -> int:
    """Say how the recording (and the command) ended; the exit status."""
    from ..launch import describe_returncode

    started, tty, reported = how
    recorder = sources.recorder
    assert recorder is not None
    if tty:
        say("", end="", overwrite=True)
    if sources.receiver.cut_short:
        say(sources.receiver.cut_short)
    if sources.view_ended:
        say(sources.view_ended)
    if recorder.error is None:
        say(_status(sources, started))
    elif not reported:
        say(recorder.error)
    failed = EXIT_ERROR if recorder.error is not None else EXIT_OK
    child = job.child
    if child is None:
        return failed
    ended = describe_returncode(child.returncode)
    if job.stopped:
        ended += f" (--duration {args.duration:g} s elapsed, --kill {args.kill or 'sigterm'})"
    say(f"{shlex.join(command)}: {ended}")
    hint = child.torch_hint()  # with --log; else the child's own line said it
    if hint:
        say(hint)
    if job.stopped:
        return failed
    return EXIT_ERROR if child.exit_status is None else child.exit_status


def _wait(
    args: argparse.Namespace,
    sources: LiveSources,
    child: LaunchedCommand | None,
    stop: threading.Event,
    started: float,
    tty: bool,
) -> tuple[bool, bool]:
    """Until the job ends, a signal stops it, or ``--duration``.

    Returns:
        ``(reported, elapsed)``: a failure was said; ``--duration`` ran out.
    """
    recorder = sources.recorder
    assert recorder is not None
    deadline = None if args.duration is None else started + args.duration
    reported = False
    tick = STATUS_EVERY if child is None else CHILD_POLL
    next_status = time.monotonic() + STATUS_EVERY
    while not stop.is_set():
        if child is not None and not child.running:
            break
        notice = recorder.take_notice()  # the file was renamed: writing goes on there
        if notice is not None:
            say(notice, overwrite=tty)
        if recorder.error is not None and not reported:
            # The recording is lost, the job is not: it runs on to its own end.
            reported = True
            if tty:
                say("", end="", overwrite=True)
            say(recorder.error + ("; the command runs on" if child is not None else ""))
            if child is None:
                break
        wait = tick if deadline is None else min(tick, deadline - time.monotonic())
        if wait <= 0:
            return reported, True
        if stop.wait(wait):
            break
        if tty and recorder.error is None and time.monotonic() >= next_status:
            next_status = time.monotonic() + STATUS_EVERY
            say(_status(sources, started), end="", overwrite=True)
    return reported, False


def _end_of_duration(kill: str, sources: LiveSources, child: LaunchedCommand, tty: bool) -> bool:
    """``--duration`` ran out while the command runs: do what ``--kill`` says.

    Returns:
        True: gpuwatch stopped it; False: it ran to its own end (``none``), and its exit
        status stays gpuwatch's.
    """
    if tty:
        say("", end="", overwrite=True)
    if kill == "none":
        sources.stop()  # the recording ends here; the job does not
        say("--duration elapsed: recording stopped; waiting for the command (--kill none)")
        child.wait()  # SIGINT/SIGTERM to gpuwatch still go to the job meanwhile
        return False
    sig = signal.SIGINT if kill == "sigint" else signal.SIGTERM
    child.signal(sig)
    try:
        child.wait(KILL_GRACE)
    except subprocess.TimeoutExpired:
        child.signal(signal.SIGKILL)
        child.wait()
    return True


def _auto_label(session: Session) -> str:
    gpus = [d for d in session.devices.values() if d.kind == "gpu"]
    what = f"{len(gpus)}-GPU recording" if gpus else "CPU recording (no GPU seen)"
    argv = next((p.hello.get("argv") for p in session.processes.values() if p.hello), None)
    return f"{what} on {socket.gethostname()}" + (f" of {' '.join(argv)[:120]}" if argv else "")


def _count(n: int, word: str) -> str:
    """``1 process``, ``2 processes``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}{'es' if word.endswith('s') else 's'}"


def _status(sources: LiveSources, started: float) -> str:
    s = sources.session
    phases = sum(len(p.phases) for p in s.processes.values())
    recorder = sources.recorder
    rows = recorder.rows_written if recorder is not None else 0
    size = recorder.path.stat().st_size if recorder is not None and recorder.path.exists() else 0
    where = recorder.path if recorder is not None else sources.record_path  # followed a rename
    return (
        f"recorded {time.monotonic() - started:.0f} s · {_count(len(s.processes), 'process')} · "
        f"{phases} phases · {rows} rows · {size / 1e6:.1f} MB in {where}"
    )


COMMANDS = (
    Command(
        "record",
        help="record a session to a file, without a terminal (batch jobs)",
        description="Record NVML, host and annotation data to FILE until SIGINT/SIGTERM "
        "or --duration. Scripts send to the same socket as for the dashboard. With "
        "'-- COMMAND', run COMMAND instrumented (as 'gpuwatch run' does) and record until it "
        "exits; SIGINT/SIGTERM go to the command, and its exit status becomes gpuwatch's.",
        usage="gpuwatch record --out FILE [options] [-- COMMAND [ARGS...]]",
        options=_options,
        run=cmd_record,
    ),
)
