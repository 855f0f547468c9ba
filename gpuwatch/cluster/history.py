"""One host's timelines from Prometheus range queries, for the cluster view's drill-down.

One range query for every line of the whole host (never one per GPU or per line), at
the scrape resolution: each line's expression tagged with its role
(``label_replace(..., "gpuwatch_role", ROLE, "", "")``), joined with ``or``. The answers
become per-GPU point arrays that the dashboard's chart asks for one dot column at a time
(:meth:`HostHistory.window`), and phase runs for its band (from
``gpuwatch_process_phase_info``, one series per phase at each scrape: a run lasts from
its first scrape to one resolution past its last).

:class:`Timelines` keeps them across the drill-down's refreshes: its evaluation times
are whole multiples of the step, so a refresh asks each family only for the steps since
its last answer (and :data:`OVERLAP` before, which a late scrape may have changed) and
joins them to what it holds; a new window or step asks the whole window again.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
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
"""The lines one drill-down refresh asks (in one query), ``{M}`` being the host's matchers. The
chart's roles are the dashboard's (``nvml``, ``reserved``, ``allocated``, ``predicted``,
``peak``); ``total`` sets its ceiling, ``phase`` feeds the band."""

QUERY_THREADS = 4
"""Range queries of one drill-down refresh in flight at once (one per group of roles
asked from the same step: one in the steady state)."""

ROLE_LABEL = "gpuwatch_role"
"""The label that says which role (:data:`ROLES`) a series of the combined query is."""

MAX_POINTS = 10_000
"""Points per series asked at most (Prometheus refuses more than 11,000)."""

OVERLAP = 2
"""Steps before the newest one held that a refresh asks again: an evaluation near the
present may have lacked a scrape that Prometheus had not ingested yet."""


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
    queries side by side (once; :class:`Timelines` for a view that refreshes).

    Raises:
        Cancelled: ``cancelled()`` became true while queries were in flight.
    """
    timelines = Timelines(host, matchers)
    return timelines.update(client, seconds=seconds, step=step, end=end, cancelled=cancelled)


PhaseKey = tuple[str, str, str, str]
"""A phase series: its GPU, rank, pid and phase name."""


def _join(
    held: tuple[np.ndarray, np.ndarray] | None,
    new: tuple[np.ndarray, np.ndarray] | None,
    since: int,
    start: int,
) -> tuple[np.ndarray, np.ndarray] | None:
    """``held``'s points before ``since`` then ``new``'s, from ``start`` on (None: none)."""
    parts_t, parts_v = [], []
    if held is not None:
        t, v = held
        keep = (t >= start) & (t < since)
        parts_t.append(t[keep])
        parts_v.append(v[keep])
    if new is not None:
        t, v = new
        keep = t >= max(since, start)
        parts_t.append(t[keep])
        parts_v.append(v[keep])
    if not parts_t:
        return None
    t = np.concatenate(parts_t)
    return (t, np.concatenate(parts_v)) if len(t) else None


