"""The cluster view as plain lines: the grid's cells, its summary, the ranks table.

The Textual view (``gpuwatch.tui.cluster``) and ``gpuwatch cluster --once`` print the same
cells. Every label comes from Prometheus and is hostile: each is made printable and cut.
"""

from __future__ import annotations

from ..analysis.ranks import format_ranks
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


def cell_columns(gpu: Gpu, now: float) -> list[str]:
    """One GPU's columns: gpu, bar, used/total, rank, phase, peak/predicted, state."""
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
        ranks or "-",
        step,
        peak or "-",
        state_text(gpu, now),
    ]


HEAD = ["gpu", "memory", "used/total", "rank", "phase @step", "peak/pred", "state"]


def grid_lines(cluster: Cluster, now: float, sort: str = "host", text: str = "") -> list[str]:
    """The grid: a host line, then a line per GPU, columns aligned over the whole grid."""
    groups = cluster.cells(sort, text)
    rows: list[list[str]] = [HEAD]
    hosts: dict[int, str] = {}
    for host, gpus in groups:
        hosts[len(rows)] = f"{label(host, 60)}  ({printable(cluster.host_note(gpus))})"
        rows += [cell_columns(g, now) for g in gpus]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEAD))]
    out = []
    for i, row in enumerate(rows):
        if i in hosts:
            out.append(hosts[i])
        out.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    for host, note in cluster.lost_lines(text):
        out.append(f"{label(host, 60)}  ({printable(note)})")
    return out


def report(cluster: Cluster, now: float, sort: str = "host", text: str = "") -> list[str]:
    """Everything ``--once`` prints: the summary, the error, the grid, the ranks."""
    lines = [printable(cluster.summary())]
    if cluster.error:
        lines.append(f"! {printable(cluster.error)}")
    lines += grid_lines(cluster, now, sort, text)
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
