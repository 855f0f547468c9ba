"""Zero-code instrumentation: plain scripts started through the launcher and the start-up
hook, a real socket and a real receiver; exit statuses, logs, signals, torchrun."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, wait_for
from phasecheck import drained, receiver, rows, step_rows

from gpuwatch import launch
from gpuwatch.session import Session

SCRIPTS = ROOT / "tests" / "scripts"
PLAIN = str(SCRIPTS / "plain_train.py")


@pytest.fixture
def live(sock_path: str) -> Iterator[Session]:
    yield from receiver(sock_path)


@pytest.fixture
def env() -> dict[str, str]:
    """Our environment without PYTHONPATH: the start-up hook must find gpuwatch itself."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_")}
    base.pop("PYTHONPATH", None)
    return base


def _run(sock_path: str, env: dict[str, str], tmp_path: Path, *args: str) -> launch.LaunchedCommand:
    child = launch.start(
        [sys.executable, PLAIN, *args], socket_path=sock_path, log_path=tmp_path / "log", env=env
    )
    child.wait(timeout=120)
    return child


def _python(
    code: str, sock_path: str, env: dict[str, str], tmp_path: Path
) -> launch.LaunchedCommand:
    """``python -c code`` started under gpuwatch, its output in ``tmp_path / "log"``."""
    return launch.start(
        [sys.executable, "-c", code], socket_path=sock_path, log_path=tmp_path / "log", env=env
    )


def _printed(child: launch.LaunchedCommand, line: str) -> bool:
    """Whether the child printed ``line`` (the log's first line, the command, holds it too)."""
    return line in child.log_path.read_text().splitlines()


def _ended(session: Session, pid: int) -> bool:
    proc = session.processes.get(pid)
    return proc is not None and proc.ended is not None


@pytest.mark.torch
@pytest.mark.parametrize(
    ("args", "expected"),
    # Three torch children, each seconds of imports: the plain loop's rows are every
    # case's (``model.zero_grad()`` gives exactly them, ``opt.zero_grad()`` is the first
    # case's); accumulation and eval each add their own rows, so one loop holds both (eval
    # alone is tests/e2e/test_run_record.py's recorded loop).
    [
        (
            ["--steps", "4", "--accum", "3", "--eval-every", "2"],
            step_rows(4, accum=3, eval_every=2, last_data=True),
        ),
        (["--steps", "3", "--zero-grad", "start"], step_rows(3, zero_grad="start")),
        (["--steps", "2", "--zero-grad", "model"], step_rows(2, last_data=True)),
    ],
    ids=["accumulation-and-eval", "zero-grad-first", "model-zero-grad"],
)
def test_plain_script_gets_phases(
    live: Session,
    sock_path: str,
    env: dict[str, str],
    tmp_path: Path,
    args: list[str],
    expected: list[tuple[str, int, int]],
) -> None:
    child = _run(sock_path, env, tmp_path, *args)
    log = child.log_path.read_text()
    assert child.exit_status == 0, log
    assert "gpuwatch True" in log  # loaded by the start-up hook, never by the script
    assert wait_for(lambda: _ended(live, child.pid))
    assert rows(live, child.pid) == expected
    proc = live.processes[child.pid]
    assert proc.hello["argv"][1:] == args and proc.dropped == 0 and proc.gaps == 0
    assert not proc.open, "every phase ended by exit"


@pytest.mark.torch
def test_manual_phases_under_the_startup_hook_are_not_doubled(
    live: Session, sock_path: str, env: dict[str, str], tmp_path: Path
) -> None:
    # The sample annotates every phase itself; the automatic ones must step aside.
    sample = str(ROOT / "samples" / "train_tiny_gpt.py")
    child = launch.start(
        [sys.executable, sample, "--steps", "6", "--eval-every", "3"],
        socket_path=sock_path,
        log_path=tmp_path / "log",
        env=env,
    )
    assert child.wait(timeout=120) == 0, child.log_path.read_text()
    assert wait_for(lambda: _ended(live, child.pid))
    top = [r[0] for r in rows(live, child.pid) if r[1] == 0]
    expected: list[str] = []
    for step in range(6):
        expected += ["data", "forward", "backward", "optimizer.step", "zero_grad"]
        expected += ["eval"] if (step + 1) % 3 == 0 else []
    assert top == expected
    # The eval after steps 2 and 5 (each holds a data) is in its step, not the next: the
    # last one was in step 6, which never ran (issue 25).
    assert [r for r in rows(live, child.pid) if r[1] > 0] == [("data", 1, 2), ("data", 1, 5)]


