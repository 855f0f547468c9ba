"""``gpuwatch --once`` (``-1``): one table of every GPU and its processes, then exit.

Per GPU: name, memory used/total, utilisation, temperature, power, and torch's reserved
and allocated memory with the phase of each instrumented process on it; then every
process (the Processes tab's rows). Where a gpuwatch owns the annotation socket its
session's figures are printed (torch's included); else NVML's alone. ``--json`` prints
the same as one JSON document. No terminal is needed: it writes to a pipe or a file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Any

from ._common import EXIT_OK, CliError

GPU_HEAD = ("GPU", "name", "memory used/total", "util", "temp", "power", "torch res/alloc")
PROC_HEAD = ("pid", "user", "GPU", "GPU mem", "SM%", "CPU%", "RSS", "elapsed", "rank", "phase")
RIGHT = {"GPU", "memory used/total", "util", "temp", "power", "torch res/alloc", "pid"}
RIGHT |= {"GPU mem", "SM%", "CPU%", "RSS", "elapsed", "rank"}


def _checked(args: argparse.Namespace) -> None:
    """``--json`` without ``--once``, or dashboard-only options with it: one line, exit 2."""
    if getattr(args, "json", False) and not getattr(args, "once", False):
        raise CliError("--json goes with --once (-1): gpuwatch --once --json")
    for flag, given in (
        ("--record", getattr(args, "record", None)),
        ("--prometheus", getattr(args, "prometheus", None)),
        ("--readonly", getattr(args, "readonly", False)),
    ):
        if given:
            raise CliError(f"{flag} is for the dashboard, not --once, which records nothing")


def cmd_once(args: argparse.Namespace) -> int:
    """Print the table (or the JSON document) and exit."""
    _checked(args)
    from ..live_sources import read_once

    doc = read_once(args.socket, interval=args.interval / 1000)
    if args.json:
        text = json.dumps(doc, indent=1, ensure_ascii=False)
    else:
        width = shutil.get_terminal_size((0, 0)).columns if sys.stdout.isatty() else 0
        text = render(doc, width)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    return EXIT_OK


# --------------------------------------------------------------------------- the table


def _size(n: Any) -> str:
    from ..fmt import fmt_short

    return fmt_short(n) if isinstance(n, int | float) else "-"


def _pct(v: Any) -> str:
    return f"{v:.0f}%" if isinstance(v, int | float) else "-"


def _gpu_row(g: dict[str, Any]) -> tuple[str, ...]:
    used, total = g["used"], g["total"]
    memory = f"{_size(used)}/{_size(total)}"
    if isinstance(used, int | float) and isinstance(total, int | float) and total > 0:
        memory += f" {used / total:4.0%}"
    power = "-"
    if isinstance(g["power"], int | float):
        limit = g["power_limit"]
        power = f"{g['power']:.0f}" + (f"/{limit:.0f}" if isinstance(limit, int | float) else "")
        power += " W"
    torch = "-"
    if g["torch_reserved"] is not None or g["torch_allocated"] is not None:
        torch = f"{_size(g['torch_reserved'])}/{_size(g['torch_allocated'])}"
    temp = f"{g['temp']:.0f}°C" if isinstance(g["temp"], int | float) else "-"
    index = "-" if g["index"] is None else str(g["index"])
    state = "" if g["state"] in (None, "ok") else f" ({g['state']})"
    return (index, (g["name"] or "") + state, memory, _pct(g["util"]), temp, power, torch)


def _proc_row(p: dict[str, Any]) -> tuple[str, ...]:
    from ..fmt import fmt_duration

    elapsed = p["elapsed"]
    return (
        str(p["pid"]) if p["pid"] is not None else "-",
        p["user"] or "-",
        p["device"] or "-",
        _size(p["gpu_mem"]),
        _pct(p["sm"]),
        _pct(p["cpu"]),
        _size(p["rss"]),
        fmt_duration(int(elapsed * 1e9)) if isinstance(elapsed, int | float) else "-",
        "-" if p["rank"] is None else str(p["rank"]),
        p["phase"] or "-",
    )


def _columns(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(c) for c in col) for col in zip(head, *rows, strict=True)]
    out = []
    for row in (head, *rows):
        cells = [
            c.rjust(w) if name in RIGHT else c.ljust(w)
            for c, w, name in zip(row, widths, head, strict=True)
        ]
        out.append("  ".join(cells))
    return out


def _cut(line: str, width: int) -> str:
    return line if width <= 0 or len(line) <= width else line[: width - 1] + "…"


def render(doc: dict[str, Any], width: int = 0) -> str:
    """The table of a (clean) ``--once`` document; lines cut to ``width`` (0: not cut)."""
    lines = [f"gpuwatch --once · {doc['source'] or 'NVML'} · {os.uname().nodename}"]
    gpus = doc["gpus"]
    if gpus:
        lines += _columns(GPU_HEAD, [_gpu_row(g) for g in gpus])
        for g in gpus:
            for phase in g["phases"]:
                lines.append(f"  GPU {g['index']}: {phase}")
    else:
        lines.append("no GPU")
    for u in doc["unattributed"]:
        lines.append(f"{u['gpu']}: {_size(u['bytes'])} used that NVML attributes to no process")
    procs = doc["processes"]
    lines.append("")
    if procs:
        rows = [_proc_row(p) for p in procs]
        table = _columns((*PROC_HEAD, "command"), [(*r, "") for r in rows])
        lines.append(table[0].rstrip())
        for row_text, p in zip(table[1:], procs, strict=True):
            lines.append(row_text.rstrip() + " " + (p["command"] or ""))
    else:
        lines.append("no process on any GPU")
    lines += [f"note: {n}" for n in doc["notes"]]
    return "\n".join(_cut(line, width) for line in lines)
