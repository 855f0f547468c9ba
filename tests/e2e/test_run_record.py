"""``gpuwatch record --out FILE -- COMMAND`` and ``gpuwatch run -- COMMAND``, end to end.

A plain training script that never imports gpuwatch is run through the real CLI; the
recording (or the dashboard in tmux) must show its automatic phases, and the command's
exit status must become gpuwatch's.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, record_cmd, run_cli, wait_for
from phasecheck import rows, step_rows
from tmuxhelp import Tmux

from gpuwatch.store import open_recording, open_session

PLAIN = str(ROOT / "tests" / "scripts" / "plain_train.py")


def terminal_env() -> dict[str, str]:
    """What the shell in tmux gets: this checkout first on the path, a colour terminal."""
    return {
        "PYTHONPATH": str(ROOT),
        "TERM": "xterm-256color",
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
    }


def record(tmp: Path, sock: str, *command: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp / "run.gpuwatch"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GPUWATCH_SOCKET", None)
    result = subprocess.run(
        [
            *record_cmd(str(out), sock),
            "--",
            *command,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=ROOT,
    )
    return result, out


def recorded_rows(path: Path) -> list[tuple[str, int, int]]:
    rec = open_recording(path)
    try:
        session, loader = open_session(rec)
        loader.load_all()
        (pid,) = [p for p in session.processes if len(session.processes[p].phases)]
        return rows(session, pid)
    finally:
        rec.close()


@pytest.mark.torch
def test_record_a_command_with_no_gpuwatch_import(tmp_path, sock_path) -> None:
    # One torch child: which phases the start-up hook infers for plain, accumulating and
    # evaluating loops is tests/cli/test_launch.py's (the same launcher and hook, a live
    # receiver, five loops); here, that the recording holds them and that the command's
    # own status passes through ``record``.
    args = ("--steps", "4", "--eval-every", "2", "--exit-code", "3")
    result, out = record(tmp_path, sock_path, sys.executable, PLAIN, *args)
    assert result.returncode == 3, result.stderr
    assert "exited with status 3" in result.stderr
    got = recorded_rows(out)
    assert got == step_rows(4, eval_every=2, last_data=True)
    names = [r[0] for r in got]
    for name in ("forward", "backward", "optimizer.step", "zero_grad"):
        assert name in names


@pytest.mark.parametrize("code", [0, 3])
def test_the_commands_exit_status_is_in_the_recording(tmp_path, sock_path, code: int) -> None:
    """A script's own bye cannot know its exit status (atexit never sees it): the launcher
    puts it in the recording, so a run that ended well says 0, not null."""
    script = (
        "import sys, gpuwatch\n"
        "with gpuwatch.phase('forward'):\n"
        "    pass\n"
        "gpuwatch.flush()\n"
        f"sys.exit({code})\n"
    )
    result, out = record(tmp_path, sock_path, sys.executable, "-c", script)
    assert result.returncode == code, result.stderr
    info = run_cli("info", "--json", str(out))
    procs = json.loads(info.stdout)["processes"]
    assert [p["exit_code"] for p in procs] == [code], procs


def test_record_a_command_that_does_not_exist(tmp_path, sock_path) -> None:
    result, _ = record(tmp_path, sock_path, "no-such-program-anywhere")
    assert result.returncode == 2  # a bad command line, as for any bad input
    assert result.stderr.strip().splitlines()[-1].startswith("gpuwatch: cannot run")


def test_run_without_a_command_is_a_usage_error() -> None:
    out = run_cli("run")  # refused before anything starts: no child needed to see it
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "needs a command" in out.stderr


@pytest.mark.torch
@pytest.mark.tmux
def test_run_shows_the_command_and_asks_before_quitting(sock_path, tmp_path) -> None:
    log = tmp_path / "child.log"
    env = terminal_env()
    cmd = (
        f"{shlex.quote(sys.executable)} -m gpuwatch run --no-record --socket {sock_path} "
        f"--log {log} -- {shlex.quote(sys.executable)} {PLAIN} --steps 100000 --sleep 0.01"
    )
    tmux = Tmux(cmd, env)
    try:
        assert tmux.wait_for_text("running pid"), tmux.screen()
        tmux.keys("2")  # automatic phases of a script that never imported gpuwatch
        assert tmux.wait_for_text("optimizer.step", timeout=60), tmux.screen()
        tmux.keys("4")
        assert tmux.wait_for_text("[gpuwatch] $"), tmux.screen()  # the log tab
        tmux.keys("q")
        assert tmux.wait_for_text("still running"), tmux.screen()
        # The command and the question on two lines, never a literal backslash-n.
        screen = tmux.screen()
        assert "\\n" not in screen, screen
        asked = next(line for line in screen.splitlines() if "still running" in line)
        assert "--steps 100000" not in asked and asked.strip("│ ").startswith("pid "), screen
        tmux.keys("n")
        assert wait_for(lambda: "still running" not in tmux.screen()), tmux.screen()
        tmux.keys("q", "y")
        # Stopped by gpuwatch: SIGTERM to its process group, status 128 + 15.
        assert tmux.wait_for_text("EXIT=143"), tmux.screen()
    finally:
        tmux.close()


@pytest.mark.tmux
def test_run_exit_status_becomes_gpuwatchs(sock_path, tmp_path) -> None:
    env = terminal_env()
    # A child that talks to gpuwatch (a phase, flushed) and exits 5; torch is no part of
    # how its status comes back, and importing it took most of the test.
    script = (
        "import sys, gpuwatch\n"
        "with gpuwatch.phase('forward'):\n"
        "    pass\n"
        "gpuwatch.flush()\n"
        "sys.exit(5)\n"
    )
    cmd = (
        f"{shlex.quote(sys.executable)} -m gpuwatch run --no-record --socket {sock_path} "
        f"--log {tmp_path / 'c.log'} -- {shlex.quote(sys.executable)} -c {shlex.quote(script)}"
    )
    tmux = Tmux(cmd, env)
    try:
        assert tmux.wait_for_text("command exited 5", timeout=60), tmux.screen()
        tmux.keys("q")  # no question: the command has ended
        assert tmux.wait_for_text("EXIT=5"), tmux.screen()
    finally:
        tmux.close()


def test_run_stops_its_command_when_gpuwatch_is_terminated(sock_path, tmp_path) -> None:
    import signal

    from conftest import wait_for

    pidfile = tmp_path / "pid"
    script = tmp_path / "child.py"
    # Written under another name and renamed, so the test never reads a half-written file.
    script.write_text(
        f"import os, time\nopen({str(pidfile)!r} + '.tmp', 'w').write(str(os.getpid()))\n"
        f"os.replace({str(pidfile)!r} + '.tmp', {str(pidfile)!r})\ntime.sleep(120)\n"
    )
    env = terminal_env()
    cmd = (
        f"{shlex.quote(sys.executable)} -m gpuwatch run --no-record --socket {sock_path} "
        f"--log {tmp_path / 'c.log'} -- {shlex.quote(sys.executable)} {script}"
    )
    tmux = Tmux(cmd, env)
    try:
        assert wait_for(pidfile.exists, timeout=60)
        child = int(pidfile.read_text())
        # The gpuwatch process itself (not the shell tmux started it from).
        gw = [
            p
            for p in psutil.process_iter(["cmdline"])
            if (p.info["cmdline"] or [])[1:4] == ["-m", "gpuwatch", "run"]
            and sock_path in p.info["cmdline"]
        ]
        assert len(gw) == 1
        gw[0].send_signal(signal.SIGTERM)
        # The SIGTERM lands anywhere, in an import too (a raising handler once left the
        # import lock held there, and gpuwatch hung): run notes it and acts between steps.
        # The child may likewise miss its SIGINT and end at the SIGTERM after launch's
        # 10 s grace, so allow for that.
        assert tmux.wait_for_text("EXIT=", timeout=60), tmux.screen()

        def gone() -> bool:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                return True
            return False

        assert wait_for(gone, timeout=30), (
            "the command outlived gpuwatch: " + tmux.screen() + (tmp_path / "c.log").read_text()
        )
    finally:
        tmux.close()


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children()
    except psutil.Error:
        return []


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


SLOW_CHILD = (
    "import sys, time, gpuwatch\n"
    "for i in range(30):\n"
    "    with gpuwatch.phase('forward'):\n"
    "        time.sleep(0.1)\n"
    "open(sys.argv[1], 'w').write('done')\n"
    "sys.exit(5)\n"
)


def test_a_broken_terminal_stops_neither_the_recording_nor_the_command(tmp_path, sock_path) -> None:
    # stderr is a pipe nobody reads any more, and the terminal hangs up (SIGHUP) mid-run.
    child = tmp_path / "child.py"
    child.write_text(SLOW_CHILD)
    done = tmp_path / "done"
    out = tmp_path / "run.gpuwatch"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    read, write = os.pipe()
    gw = subprocess.Popen(
        [*record_cmd(str(out), sock_path),
         "--", sys.executable, str(child), str(done)],
        env=env, cwd=ROOT, stdout=write, stderr=write, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    os.close(write)
    os.close(read)  # the terminal is gone: every write gpuwatch makes fails (EPIPE)
    assert wait_for(lambda: out.exists(), timeout=30)
    # Mid-run: the command runs (3 s of phases) when the terminal hangs up.
    assert wait_for(lambda: any(str(child) in _cmdline(p) for p in _children(gw.pid)), 30)
    gw.send_signal(signal.SIGHUP)
    assert gw.wait(timeout=60) == 5  # the command's own status
    assert done.read_text() == "done"
    rec = open_recording(out)
    assert rec.complete
    rec.close()


# A Python with no torch: the child drops site-packages from its path before importing it.
NO_TORCH = "import sys; sys.path[:] = [p for p in sys.path if 'packages' not in p]; import torch"


def test_record_a_command_whose_python_has_no_torch(tmp_path, sock_path) -> None:
    result, _ = record(tmp_path, sock_path, sys.executable, "-c", NO_TORCH)
    assert result.returncode == 1
    # The child's output comes to our stderr (no --log): the start-up hook's line is there.
    assert "No module named 'torch'" in result.stderr
    line = f"torch is not installed for {sys.executable}; install it with: "
    line += 'pip install "gpuwatch[torch]"'
    assert line in result.stderr
    # With a log, gpuwatch reads its tail and says it too.
    log = tmp_path / "child.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    logged = subprocess.run(
        [*record_cmd(str(tmp_path / "b.gpuwatch"), sock_path), "--log", str(log),
         "--", sys.executable, "-c", NO_TORCH],
        capture_output=True, text=True, timeout=180, env=env, cwd=ROOT,
    )  # fmt: skip
    assert logged.returncode == 1
    assert "No module named" not in logged.stderr  # the traceback went to the log...
    assert line in log.read_text()
    last = logged.stderr.strip().splitlines()[-1]  # ...and gpuwatch's own last word says it
    assert last == (
        'gpuwatch: the command\'s Python has no torch: pip install "gpuwatch[torch]" '
        "(in that Python's environment)"
    )


def test_a_script_that_handles_a_missing_torch_hears_nothing(tmp_path, sock_path) -> None:
    hide = NO_TORCH.removesuffix("; import torch")
    code = f"{hide}\ntry:\n    import torch\nexcept ImportError:\n    print('cpu only')"
    result, _ = record(tmp_path, sock_path, sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert "cpu only" in result.stdout + result.stderr
    assert "not installed" not in result.stderr and "no torch" not in result.stderr


@pytest.mark.tmux
def test_run_says_how_to_install_torch(sock_path, tmp_path) -> None:
    cmd = (
        f"{shlex.quote(sys.executable)} -m gpuwatch run --no-record --socket {sock_path} "
        f"--log {tmp_path / 'c.log'} -- {shlex.quote(sys.executable)} -c {shlex.quote(NO_TORCH)}"
    )
    tmux = Tmux(cmd, terminal_env())
    try:
        assert tmux.wait_for_text("command exited 1", timeout=60), tmux.screen()
        assert tmux.wait_for_text("gpuwatch[torch]"), tmux.screen()  # the notification
        tmux.keys("q")
        assert tmux.wait_for_text("EXIT=1"), tmux.screen()
        assert 'has no torch: pip install "gpuwatch[torch]"' in tmux.screen()
    finally:
        tmux.close()


LONG_CHILD = (
    "import sys, time\n"
    "try:\n"
    "    for i in range(int(sys.argv[1])):\n"
    "        time.sleep(0.1)\n"
    "except KeyboardInterrupt:\n"
    "    print('got SIGINT', flush=True)\n"
    "    sys.exit(0)\n"
    "print('ran to its end', flush=True)\n"
    "sys.exit(5)\n"
)


def _record_for(tmp_path: Path, sock: str, tenths: int, *options: str):
    child = tmp_path / "child.py"
    child.write_text(LONG_CHILD)
    out = tmp_path / "run.gpuwatch"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [*record_cmd(str(out), sock),
         *options, "--", sys.executable, str(child), str(tenths)],
        capture_output=True, text=True, timeout=180, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return result, out


def test_record_duration_stops_the_command_with_sigterm_by_default(tmp_path, sock_path) -> None:
    # Before: SIGINT, the command's KeyboardInterrupt traceback and exit 130, said nowhere.
    result, out = _record_for(tmp_path, sock_path, 1200, "--duration", "1")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "killed by SIGTERM (--duration 1 s elapsed, --kill sigterm)" in result.stderr
    open_recording(out).close()


def test_record_duration_kill_sigint_is_ctrl_c(tmp_path, sock_path) -> None:
    result, _ = _record_for(tmp_path, sock_path, 1200, "--duration", "1", "--kill", "sigint")
    assert result.returncode == 0, result.stderr
    assert "got SIGINT" in result.stdout and "--kill sigint" in result.stderr


def test_record_duration_kill_none_lets_the_command_finish(tmp_path, sock_path) -> None:
    result, out = _record_for(tmp_path, sock_path, 40, "--duration", "1", "--kill", "none")
    assert result.returncode == 5, result.stderr  # its own status: gpuwatch did not stop it
    assert "ran to its end" in result.stdout
    assert "recording stopped; waiting for the command (--kill none)" in result.stderr
    rec = open_recording(out)
    try:
        session, loader = open_session(rec)
        loader.load_all()
        span = session.now() - session.t_origin
        assert span < 3.5e9, span  # the recording ended at the duration, not with the job
    finally:
        rec.close()


@pytest.mark.parametrize("options", [["--kill", "none"], ["--duration", "1", "--kill", "none"]])
def test_record_kill_needs_a_duration_and_a_command(tmp_path, options) -> None:
    argv = ["record", "--out", str(tmp_path / "r.gpuwatch"), *options]
    if "--duration" not in options:
        argv += ["--", sys.executable, "-c", "pass"]
    result = run_cli(*argv)  # refused before anything starts: no child needed to see it
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "--kill needs --duration and a COMMAND" in result.stderr