def test_exit_status_and_log(sock_path: str, env: dict[str, str], tmp_path: Path) -> None:
    # The status and the log are the launcher's: a Python child that prints and exits 3
    # shows them without the seconds a torch import takes (an instrumented torch child's
    # status is checked through ``record`` in tests/e2e/test_run_record.py).
    code = "import sys; print('done 1 steps', flush=True); sys.exit(int(sys.argv[-1]))"
    child = launch.start(
        [sys.executable, "-c", code, "--exit-code", "3"],
        socket_path=sock_path,
        log_path=tmp_path / "log",
        env=env,
    )
    child.wait(timeout=120)
    assert (child.returncode, child.exit_status) == (3, 3)
    assert child.describe() == f"pid {child.pid} exited with status 3"
    log = child.log_path.read_text().splitlines()
    assert log[0].startswith("[gpuwatch] $ ") and log[0].endswith("--exit-code 3")
    assert any(line.startswith("done 1 steps") for line in log)
    assert log[-1] == f"[gpuwatch] pid {child.pid} exited with status 3"
    assert child.log_path.stat().st_mode & 0o077 == 0
    shell = launch.start(
        ["sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 4"],
        socket_path=sock_path,
        log_path=tmp_path / "sh.log",
        env=env,
    )
    assert shell.wait(30) == 4 and shell.exit_status == 4
    text = shell.log_path.read_text()
    assert "to-stdout\nto-stderr\n" in text


def test_command_not_found(sock_path: str, tmp_path: Path) -> None:
    with pytest.raises(launch.LaunchError, match="cannot run no-such-command-gw"):
        launch.start(["no-such-command-gw"], socket_path=sock_path, log_path=tmp_path / "l")
    with pytest.raises(launch.LaunchError, match="no command"):
        launch.start([], socket_path=sock_path, log_path=tmp_path / "l")


@pytest.mark.torch
def test_stop_interrupts_the_job(live: Session, sock_path: str, env, tmp_path: Path) -> None:
    child = launch.start(
        [sys.executable, PLAIN, "--steps", "100000", "--sleep", "0.01"],
        socket_path=sock_path,
        log_path=tmp_path / "log",
        env=env,
    )
    try:
        assert wait_for(lambda: len(rows(live, child.pid)) > 6, timeout=60)
        assert child.running and child.exit_status is None
        code = child.stop(grace=20)
        # SIGINT first, as Ctrl-C: the job raised KeyboardInterrupt and ended by itself,
        # before any SIGTERM or SIGKILL. How Python ends then is the job's own affair: it
        # dies of the SIGINT, unless code run after the exception (at exit) executes a
        # string: CPython then forgets the interrupt and exits with status 1. torch's
        # compile-times report at exit imports `tabulate` where that is installed, and
        # its namedtuples are such strings, with or without gpuwatch.
        log = child.log_path.read_text()
        assert "KeyboardInterrupt" in log
        assert code in (-signal.SIGINT, 1), log
        assert child.exit_status == launch.exit_status(code)
        assert child.describe() == f"pid {child.pid} {launch.describe_returncode(code)}"
        assert wait_for(lambda: _ended(live, child.pid))  # gpuwatch's goodbye still left
    finally:
        if child.running:
            child.signal(signal.SIGKILL)
            child.wait()


