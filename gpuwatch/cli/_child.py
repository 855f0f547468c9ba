"""Starting the command of ``gpuwatch run`` and ``gpuwatch record --``, and its signals.

Both commands start the job the same way (:func:`gpuwatch.launch.start`: instrumented,
its own process group, its output in a log) and own it the same way: signal handlers for
as long as it runs, put back afterwards, and a job still running when gpuwatch leaves is
stopped (SIGINT, then SIGTERM, then SIGKILL to its group). What differs is what a signal
to gpuwatch means while the job runs, which each command says in ``handlers``.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from .. import launch
from ._common import CliError

Handler = Callable[[int, Any], None]


def hung_up(signum: int, frame: Any) -> None:
    """SIGHUP ignored by a handler (not SIG_IGN, which the job would inherit across exec)."""


@contextlib.contextmanager
def handling(handlers: Mapping[int, Handler]) -> Iterator[Callable[[], None]]:
    """Install ``handlers`` (signal -> handler) for the block; the previous ones after.

    Yields:
        A function that installs them again: an asyncio loop (the dashboard's) that took a
        signal over sets it to the default action when it closes.
    """
    _unwind.clear()
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}

    def again() -> None:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)

    try:
        yield again
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def launched(
    command: Sequence[str], *, socket_path: str, log_path: str | None
) -> Iterator[launch.LaunchedCommand]:
    """The job, started for the block and stopped at its end if it still runs.

    Args:
        command: The program and its arguments.
        socket_path: The socket this gpuwatch listens on (the job's ``GPUWATCH_SOCKET``).
        log_path: Where its output goes (None: a new file in the log directory; ``"-"``:
            gpuwatch's own stdout and stderr).

    Raises:
        CliError: The command cannot be started (not found, not executable): bad input.
    """
    try:
        child = launch.start(command, socket_path=socket_path, log_path=log_path)
    except launch.LaunchError as exc:
        raise CliError(str(exc))
    try:
        yield child
    finally:
        if child.running:
            child.stop()  # INT, then TERM, then KILL to its process group


_unwind: list[int] = []  # signals noted since the last handling() began


def unwind_later(signum: int, frame: Any) -> None:
    """A handler that notes a request to unwind gpuwatch; :func:`leave_if_requested` acts.

    It never raises. An exception raised from a signal handler lands at whatever bytecode
    runs then, and in the import system's module-lock callback, between taking the global
    import lock and the ``try`` that lets it go, it is printed as "Exception ignored", and
    the lock stays held: every other thread's next import then waits forever (CI saw
    ``gpuwatch run`` hang so). The launcher checks the request between its steps instead,
    and the dashboard at its mount, after it has taken the signals over.
    """
    _unwind.append(signum)


def unwind_requested() -> int | None:
    """The signal :func:`unwind_later` noted since the last :func:`handling` began, if any."""
    return _unwind[0] if _unwind else None


def leave_if_requested() -> None:
    """Unwind gpuwatch (``finally`` blocks stop the job and the sources) if asked to.

    Raises:
        SystemExit: With ``128 + signal``, as a shell reports a process the signal ended.
    """
    if (sig := unwind_requested()) is not None:
        raise SystemExit(128 + sig)
