"""``gpuwatch replay``, ``info`` and ``export``: one recording, or several merged.

Several files (the hosts of one job, or runs made at different times) are merged into
one session on one clock (``--align``), their devices named by host.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ._common import (
    EXIT_OK,
    CliError,
    Command,
    Progress,
    add_align,
    add_theme,
    bounded,
    checked_theme,
    isatty,
    need_terminal,
    say,
)

if TYPE_CHECKING:
    from ..store.multi import Opened


# --------------------------------------------------------------------------- helpers


def _load(paths: list[str], align: str = "wall", shown: Progress | None = None) -> Opened:
    """Open and load one recording, or several merged; a bad file is one line, exit 2.

    Args:
        paths: The files.
        align: How several are laid on one clock.
        shown: The status line to keep telling what is being done (loading, checking).
    """
    from ..store.multi import load_many
    from ..store.recording import RecordingError

    def loading(i: int, n: int, path: Path) -> None:
        if shown is not None:
            shown.status = f"loading {path.name}" + (f" ({i + 1} of {n})" if n > 1 else "")

    def checked(path: Path, done: int, total: int) -> None:
        if shown is not None:
            shown.status = f"checking {path.name}: {done * 100 // max(total, 1)}% of its chunks"

    try:
        return load_many(paths, align=align, progress=loading, checked=checked)
    except RecordingError as exc:
        raise CliError(str(exc))


def _reading(shown: Progress, opened: Opened, what: str) -> None:
    """From now on the status line counts the chunks read for ``what``."""
    from ..store.archive import chunks_read

    total = sum(rec.chunk_count() for rec in opened.recordings)
    start = chunks_read()
    name = opened.recordings[0].path.name + (
        f" and {len(opened.recordings) - 1} more" if len(opened.recordings) > 1 else ""
    )
    shown.status = lambda: f"{what} {name}: {chunks_read() - start:,} of {total:,} chunks read"


_FILES_HELP = "a recording; several are merged into one session (see --align)"


def _speed_value(text: str) -> float:
    return float(text.lower().lstrip("x"))  # 2x, x2 and 2 alike


_speed = bounded(_speed_value, 0.25, 64.0, noun="a speed", name="speed")


# --------------------------------------------------------------------------- commands

# store.export's table names and formats, written out: importing it (numpy, the session
# model) only to build the parser would slow every command, --help and a refusal
# included. tests/cli/test_export_cli.py holds the two in step.
EXPORT_TABLES = (
    "meta",
    "devices",
    "gpu",
    "gpu_processes",
    "host",
    "torch",
    "peaks",
    "rss",
    "phases",
    "open_phases",
    "marks",
    "ooms",
    "processes",
    "process_info",
    "events",
    "rejects",
    "notes",
)
EXPORT_FORMATS = ("csv", "jsonl")


def _replay_options(p: argparse.ArgumentParser) -> None:
    """The files, how they line up, the theme and the speed."""
    p.add_argument("file", metavar="FILE", nargs="+", help=_FILES_HELP)
    add_align(p)
    add_theme(p)
    p.add_argument(
        "--speed", type=_speed, default=1.0, metavar="X", help="playback speed, 0.25 to 64"
    )


def _info_options(p: argparse.ArgumentParser) -> None:
    """The files, how they line up, and JSON."""
    p.add_argument("file", metavar="FILE", nargs="+", help=_FILES_HELP)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_align(p)


def _export_options(p: argparse.ArgumentParser) -> None:
    """The files, how they line up, the format, the tables and where they go."""
    p.add_argument("file", metavar="FILE", nargs="+", help=_FILES_HELP)
    add_align(p)
    p.add_argument(
        "--format",
        choices=EXPORT_FORMATS,
        default="csv",
        help="csv (a header row, also for an empty table) or jsonl (one JSON object a "
        "row: an empty table is an empty file); default csv",
    )
    p.add_argument("--table", choices=sorted(EXPORT_TABLES), help="only this table")
    p.add_argument(
        "--out",
        metavar="DIR",
        help="directory for <table>.<format> files (default: STEM-export in the current "
        "directory, STEM being the first FILE's name without its suffix: run.gpuwatch -> "
        "./run-export/; with --table and no --out, the table goes to stdout)",
    )
    p.add_argument("--force", action="store_true", help="overwrite table files that exist in DIR")


def cmd_replay(args: argparse.Namespace) -> int:
    """Open the dashboard on a recording (or several merged), playing from its start."""
    theme = checked_theme(args)
    from .live import user_keymap

    keymap = user_keymap()
    need_terminal("gpuwatch info FILE (a summary) or gpuwatch export FILE (tables)")
    from ..store.player import Player, open_replay
    from ..store.recording import RecordingError

    files: list[str] = args.file
    if len(files) == 1:
        try:
            player = open_replay(files[0], speed=args.speed)
        except RecordingError as exc:
            raise CliError(str(exc))
        label = player.loader.recording.label if player.loader is not None else ""
        subtitle = f"replay {Path(files[0]).name}" + (f" · {label}" if label else "")
    else:
        with Progress(delay=0.0) as shown:
            opened = _load(files, args.align, shown)
        opened.close()  # all loaded: the files are not needed any more
        player = Player(opened.session, speed=args.speed)
        names = ", ".join(p.origin for p in opened.parts)
        subtitle = f"replay of {len(files)} recordings merged ({args.align} clock): {names}"
    try:
        from ..tui.replay import replay_app

        replay_app(player, theme_name=theme, subtitle=subtitle, keymap=keymap).run()
    finally:
        player.close()
    return EXIT_OK


def cmd_info(args: argparse.Namespace) -> int:
    """Print what a recording holds."""
    from ..store.info import format_summary, summarize_opened

    with Progress() as shown:
        opened = _load(args.file, args.align, shown)
        try:
            _reading(shown, opened, "summarising")
            info = summarize_opened(opened)
        finally:
            opened.close()
    answer = None
    if info.get("ooms") and len(args.file) == 1:
        # An out-of-memory error: what would have fitted, as `estimate --from` says.
        from .estimate import oom_answer

        answer = oom_answer(args.file[0])
    if args.json:
        if answer is not None:
            info["oom_answer"] = answer
        print(json.dumps(info, indent=2))
    else:
        print(format_summary(info))  # every line made printable there
        if answer is not None:
            from ..fmt import printable
            from .estimate import oom_answer_lines

            print("\n".join(printable(line) for line in oom_answer_lines(answer)))
    return EXIT_OK


def export_dir(first: str) -> Path:
    """Where ``export`` writes without ``--out``: ``./<stem>-export`` (run.gpuwatch: run-export)."""
    return Path(Path(first).stem + "-export")


def cmd_export(args: argparse.Namespace) -> int:
    """Write the recording's tables as CSV or JSON lines."""
    from ..store.export import TABLES, table, write

    names = [args.table] if args.table else list(TABLES)
    out = Path(args.out) if args.out else export_dir(args.file[0])
    to_stdout = bool(args.table and not args.out)
    if not to_stdout and not args.force:
        # Refuse before loading anything: a second export must not eat the first's files.
        taken = [out / f"{name}.{args.format}" for name in names]
        existing = [p for p in taken if p.exists()]
        if existing:
            if len(existing) == 1:
                raise CliError(f"{existing[0]} already exists (use --force to overwrite it)")
            raise CliError(
                f"{existing[0]} and {len(existing) - 1} more files already exist in {out} "
                "(use --force to overwrite them)"
            )
    # Not over a table being printed to this same terminal.
    with Progress(enabled=not (to_stdout and isatty(sys.stdout))) as shown:
        opened = _load(args.file, args.align, shown)
        empty: list[str] = []
        try:
            _reading(shown, opened, "exporting")
            if to_stdout:
                write(table(opened, args.table), args.format, sys.stdout)
                return EXIT_OK
            try:
                out.mkdir(parents=True, exist_ok=True)
                total = 0
                for name in names:
                    with open(out / f"{name}.{args.format}", "w", newline="") as f:
                        rows = write(table(opened, name), args.format, f)
                    total += rows
                    if rows == 0:
                        empty.append(name)
            except OSError as exc:
                raise CliError(f"cannot write to {out}: {exc.strerror or exc}")  # a bad --out
        finally:
            opened.close()
    note = ""
    if empty:
        what = "empty files" if args.format == "jsonl" else "a header row only"
        note = f" ({', '.join(empty)}: no rows, {what})"
    say(f"wrote {len(names)} tables, {total} rows, to {out}{os.sep}{note}")
    return EXIT_OK


COMMANDS = (
    Command(
        "replay",
        help="play a recording back in the dashboard",
        description="Replay a recording (also one still being written: it follows the tail). "
        "Several files (the hosts of one job, or several runs) replay as one session, lined "
        "up by each file's wall clock, their devices named by host.",
        options=_replay_options,
        run=cmd_replay,
    ),
    Command(
        "info",
        help="summarise a recording",
        description="Summarise a recording, or several merged as 'replay' shows them.",
        options=_info_options,
        run=cmd_info,
    ),
    Command(
        "export",
        help="write a recording's tables as CSV or JSON lines",
        description="Write flat tables (see docs/recording.md) for pandas / polars. Several "
        "files are merged as 'replay' shows them (device keys start with each file's host).",
        options=_export_options,
        run=cmd_export,
    ),
)