def test_a_job_that_dies_of_sigint_is_reported_so(
    sock_path: str, env: dict[str, str], tmp_path: Path
) -> None:
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = _python(code, sock_path, env, tmp_path)
    try:
        assert wait_for(lambda: _printed(child, "ready"), timeout=30)
        assert child.stop(grace=20) == -signal.SIGINT
        assert child.exit_status == 130
        assert child.describe().endswith("killed by SIGINT")
        assert child.log_path.read_text().endswith("killed by SIGINT\n")
    finally:
        if child.running:
            child.signal(signal.SIGKILL)
            child.wait()


def test_supervise_forwards_signals(sock_path: str, env: dict[str, str], tmp_path: Path) -> None:
    code = "import time\nprint('ready', flush=True)\ntime.sleep(60)"
    child = _python(code, sock_path, env, tmp_path)
    assert wait_for(lambda: _printed(child, "ready"), timeout=30)
    before = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        assert launch.supervise(child) == 128 + signal.SIGTERM
    finally:
        timer.cancel()
        if child.running:
            child.signal(signal.SIGKILL)
            child.wait()
    assert signal.getsignal(signal.SIGTERM) is before


def test_startup_hook_is_light_and_chains(sock_path: str, env, tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIR_SITE'] = 'ran'\n")
    env = {**env, "PYTHONPATH": str(theirs)}
    code = (
        "import os, sys; "
        "print(os.environ.get('THEIR_SITE'), sys.modules['sitecustomize'].__file__); "
        "print(sorted(m for m in ('torch', 'gpuwatch', 'numpy') if m in sys.modules)); "
        "print(os.environ['PYTHONPATH'].split(os.pathsep)[0])"
    )
    child = _python(code, sock_path, env, tmp_path)
    assert child.wait(30) == 0
    out = child.log_path.read_text().splitlines()
    assert out[1] == f"ran {theirs / 'sitecustomize.py'}"  # their sitecustomize still runs
    assert out[2] == "[]"  # nothing heavy: not even gpuwatch until torch is imported
    assert out[3] == launch.BOOT_DIR


@pytest.mark.torch
def test_auto_off(live: Session, sock_path: str, env: dict[str, str], tmp_path: Path) -> None:
    # torch imported and a forward and backward run, where the hook would load gpuwatch
    # and phases begin; no optimizer (its first use imports torch._dynamo: seconds).
    code = (
        "import sys, torch\n"
        "torch.nn.Linear(16, 4)(torch.randn(8, 16)).sum().backward()\n"
        "print('gpuwatch', 'gpuwatch' in sys.modules)\n"
    )
    child = _python(code, sock_path, {**env, "GPUWATCH_AUTO": "0"}, tmp_path)
    child.wait(timeout=120)
    assert child.exit_status == 0
    assert "gpuwatch False" in child.log_path.read_text()
    assert drained(live, sock_path)
    assert child.pid not in live.processes


@pytest.mark.torch
def test_torchrun_ranks_annotate_their_own_phases(
    live: Session, sock_path: str, env: dict[str, str], tmp_path: Path
) -> None:
    child = launch.start(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(SCRIPTS / "ddp_train.py"),
            "3",
        ],
        socket_path=sock_path,
        log_path=tmp_path / "log",
        env={**env, "OMP_NUM_THREADS": "1"},
    )
    try:
        code = child.wait(timeout=180)
    except subprocess.TimeoutExpired:
        child.stop(grace=5)
        raise
    log = child.log_path.read_text()
    assert code == 0, log
    # Unbuffered prints of two ranks may interleave in the shared log: no line structure.
    workers = {
        int(pid): int(rank) for rank, pid in re.findall(r"rank (\d) of 2 pid (\d+) done", log)
    }
    assert sorted(workers.values()) == [0, 1]
    assert wait_for(lambda: all(_ended(live, pid) for pid in workers))
    for pid, rank in workers.items():
        proc = live.processes[pid]
        assert (proc.hello["rank"], proc.hello["local_rank"], proc.hello["world_size"]) == (
            rank,
            rank,
            2,
        )
        assert proc.label == f"rank {rank}"
        assert (proc.dropped, proc.gaps) == (0, 0)
        assert rows(live, pid) == step_rows(3, last_data=True)
    # The torchrun agent imported torch too but trained nothing: it sent nothing.
    assert set(live.processes) == set(workers)
