"""The full-screen commands where there is no terminal: one line, exit 2, at once (issue 25)."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest
from conftest import ROOT
from tmuxhelp import Tmux

RECORDING = ROOT / "samples" / "gpt2-small-h100.gpuwatch"

CASES = {
    "replay": (["replay", str(RECORDING)], "gpuwatch info FILE"),
    "live": (["--no-record"], "gpuwatch record"),
    "run": (["run", "--no-record", "--", sys.executable, "-c", "pass"], "gpuwatch record"),
    "cluster": (["cluster", "--prometheus", "http://127.0.0.1:9"], "gpuwatch cluster --once"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_without_a_terminal_it_refuses_in_one_line(name: str, sub_env: dict[str, str]) -> None:
    # `gpuwatch replay F </dev/null | head -c 300`: before, it never returned.
    argv, instead = CASES[name]
    proc = subprocess.run(
        [sys.executable, "-m", "gpuwatch", *argv],
        env=sub_env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("gpuwatch: "), proc.stderr
    assert "needs a terminal" in lines[0] and instead in lines[0], lines
    assert proc.stdout == "" and "\x1b" not in proc.stderr


def test_a_pipe_into_head_returns(sub_env: dict[str, str]) -> None:
    # Only stdout is not a terminal (stdin may be one): the refusal still comes.
    cmd = f"{shlex.quote(sys.executable)} -m gpuwatch replay {shlex.quote(str(RECORDING))}"
    proc = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {cmd} | head -c 300"],
        env=sub_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert "gpuwatch info FILE" in proc.stderr


def test_the_refusal_loads_nothing_heavy() -> None:
    # What makes it quick on any machine: it comes before numpy, textual or the file.
    code = (
        "import sys\nfrom gpuwatch.cli import main\n"
        f"rc = main(['replay', {str(RECORDING)!r}])\n"
        "print(rc, sorted({'numpy', 'textual', 'sqlite3'} & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.split() == ["2", "[]"], (out.stdout, out.stderr)


@pytest.mark.tmux
def test_term_dumb_is_respected(sub_env: dict[str, str]) -> None:
    env = {"PYTHONPATH": str(ROOT), "TERM": "dumb", "HOME": sub_env.get("HOME", "/tmp")}
    cmd = f"{shlex.quote(sys.executable)} -m gpuwatch replay {shlex.quote(str(RECORDING))}"
    tmux = Tmux(cmd, env, width=200, height=24)
    try:
        assert tmux.wait_for_text("EXIT=2"), tmux.screen()
        assert "TERM=dumb cannot show the full-screen dashboard; use gpuwatch info" in (
            tmux.screen().replace("\n", "")
        ), tmux.screen()
    finally:
        tmux.close()
