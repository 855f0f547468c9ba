"""Start a training command under gpuwatch: ``gpuwatch run`` / ``gpuwatch record -- CMD``.

The command runs as a child in its own session and process group, with

- ``GPUWATCH_SOCKET`` naming the socket this gpuwatch listens on, and
- gpuwatch's start-up hook (``gpuwatch/instrument/_boot``) first on ``PYTHONPATH``, so every
  Python process in it gets automatic phases once it imports torch, without code changes,
- its stdout and stderr appended to a log file (the dashboard shows it; nothing garbles the
  screen), its stdin closed.

Signals meant for the job go to its whole process group (torchrun's workers, DataLoader
workers). How the commands use this::

    sources = LiveSources(socket=...)
    sources.start()
    child = launch.start(command, socket_path=sources.socket_path)
    status = launch.supervise(child)      # record: wait, forwarding Ctrl-C / TERM / HUP
    # run: the dashboard polls child.poll(), shows child.describe() and the log, and on
    # quit calls child.stop() (after asking while child.running); exit with child.exit_status
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, overload

from . import protocol

BOOT_DIR = str(Path(__file__).resolve().parent / "instrument" / "_boot")
"""The directory holding the start-up hook (``sitecustomize.py``)."""


class LaunchError(RuntimeError):
    """The command could not be started (not found, not executable, bad directory)."""


def child_env(
    socket_path: str, base: Mapping[str, str] | None = None, *, instrument: bool = True
) -> dict[str, str]:
    """The environment of a launched command.

    Args:
        socket_path: The annotation socket the command's processes send to.
        base: The environment to start from (default: ours).
        instrument: Put the start-up hook on ``PYTHONPATH`` (automatic phases).
    """
    env = dict(os.environ if base is None else base)
    env[protocol.SOCKET_ENV] = os.path.abspath(socket_path)
    if instrument:
        rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOT_DIR]
        env["PYTHONPATH"] = os.pathsep.join([BOOT_DIR, *rest])
    # The log is a file: without this, Python buffers the child's prints for minutes.
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def default_log_path() -> Path:
    """A fresh log file name in the per-user log directory."""
    try:
        import platformdirs

        directory = platformdirs.user_log_path("gpuwatch")
    except Exception:
        directory = Path.home() / ".local" / "state" / "gpuwatch" / "log"
    return directory / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


@overload
def exit_status(returncode: int) -> int: ...
@overload
def exit_status(returncode: None) -> None: ...
def exit_status(returncode: int | None) -> int | None:
    """A shell's view of a return code: ``128 + N`` for a child killed by signal N."""
    if returncode is None:
        return None
    return 128 - returncode if returncode < 0 else returncode


def describe_returncode(returncode: int | None) -> str:
    """``running``, ``exited with status 3``, ``killed by SIGTERM``."""
    if returncode is None:
        return "running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with status {returncode}"


TORCH_INSTALL = 'pip install "gpuwatch[torch]"'
"""How a command's Python gets torch (and gpuwatch's training side beside it)."""

_NO_TORCH_MARKERS = ("No module named 'torch'", "gpuwatch: torch is not installed for ")


def missing_torch(log_path: str | os.PathLike[str] | None, tail: int = 64 * 1024) -> bool:
    """True when the end of a command's log says it stopped for want of torch.

    The start-up hook adds a line naming the Python when that error goes uncaught; older
    Pythons (no hook) still print the ImportError itself.
    """
    if log_path is None:
        return False
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - tail))
            text = f.read().decode(errors="replace")
    except OSError:
        return False
    return any(marker in text for marker in _NO_TORCH_MARKERS)


