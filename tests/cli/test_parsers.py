"""Every subcommand is declared once, as data, and its parser is made from that declaration."""

from __future__ import annotations

import argparse

import pytest

from gpuwatch.cli import build_parser, cluster, estimate, live, record, recordings, serve
from gpuwatch.cli._common import Command, Parser, add_commands

DECLARED = [c for m in (live, estimate, record, recordings, serve, cluster) for c in m.COMMANDS]


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_gpuwatch_has_the_declared_commands_in_their_order() -> None:
    sub = _subparsers(build_parser())
    assert [c.name for c in DECLARED] == list(sub.choices)
    assert [c.help for c in DECLARED] == [a.help for a in sub._choices_actions]


@pytest.mark.parametrize("command", DECLARED, ids=lambda c: c.name)
def test_a_commands_parser_says_and_runs_what_it_declares(command: Command) -> None:
    p = _subparsers(build_parser()).choices[command.name]
    assert isinstance(p, Parser)  # one-line usage errors, exit status 2
    assert p.prog == f"gpuwatch {command.name}"
    assert (p.description, p.usage) == (command.description, command.usage)
    assert p.get_default("func") is command.run


def test_add_commands_gives_each_its_options_and_runner() -> None:
    seen: list[str] = []

    def options(p: argparse.ArgumentParser) -> None:
        seen.append(p.prog)
        p.add_argument("--n", type=int, default=1)

    def run(args: argparse.Namespace) -> int:
        return int(args.n)

    parser = Parser(prog="x")
    commands = (
        Command("a", help="A", options=options, run=run, usage="x a [--n N]"),
        Command("b", help="B", options=options, run=run, description="about b"),
    )
    add_commands(parser.add_subparsers(dest="command"), commands)
    assert seen == ["x a", "x b"]
    args = parser.parse_args(["b", "--n", "3"])
    assert args.func(args) == 3
    assert _subparsers(parser).choices["a"].format_usage() == "usage: x a [--n N]\n"
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["a", "--n", "x"])
    assert exited.value.code == 2
