"""The cluster view as plain lines: the grid's cells, its summary, the ranks table.

The Textual view (``gpuwatch.tui.cluster``) and ``gpuwatch cluster --once`` print the same
cells. Every label comes from Prometheus and is hostile: each is made printable and cut.
"""

from __future__ import annotations

from ..analysis.rank_table import format_ranks
from ..fmt import ellipsis, fmt_duration, fmt_short, printable
from .model import STALE, Cluster, Gpu

BAR = 12
"""Cells of a GPU's used/total bar."""


def bar(fill: float, width: int = BAR) -> str:
    """``████▌░░░`` for a fill of 0 to 1, in eighths of a cell."""
    eighths = round(max(0.0, min(fill, 1.0)) * width * 8)
    full, part = divmod(eighths, 8)
    partial = " ▏▎▍▌▋▊▉"[part].strip() if part else ""
    return ("█" * full + partial).ljust(width, "░")[:width]


def label(text: str, width: int) -> str:
    """A label from Prometheus, safe to show and at most ``width`` wide."""
    return ellipsis(printable(text), width)


def state_text(gpu: Gpu, now: float) -> str:
    """``ok``, ``lost`` or ``stale 12s`` (how long since its series were last read)."""
    if gpu.state == STALE and gpu.seen:
        return f"stale {fmt_duration(max(0.0, now - gpu.seen) * 1e9)}"
    return gpu.state


def others_text(gpu: Gpu, width: int = 24) -> str:
    """The processes gpuwatch does not instrument on ``gpu``: the one holding the most
    memory, and how many more (``bob ollama 4.0G +1``); ``-`` when none."""
    if not gpu.others:
        return "-"
    more = f" +{len(gpu.others) - 1}" if len(gpu.others) > 1 else ""
    return label(gpu.others[0].text(), width - len(more)) + more


def panel_title(index: str, gpu: Gpu | None) -> str:
    """A host panel's title: the GPU, its sensors and the processes gpuwatch does not
    instrument on it (up to three, then how many more)."""
    parts = [f"GPU {label(index, 6)}"]
    if gpu is not None:
        if gpu.util is not None:
            parts.append(f"util {gpu.util:.0%}")
        if gpu.temp is not None:
            parts.append(f"{gpu.temp:.0f}°C")
        if gpu.power is not None:
            parts.append(f"{gpu.power:.0f}W")
        if gpu.others:
            shown = ", ".join(label(o.text(), 32) for o in gpu.others[:3])
            more = f" +{len(gpu.others) - 3}" if len(gpu.others) > 3 else ""
            parts.append(f"not instrumented: {shown}{more}")
    return " · ".join(parts)


def cell_columns(gpu: Gpu, now: float) -> list[str]:
    """One GPU's columns, as :data:`HEAD` names them."""
    used = f"{fmt_short(gpu.used)}/{fmt_short(gpu.total)}"
    ranks = ",".join(str(r) for r in gpu.ranks[:4]) + ("…" if len(gpu.ranks) > 4 else "")
    peak = ""
    if gpu.peak is not None or gpu.predicted is not None:
        peak = (
            fmt_short(gpu.peak)
            if gpu.predicted is None
            else (f"{fmt_short(gpu.peak)}/{fmt_short(gpu.predicted)}")
        )
        if gpu.peak is not None and gpu.predicted:
            peak += f" {gpu.peak / gpu.predicted - 1:+.0%}"
    step = f"{label(gpu.phase or '-', 16)}" + (f" @{gpu.step}" if gpu.step is not None else "")
    return [
        label(gpu.index, 6),
        bar(gpu.fill) if gpu.used is not None else "?" * BAR,
        used,
        "-" if gpu.util is None else f"{gpu.util:.0%}",
        "-" if gpu.temp is None else f"{gpu.temp:.0f}°C",
        "-" if gpu.power is None else f"{gpu.power:.0f}W",
        others_text(gpu),
        ranks or "-",
        step,
        peak or "-",
        state_text(gpu, now),
    ]


HEAD = [
    "gpu",
    "memory",
    "used/total",
    "util",
    "temp",
    "power",
    "others",
    "rank",
    "phase @step",
    "peak/pred",
    "state",
]

DROP_ORDER = ("memory", "power", "temp", "others", "util", "peak/pred", "rank")
"""Columns a narrow screen drops, the first first (``docs/cluster.md``): the bar says what
used/total says in figures; a host's panels show the sensors and the other processes.
gpu, used/total, phase @step and state always show; the phase is cut when even they do
not fit."""

GAP = 2
"""Cells between two columns."""


def fit_columns(widths: list[int], room: int) -> tuple[list[int], list[int]]:
    """The columns (indices into :data:`HEAD`) that fit in ``room`` cells, dropping by
    :data:`DROP_ORDER`, and their widths (the phase column narrowed where even the kept
    columns do not fit, to no less than 5 cells)."""
    keep = list(range(len(HEAD)))
    widths = list(widths)

    def total() -> int:
        return sum(widths[i] for i in keep) + GAP * (len(keep) - 1)

    for name in DROP_ORDER:
        if total() <= room:
            break
        keep.remove(HEAD.index(name))
    phase = HEAD.index("phase @step")
    if total() > room:
        widths[phase] = max(5, widths[phase] - (total() - room))
    return keep, [widths[i] for i in keep]


def grid_lines(
    cluster: Cluster, now: float, sort: str = "host", text: str = "", width: int = 1000
) -> list[str]:
    """The grid: a host line, then a line per GPU, columns aligned over the whole grid and
    dropped to fit ``width`` (:data:`DROP_ORDER`)."""
    groups = cluster.cells(sort, text)
    rows: list[list[str]] = [HEAD]
    hosts: dict[int, str] = {}
    for host, gpus in groups:
        hosts[len(rows)] = f"{label(host, 60)}  ({printable(cluster.host_note(gpus))})"
        rows += [cell_columns(g, now) for g in gpus]
    keep, widths = fit_columns([max(len(r[i]) for r in rows) for i in range(len(HEAD))], width - 2)
    out = []
    for i, row in enumerate(rows):
        if i in hosts:
            out.append(hosts[i])
        cells = [ellipsis(row[k], w).ljust(w) for k, w in zip(keep, widths, strict=True)]
        out.append("  " + "  ".join(cells).rstrip())
    for host, note in cluster.lost_lines(text):
        out.append(f"{label(host, 60)}  ({printable(note)})")
    return out


def report(
    cluster: Cluster, now: float, sort: str = "host", text: str = "", width: int = 1000
) -> list[str]:
    """Everything ``--once`` prints: the summary, the error, the grid (its columns fitted
    to ``width``), the ranks."""
    lines = [printable(cluster.summary())]
    if cluster.error:
        lines.append(f"! {printable(cluster.error)}")
    lines += grid_lines(cluster, now, sort, text, width)
    ranks = ranks_lines(cluster)
    if ranks:
        lines += ["", *ranks]
    return lines


def ranks_lines(cluster: Cluster) -> list[str]:
    """One ranks table per job (``job_id``), each under its job's name; [] when no
    process reports a rank."""
    out: list[str] = []
    for job, ranks in cluster.jobs.items():
        if out:
            out.append("")
        out.append(f"job {label(job, 80)}")
        out += [printable(line) for line in format_ranks(ranks)]
    return out
