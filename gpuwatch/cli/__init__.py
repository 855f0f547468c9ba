"""The ``gpuwatch`` command: live dashboard, run, record, replay, info, export, estimate,
serve, cluster.

One module per command family (``live``: the dashboard and ``run``; ``record``;
``recordings``: replay, info and export; ``estimate``; ``serve``; ``cluster``), each
declaring its commands in ``COMMANDS``; what they share in ``_common`` (errors, output,
option types, the parser a declared command gets) and ``_child`` (the launched command
and its signals).
Heavy modules (textual, numpy, the samplers) are imported inside the command that needs
them, so ``gpuwatch --help`` is quick and errors reach the user as one line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from .._version import __version__
from . import cluster, estimate, live, record, recordings, serve
from ._common import EXIT_OK, CliError, Parser, add_commands, say


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (each command family declares its own subcommands)."""
    parser = Parser(
        prog="gpuwatch",
        description="Where did my GPU memory go? Live timelines of nvidia-smi used memory "
        "against torch allocated, reserved and predicted memory, lined up with the "
        "training phases an instrumented script reports.",
        epilog="Run without a command for the live dashboard. "
        "See 'gpuwatch COMMAND --help' for each command.",
    )
    parser.add_argument("--version", action="version", version=f"gpuwatch {__version__}")
    live.live_dashboard(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_commands(
        sub,
        (
            *live.COMMANDS,
            *estimate.COMMANDS,
            *record.COMMANDS,
            *recordings.COMMANDS,
            *serve.COMMANDS,
            *cluster.COMMANDS,
        ),
    )
    _top_level_wins(parser, sub)
    return parser


def _top_level_wins(parser: argparse.ArgumentParser, sub: argparse._SubParsersAction) -> None:
    """Let ``gpuwatch --no-record live`` mean what it says.

    argparse applies a subcommand's defaults after the top-level options were parsed, so an
    option shared by both would silently fall back to its default. A subcommand's copy of a
    top-level option therefore sets nothing unless given; the top level holds the default.
    """
    shared = {a.dest for a in parser._actions if a.option_strings}
    for child in set(sub.choices.values()):
        for action in child._actions:
            if action.option_strings and action.dest in shared and action.dest != "help":
                action.default = argparse.SUPPRESS


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpuwatch`` console script and ``python -m gpuwatch``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except CliError as exc:
        say(str(exc))
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `gpuwatch export --table gpu FILE | head -1`: the reader had what it wanted and
        # left. Not a failure of ours (a `set -o pipefail` script must not stop on it):
        # say nothing, and send what Python still flushes at exit nowhere.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


__all__ = ["CliError", "build_parser", "main"]