class Timelines:
    """One host's range queries kept across refreshes, asked only for what is new.

    Each family is asked from the step after its last answer (less :data:`OVERLAP`
    steps) to now; its held points before that stay, those past the window go. A family
    that fails keeps what it held and is asked its whole gap next time. A new window
    length or step starts again from nothing.

    Args:
        host: The host's ``host`` label.
        matchers: The view's matchers (the host's is added).
    """

    def __init__(self, host: str, matchers: Sequence[tuple[str, str, str]]) -> None:
        self.host = host
        self._inner = selector("", host_matchers(host, matchers))
        self._shape: tuple[int, int] | None = None  # (window, step) in ns of what is held
        self._asked: dict[str, int] = {}  # role -> newest evaluation time answered (ns)
        self._lines: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}  # role -> gpu
        self._phases: dict[PhaseKey, np.ndarray] = {}  # evaluation times (ns) in the phase
        self.asked_points = 0
        """Evaluation times asked over every query so far (what incremental asking saves)."""

    def update(
        self,
        client: PromClient,
        *,
        seconds: float,
        step: float,
        end: float | None = None,
        cancelled: Callable[[], bool] = never,
    ) -> HostHistory:
        """Ask what is new up to ``end`` (now) and return the last ``seconds`` at ``step``.

        Raises:
            Cancelled: ``cancelled()`` became true while queries were in flight.
        """
        began = time.perf_counter()
        end = time.time() if end is None else end
        step_ms = max(1, round(max(step, seconds / MAX_POINTS, 0.001) * 1000))
        step_ns = step_ms * 1_000_000
        last = int(end * 1000) // step_ms * step_ns  # evaluation times: multiples of step
        first = last - max(1, math.ceil(seconds * NS / step_ns)) * step_ns
        shape = (int(seconds * NS), step_ns)
        if shape != self._shape:
            self._shape = shape
            self._asked.clear()
            self._lines.clear()
            self._phases.clear()
        starts = {role: self._since(role, first, step_ns) for role in ROLES}
        by_role = self._ask(client, starts, (last, step_ns), cancelled)
        errors: list[str] = []
        said: list[PromError] = []
        for role in ROLES:
            answer = by_role[role]
            if isinstance(answer, PromError):
                if answer not in said and (not errors or not answer.gone):
                    said.append(answer)  # one line for the roles of a failed query
                    errors.append(f"{role}: {answer}")
                continue
            self.asked_points += (last - starts[role]) // step_ns + 1
            self._join_role(role, answer, starts[role], first)
            self._asked[role] = last
        for role in ROLES:  # a failed family's points past the window go too
            if role in self._asked and self._asked[role] != last:
                self._join_role(role, [], last + 1, first)
        history = HostHistory(self.host, first, last, step_ns)
        for role, by_gpu in self._lines.items():
            for gpu, line in by_gpu.items():
                history.lines.setdefault(gpu, {})[role] = line
        history.lanes = _lanes_of(self._phases.items(), step_ns)
        history.error = "; ".join(errors) or None
        history.seconds = time.perf_counter() - began
        return history

    def _since(self, role: str, first: int, step_ns: int) -> int:
        """Where ``role`` is asked from: the window's start, or its last answer less
        :data:`OVERLAP` steps."""
        asked = self._asked.get(role)
        if asked is None or asked < first:
            return first
        return max(first, asked - OVERLAP * step_ns)

    def _ask(
        self,
        client: PromClient,
        starts: Mapping[str, int],
        until: tuple[int, int],
        cancelled: Callable[[], bool],
    ) -> dict[str, list[Series] | PromError]:
        """Each role's series from its start to ``until`` (last, step in ns), or the error
        of its query: the roles asked from one step share a query, the queries side by
        side."""
        last, step_ns = until
        gone: list[PromError] = []  # the server did not answer: the rest would wait as long

        def ask(group: tuple[int, list[str]]) -> list[Series] | PromError:
            if gone:
                return gone[0]
            begin, names = group
            promql = " or ".join(
                f"label_replace({ROLES[role].replace('{M}', self._inner)}, "
                f'"{ROLE_LABEL}", "{role}", "", "")'
                for role in names
            )
            try:
                return client.query_range(promql, begin / NS, last / NS, step_ns / NS)
            except PromError as exc:
                if exc.gone:
                    gone.append(exc)
                return exc

        groups: dict[int, list[str]] = {}
        for role, start in starts.items():
            groups.setdefault(start, []).append(role)
        by_role: dict[str, list[Series] | PromError] = {}
        for (_, names), got in zip(
            groups.items(), each(ask, list(groups.items()), QUERY_THREADS, cancelled), strict=True
        ):
            if isinstance(got, PromError):
                by_role.update(dict.fromkeys(names, got))
                continue
            split: dict[str, list[Series]] = {role: [] for role in names}
            for series in got:
                found = split.get(series.labels.get(ROLE_LABEL, ""))
                if found is not None:
                    found.append(series)
            by_role.update(split)
        return by_role

    def _join_role(self, role: str, answer: list[Series], since: int, start: int) -> None:
        """One role's answer into what is held (``phase``: the lanes; else a line a GPU)."""
        if role == "phase":
            self._join_phases(answer, since, start)
        else:
            self._join_lines(role, answer, since, start)

    def _join_lines(self, role: str, answer: list[Series], since: int, start: int) -> None:
        fresh: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for series in answer:
            gpu = series.labels.get("gpu", "")
            if gpu:
                fresh[gpu] = _arrays(series)
        held = self._lines.get(role, {})
        joined = {}
        for gpu in {**held, **fresh}:
            line = _join(held.get(gpu), fresh.get(gpu), since, start)
            if line is not None:
                joined[gpu] = line
        self._lines[role] = joined

    def _join_phases(self, answer: list[Series], since: int, start: int) -> None:
        fresh: dict[PhaseKey, np.ndarray] = {}
        for series in answer:
            key = _phase_key(series)
            if key is not None:
                fresh[key] = _arrays(series)[0]
        joined = {}
        for key in {**self._phases, **fresh}:
            held, new = self._phases.get(key), fresh.get(key)
            got = _join(
                (held, held) if held is not None else None,
                (new, new) if new is not None else None,
                since,
                start,
            )
            if got is not None:
                joined[key] = got[0]
        self._phases = joined


def _phase_key(series: Series) -> PhaseKey | None:
    """(gpu, rank, pid, phase) of a phase series; None without a GPU or a phase name."""
    labels = series.labels
    gpu, name = labels.get("gpu", ""), labels.get("phase", "")
    if not (gpu and name):
        return None
    return gpu, labels.get("rank", ""), labels.get("pid", ""), name


def _arrays(series: Series) -> tuple[np.ndarray, np.ndarray]:
    """A range series' times (unix ns, rounded to the millisecond) and values."""
    t = np.array([round(p[0] * 1000) for p in series.points], dtype=np.int64) * 1_000_000
    return t, np.array([p[1] for p in series.points], dtype=np.float64)


def _lanes(answer: list[Series], step: int) -> dict[str, list[Lane]]:
    """Phase runs per GPU and process: consecutive scrapes of one phase make one run."""
    found: dict[PhaseKey, np.ndarray] = {}
    for series in answer:
        key = _phase_key(series)
        if key is not None:
            found[key] = np.array([int(t * NS) for t, _ in series.points], np.int64)
    return _lanes_of(found.items(), step)


def _lanes_of(phases: Iterable[tuple[PhaseKey, np.ndarray]], step: int) -> dict[str, list[Lane]]:
    """Phase runs per GPU and process from each phase series' times (ns)."""
    by: dict[str, dict[tuple[str, str], Lane]] = defaultdict(dict)
    for (gpu, rank, pid, name), times in phases:
        key = (rank, pid)
        lane = by[gpu].get(key)
        if lane is None:
            label = f"rank {rank}" if rank else f"pid {pid}"
            lane = by[gpu][key] = Lane(label)
        run: PhaseRun | None = None
        for t in times.tolist():
            if run is not None and t - run.t1 <= step // 2:
                run.t1 = t + step
                continue
            run = PhaseRun(name, t, t + step)
            lane.runs.append(run)
    return {gpu: sorted(lanes.values(), key=lambda ln: ln.label) for gpu, lanes in by.items()}
