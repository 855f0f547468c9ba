"""One host's timelines from Prometheus range queries, for the cluster view's drill-down.

One range query per family for the whole host (never one per GPU), at the scrape
resolution. The answers become per-GPU point arrays that the dashboard's chart asks for
one dot column at a time (:meth:`HostHistory.window`), and phase runs for its band (from
``gpuwatch_process_phase_info``, one series per phase at each scrape: a run lasts from
its first scrape to one resolution past its last).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .background import each, never
from .client import PromClient, PromError, Series, quote, selector

NS = 1_000_000_000

ROLES = {
    "nvml": "gpuwatch_gpu_memory_used_bytes{M}",
    "total": "max by (host, gpu) (gpuwatch_gpu_memory_total_bytes{M})",
    "reserved": "sum by (host, gpu) (gpuwatch_process_torch_reserved_bytes{M})",
    "allocated": "sum by (host, gpu) (gpuwatch_process_torch_allocated_bytes{M})",
    "predicted": "sum by (host, gpu) (gpuwatch_process_predicted_bytes{M})",
    "peak": "max by (host, gpu) (gpuwatch_process_phase_peak_allocated_bytes{M})",
    "phase": "gpuwatch_process_phase_info{M} == 1",
}
"""The families one drill-down refresh asks, ``{M}`` being the host's matchers. The
chart's roles are the dashboard's (``nvml``, ``reserved``, ``allocated``, ``predicted``,
``peak``); ``total`` sets its ceiling, ``phase`` feeds the band."""

QUERY_THREADS = 4
"""Range queries of one drill-down refresh in flight at once."""

MAX_POINTS = 10_000
"""Points per series asked at most (Prometheus refuses more than 11,000)."""


@dataclass
class PhaseRun:
    """A phase a process was in, from one scrape to the last consecutive one."""

    name: str
    t0: int
    t1: int


@dataclass
class Lane:
    """One process's band row on a GPU: its label and its phase runs."""

    label: str
    runs: list[PhaseRun] = field(default_factory=list)


@dataclass
class HostHistory:
    """The host's series over ``[start, end]`` (unix ns), ``step`` ns apart.

    Attributes:
        lines: ``gpu -> role -> (times ns, values)``.
        lanes: ``gpu -> process rows`` for the band.
        error: Why a family could not be read (its lines are missing), else None.
    """

    host: str
    start: int
    end: int
    step: int
    lines: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    lanes: dict[str, list[Lane]] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0

    def gpus(self) -> list[str]:
        keys = set(self.lines) | set(self.lanes)
        return sorted(keys, key=lambda g: (not g.isdigit(), int(g) if g.isdigit() else 0, g))

    def total(self, gpu: str) -> float | None:
        _, v = self.lines.get(gpu, {}).get("total", (None, None))
        return float(np.nanmax(v)) if v is not None and len(v) else None

    def window(
        self, gpu: str, role: str, t0: int, t1: int, n: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Low and high of ``role`` in each of ``n`` columns over ``[t0, t1]`` (NaN: none).

        A scrape holds until the next one (a gauge's value stands between samples), so a
        column between two scrapes shows the older one rather than a gap.
        """
        lo = np.full(n, np.nan)
        hi = np.full(n, np.nan)
        line = self.lines.get(gpu, {}).get(role)
        if line is None or n <= 0 or t1 <= t0:
            return lo, hi
        t, v = line
        width = (t1 - t0) / n
        # Each sample covers [t, t + step): the columns it overlaps show it. Vectorised
        # over the samples (every panel asks each role at each paint), one pass per column
        # a sample can span.
        first = np.clip(((t - t0) // width).astype(np.int64), -1, n)
        last = np.clip(((t + self.step - 1 - t0) // width).astype(np.int64), -1, n)
        keep = (last >= 0) & (first < n) & ~np.isnan(v)
        first, last, v = np.maximum(first[keep], 0), np.minimum(last[keep], n - 1), v[keep]
        if not len(v):
            return lo, hi
        for k in range(int((last - first).max()) + 1):
            at = first + k
            inside = at <= last
            np.fmin.at(lo, at[inside], v[inside])
            np.fmax.at(hi, at[inside], v[inside])
        return lo, hi


def host_matchers(
    host: str, matchers: Sequence[tuple[str, str, str]]
) -> list[tuple[str, str, str]]:
    """The view's matchers narrowed to one host."""
    return [*matchers, ("host", "=", quote(host))]


def load(
    client: PromClient,
    host: str,
    matchers: Sequence[tuple[str, str, str]],
    *,
    seconds: float,
    step: float,
    end: float | None = None,
    cancelled: Callable[[], bool] = never,
) -> HostHistory:
    """The host's timelines over the last ``seconds``, ``step`` seconds apart, the range
    queries side by side.

    Raises:
        Cancelled: ``cancelled()`` became true while queries were in flight.
    """
    end = time.time() if end is None else end
    step = max(step, seconds / MAX_POINTS, 0.001)
    start = end - seconds
    began = time.perf_counter()
    inner = selector("", host_matchers(host, matchers))
    history = HostHistory(host, int(start * NS), int(end * NS), int(step * NS))
    errors = []
    gone: list[PromError] = []  # the server did not answer: the rest would wait as long

    def ask(role: str) -> list[Series] | PromError:
        if gone:
            return gone[0]
        try:
            return client.query_range(ROLES[role].replace("{M}", inner), start, end, step)
        except PromError as exc:
            if exc.gone:
                gone.append(exc)
            return exc

    roles = list(ROLES)
    for role, answer in zip(roles, each(ask, roles, QUERY_THREADS, cancelled), strict=True):
        if isinstance(answer, PromError):
            if not errors or not answer.gone:
                errors.append(f"{role}: {answer}")
            continue
        if role == "phase":
            history.lanes = _lanes(answer, history.step)
        else:
            for series in answer:
                gpu = series.labels.get("gpu", "")
                if not gpu:
                    continue
                t = np.array([p[0] for p in series.points]) * NS
                v = np.array([p[1] for p in series.points], dtype=np.float64)
                history.lines.setdefault(gpu, {})[role] = (t.astype(np.int64), v)
    history.error = "; ".join(errors) or None
    history.seconds = time.perf_counter() - began
    return history


def _lanes(answer: list[Series], step: int) -> dict[str, list[Lane]]:
    """Phase runs per GPU and process: consecutive scrapes of one phase make one run."""
    by: dict[str, dict[tuple[str, str], Lane]] = defaultdict(dict)
    for series in answer:
        labels = series.labels
        gpu, pid, name = labels.get("gpu", ""), labels.get("pid", ""), labels.get("phase", "")
        if not gpu or not name:
            continue
        rank = labels.get("rank", "")
        key = (rank, pid)
        lane = by[gpu].get(key)
        if lane is None:
            label = f"rank {rank}" if rank else f"pid {pid}"
            lane = by[gpu][key] = Lane(label)
        run: PhaseRun | None = None
        for t_s, _ in series.points:
            t = int(t_s * NS)
            if run is not None and t - run.t1 <= step // 2:
                run.t1 = t + step
                continue
            run = PhaseRun(name, t, t + step)
            lane.runs.append(run)
    return {gpu: sorted(lanes.values(), key=lambda ln: ln.label) for gpu, lanes in by.items()}
