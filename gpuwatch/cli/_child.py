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
def handling(handlers: Mapping[int, Handler]) -> Iterator[None]:
    """Install ``handlers`` (signal -> handler) for the block; the previous ones after."""
    _unwind.clear()
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def launched(
    command: Sequence[str], *, socket_path: str, log_path: str | None
) -> Iterator[launch.Child]:
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


_unwind: list[int] = []  # signals unwinding took, since the last handling() began


def unwinding(signum: int, frame: Any) -> None:
    """A handler that unwinds gpuwatch (``finally`` blocks stop the job and the sources).

    The exception can be swallowed where it lands: during an import, a weakref callback of
    the import system prints "Exception ignored" and goes on (CI saw a SIGTERM lost so, the
    dashboard then running on). The request is kept for :func:`unwind_requested` too.
    """
    _unwind.append(signum)
    raise SystemExit(128 + signum)


def unwind_requested() -> int | None:
    """The signal :func:`unwinding` took since the last :func:`handling` began, if any."""
    return _unwind[0] if _unwind else None
