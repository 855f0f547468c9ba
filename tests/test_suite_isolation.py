"""The suite keeps out of the user's own directories: conftest points them elsewhere.

A test that started the live dashboard without ``--no-record`` left a recording in the
user's data directory; ``gpuwatch run`` keeps logs in the state directory; a dashboard on the
default socket would meet the user's own training scripts. conftest.USER_ROOT stands in for
all of them, in this process and in every child a test starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, USER_ROOT

from gpuwatch import launch, protocol
from gpuwatch.store.sessions import default_recording_path

_PATHS = """\
import json
from gpuwatch import launch, protocol
from gpuwatch.store.sessions import default_recording_path
print(json.dumps([str(default_recording_path()), str(launch.default_log_path()),
                  protocol.socket_path()]))
"""


@pytest.mark.parametrize("where", ["this process", "a child process"])
def test_default_recording_log_and_socket_are_not_the_users(where: str) -> None:
    if where == "this process":
        paths = [str(default_recording_path()), str(launch.default_log_path())]
        paths.append(protocol.socket_path())
    else:
        out = subprocess.run(
            [sys.executable, "-c", _PATHS],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        paths = json.loads(out.stdout)
    assert len(paths) == 3
    for path in paths:
        assert Path(path).is_relative_to(USER_ROOT), path
    assert not any(name.startswith("GPUWATCH_") for name in os.environ)


def test_children_take_sigint_as_a_terminal_gives_it() -> None:
    """A suite started in the background by a shell without job control (``bash .ci/run
    &``) inherits SIGINT ignored; conftest gives it back, so that a job stopped with
    SIGINT, as Ctrl-C would, raises KeyboardInterrupt (tests/cli/test_launch.py) and a
    signalled ``sleep`` dies (tests/tui/test_processes_tui.py)."""
    code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "True"
