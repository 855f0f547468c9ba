"""The command line: help, version, and one-line errors with exit status 2."""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import ROOT, run_gpuwatch

import gpuwatch


def gw(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return run_gpuwatch(*args, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_help_lists_the_commands() -> None:
    out = gw("--help")
    assert out.returncode == 0
    for word in ("live", "estimate", "--interval", "--theme"):
        assert word in out.stdout


def test_version() -> None:
    out = gw("--version")
    assert out.returncode == 0 and gpuwatch.__version__ in out.stdout


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (("--theme", "nope"), {}, "unknown theme 'nope'"),
        ((), {"GPUWATCH_THEME": "nope"}, "unknown theme 'nope'"),
        (("--interval", "5"), {}, "between 10 and 60000"),
        (("--interval", "fast"), {}, "not a number"),
        (("estimate", "--layers", "x"), {}, "not a number"),
        (("no-such-command",), {}, "invalid choice"),
    ],
)
def test_bad_options_exit_2_with_one_line(args, env, needle) -> None:
    out = gw(*args, env=env)
    assert out.returncode == 2
    assert needle in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith("gpuwatch")


def test_top_level_options_reach_the_subcommand() -> None:
    from gpuwatch.cli import build_parser

    args = build_parser().parse_args(["--no-record", "--interval", "50", "live"])
    assert args.interval == 50.0
    assert args.no_record is True
    args = build_parser().parse_args(["live", "--interval", "20"])
    assert args.interval == 20.0
    args = build_parser().parse_args(["--interval", "30", "record", "--out", "x.gpuwatch"])
    assert args.interval == 30.0
    args = build_parser().parse_args([])
    assert args.interval == 100.0 and args.no_record is False


def test_readme_states_the_real_default_sampling_rate() -> None:
    from gpuwatch.cli import build_parser

    ms = build_parser().parse_args([]).interval
    hz = 1000 / ms
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"sampled every {ms:.0f} ms, {hz:.0f} Hz, by default" in readme
    assert f"(default {ms:.0f} = {hz:.0f} Hz" in readme
    assert "100 Hz by default" not in readme
    out = gw("--help", env={"COLUMNS": "300"})
    assert f"default {ms:.0f}, i.e. {hz:.0f} Hz" in out.stdout