class LaunchedCommand:
    """A launched command: its process group, its log and how it ended.

    Attributes:
        command: The command line.
        pid: The child's pid (also its process group id).
        log_path: Where its stdout and stderr go (None: gpuwatch's own).
        started_ns: ``time.monotonic_ns()`` at start.
        ended_ns: ``time.monotonic_ns()`` when its exit was first seen, else None.
    """

    def __init__(
        self, proc: subprocess.Popen, command: Sequence[str], log_path: Path | None
    ) -> None:
        self._proc = proc
        self.command = list(command)
        self.pid = proc.pid
        self.log_path = log_path
        self.started_ns = time.monotonic_ns()
        self.ended_ns: int | None = None
        self._lock = threading.Lock()

    @property
    def returncode(self) -> int | None:
        """Popen's return code (negative: killed by that signal), None while running."""
        return self.poll()

    @property
    def exit_status(self) -> int | None:
        """The status gpuwatch exits with: the child's, ``128 + N`` if killed by signal N."""
        return exit_status(self.poll())

    @property
    def running(self) -> bool:
        return self.poll() is None

    def poll(self) -> int | None:
        """The return code if the child has exited (never blocks)."""
        code = self._proc.poll()
        if code is not None:
            self._ended(code)
        return code

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child; returns its return code.

        Raises:
            subprocess.TimeoutExpired: It is still running after ``timeout`` seconds.
        """
        code = self._proc.wait(timeout)
        self._ended(code)
        return code

    def _ended(self, code: int) -> None:
        with self._lock:
            if self.ended_ns is not None:
                return
            self.ended_ns = time.monotonic_ns()
        if self.log_path is None:
            return
        with contextlib.suppress(OSError), open(self.log_path, "a") as log:
            log.write(f"\n[gpuwatch] {self.describe()}\n")

    def torch_hint(self) -> str | None:
        """A line for the user when the command failed because its Python has no torch."""
        status = self.exit_status
        if status in (None, 0) or not missing_torch(self.log_path):
            return None
        return f"the command's Python has no torch: {TORCH_INSTALL} (in that Python's environment)"

    def describe(self) -> str:
        """One line for the status bar: ``pid 123 running`` / ``... exited with status 0``."""
        return f"pid {self.pid} {describe_returncode(self._proc.returncode)}"

    def signal(self, sig: int) -> bool:
        """Send ``sig`` to the child's process group; False if it is gone already."""
        if self._proc.returncode is not None:
            return False
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:
            # The group leader exited and its pid was reused: signal no stranger.
            return False
        return True

    def stop(self, grace: float = 10.0) -> int:
        """Stop the job: SIGINT (as Ctrl-C would), then SIGTERM, then SIGKILL.

        Args:
            grace: Seconds to wait after each of SIGINT and SIGTERM.

        Returns:
            The child's return code.
        """
        for sig in (signal.SIGINT, signal.SIGTERM):
            if not self.signal(sig):
                break
            try:
                return self.wait(grace)
            except subprocess.TimeoutExpired:
                continue
        self.signal(signal.SIGKILL)
        return self.wait()


def start(
    command: Sequence[str],
    *,
    socket_path: str,
    log_path: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    instrument: bool = True,
) -> LaunchedCommand:
    """Start ``command`` under gpuwatch (see the module docstring).

    Args:
        command: The program and its arguments.
        socket_path: The socket this gpuwatch's receiver is bound to.
        log_path: Where stdout and stderr go (appended; created 0600). Default:
            :func:`default_log_path`; ``"-"``: ours (``gpuwatch record``, no screen to
            protect).
        cwd: Working directory of the child.
        env: Base environment (default: ours).
        instrument: Add the start-up hook (automatic phases).

    Raises:
        LaunchError: The command is empty or cannot be started.
    """
    if not command:
        raise LaunchError("no command to run")
    inherit = str(log_path) == "-"
    path = None if inherit else Path(log_path) if log_path is not None else default_log_path()
    fd = None
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:
            raise LaunchError(f"cannot open the log {path}: {exc.strerror or exc}")
    try:
        if fd is not None:
            os.write(fd, f"[gpuwatch] $ {shlex.join(command)}\n".encode())
        proc = subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=subprocess.STDOUT if fd is not None else None,
            cwd=cwd,
            env=child_env(socket_path, env, instrument=instrument),
            # Its own session: the terminal's Ctrl-C reaches gpuwatch, which decides.
            start_new_session=True,
        )
    except OSError as exc:
        raise LaunchError(f"cannot run {command[0]}: {exc.strerror or exc}")
    finally:
        if fd is not None:
            os.close(fd)
    return LaunchedCommand(proc, command, path)


class SignalForwarder:
    """Passes signals meant for the job on to its process group.

    SIGHUP goes on as SIGTERM (the job has no terminal); a second Ctrl-C escalates to
    SIGTERM, a third to SIGKILL. Used as a ``signal.signal`` handler.
    """

    def __init__(self, child: LaunchedCommand) -> None:
        self.child = child
        self.interrupts = 0

    def __call__(self, sig: int, _frame: object = None) -> None:
        if sig == signal.SIGINT:
            self.interrupts += 1
            sig = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)[min(self.interrupts, 3) - 1]
        elif sig == signal.SIGHUP:
            sig = signal.SIGTERM
        self.child.signal(sig)


def supervise(
    child: LaunchedCommand,
    signals: Iterable[int] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP),
) -> int:
    """Wait for ``child`` while forwarding ``signals`` to its process group.

    With no dashboard to ask, a signal to gpuwatch goes to the job (see
    :class:`SignalForwarder`). Handlers are installed only on the main thread and put back
    afterwards.

    Returns:
        The child's exit status (``128 + N`` when killed by signal N).
    """
    forward = SignalForwarder(child)
    previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in signals:
            previous[sig] = signal.signal(sig, forward)
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return exit_status(code)
