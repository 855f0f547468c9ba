"""The cluster as Prometheus names it: one cell per GPU (host:index), grouped by host.

:func:`fetch` asks every metric family in one instant query (two when a job label is
matched, one more for a GPU row's own figures when only the targets near the grid's view
are asked; never one per GPU or per family) and :meth:`Cluster.apply` folds the answers
in. What a refresh could not read keeps its last
good figures, marked stale: a refresh that failed marks every cell stale with one line
that says why; a GPU whose series are gone (its exporter stopped answering, so Prometheus
ended them) is stale since the refresh that last had it; a GPU NVML lost is ``lost``.
The ranks (a process with a ``rank`` label) become :class:`~gpuwatch.analysis.rank_table.RankRow`
rows, so the ranks table is the one ``gpuwatch info`` prints.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..analysis.rank_table import RankPhase, RankRow, Ranks, compare
from ..fmt import ellipsis, fmt_bytes, fmt_short, printable
from ..protocol import job_id
from .background import each, never
from .client import PromClient, PromError, Series, quote, selector

OK, LOST, STALE = "ok", "lost", "stale"

SORTS = ("memory", "headroom", "host", "rank")
"""The grid's orders: fullest first, least headroom first, by host, by rank."""

MAX_GPUS = 4096
"""Most GPUs the view keeps (more series than that come from a --match too wide)."""

FORGET_S = 3600.0
"""A GPU whose series have been gone this long (seconds) leaves the view: an elastic job's
hosts come and go, and the cells of those gone for good must not fill it up."""

FAMILIES = (
    "gpuwatch_gpu_memory_total_bytes",
    "gpuwatch_gpu_memory_used_bytes",
    "gpuwatch_gpu_up",
    "gpuwatch_gpu_utilization_ratio",
    "gpuwatch_gpu_temperature_celsius",
    "gpuwatch_gpu_power_watts",
    "gpuwatch_gpu_process_memory_bytes",
    "gpuwatch_process_phase_info",
    "gpuwatch_process_step",
    "gpuwatch_process_phase_peak_allocated_bytes",
    "gpuwatch_process_predicted_peak_bytes",
    "gpuwatch_rank_info",
    "up",
)
"""What one refresh asks, all the families that take the same matchers in one instant
query (:func:`family_queries`). ``gpuwatch_rank_info`` (the rank's layout) is read when
the exporter has it; ``up`` tells which scrape targets answer."""

SLOW = ("gpuwatch_gpu_memory_total_bytes", "gpuwatch_rank_info")
"""Families whose figures hardly ever change (a GPU's memory, a rank's layout): asked only
every :data:`SLOW_EVERY` refreshes, or at once when the cluster lacks what they say
(:meth:`Cluster.wants_slow`); a refresh without them keeps what they said."""

SLOW_EVERY = 10
"""Refreshes between two readings of the :data:`SLOW` families."""


JOB_LABELS = (
    "slurm_job",
    "slurm_step",
    "k8s_namespace",
    "k8s_pod",
    "job_name",
    "torch_run",
    "job_id",
)
"""The scheduler's labels, which the exporter puts on process series only
(docs/prometheus.md): a ``--match`` on one selects the job's processes, and the view shows
the GPUs of the hosts they run on."""


SENSORS = {
    "gpuwatch_gpu_utilization_ratio": "util",
    "gpuwatch_gpu_temperature_celsius": "temp",
    "gpuwatch_gpu_power_watts": "power",
}
"""NVML's other figures of a GPU, the cell's attribute each fills."""

HOST_FAMILIES = (
    "gpuwatch_gpu_memory_used_bytes",
    "gpuwatch_gpu_up",
    *SENSORS,
    "gpuwatch_gpu_process_memory_bytes",
)
"""What a refresh under a host's panels asks, of that host only: the figures its panels'
titles show (:meth:`Cluster.apply` folds them into its cells and nothing else)."""

ROW_FAMILIES = (*SENSORS, "gpuwatch_gpu_process_memory_bytes")
"""Families that only a GPU's grid row shows (no sort, filter, summary or ranks table
reads them): a refresh may ask them of the targets near the grid's view only
(:func:`fetch`'s ``near``): at 64 hosts they are two thirds of the answer, and a screen
shows a tenth of the GPUs."""

MAX_NEAR = 64
"""Most targets a refresh names in its query of the :data:`ROW_FAMILIES` (more: every
target is asked)."""

_TARGET = re.compile(r"[\x21-\x7e]{1,256}")
"""A target :func:`fetch` names in a regex matcher (anything else: every target is
asked, rather than trust an escape to both Python's and Prometheus' regex syntax)."""


def family_matchers(
    family: str, matchers: Sequence[tuple[str, str, str]]
) -> list[tuple[str, str, str]]:
    """The matchers a family's query takes: a GPU or ``up`` series has no job labels, so a
    matcher on one would select nothing there."""
    if family.startswith("gpuwatch_process_") or family == "gpuwatch_rank_info":
        return list(matchers)
    return [m for m in matchers if m[0] not in JOB_LABELS]


PHASE_WIDTH = 24
"""Widest phase name in the ranks tables (a column each): longer ones are cut with ``…``."""

LAST_KNOWN = (
    "gpuwatch_gpu_memory_total_bytes",
    "gpuwatch_gpu_memory_used_bytes",
    "gpuwatch_gpu_up",
)
"""Families asked again over the last :data:`FORGET_S` for the targets Prometheus reports
down (``up == 0``), so that a host whose exporter was gone before the view started shows
with its last known figures."""

MAX_DOWN_ASKED = 256
"""Most down targets whose last figures one refresh asks for."""

QUERY_THREADS = 4
"""Queries of one refresh in flight at once (Prometheus answers each on its own thread)."""


def host_of(labels: Mapping[str, str]) -> str:
    """The host a series is from: its ``host`` label, else its scrape target."""
    return labels.get("host") or labels.get("instance") or "?"


def _key(labels: Mapping[str, str]) -> str | None:
    """A GPU series' cell key, ``host:index`` (None: the series names no GPU)."""
    index = labels.get("gpu")
    if not index:
        return None
    return f"{host_of(labels)}:{index}"


_GPU_FIGURES = {
    "gpuwatch_gpu_memory_total_bytes": "total",
    "gpuwatch_gpu_memory_used_bytes": "used",
    "gpuwatch_gpu_up": "up",
}
"""The families that make a GPU's cell, the figure each sets."""


def _int(text: str | None) -> int | None:
    if text is None or not text.strip().lstrip("-").isdigit() or len(text) > 18:
        return None
    return int(text)


def _bytes(value: float) -> int | None:
    """A byte figure from a sample value (NaN, infinities and negatives are not bytes)."""
    if value != value or value in (float("inf"), float("-inf")) or value < 0:
        return None
    return int(min(value, 2**62))


@dataclass(frozen=True)
class Other:
    """A process on a GPU that gpuwatch does not instrument, as NVML lists it."""

    pid: int
    user: str
    command: str
    used: int

    def text(self) -> str:
        """``bob ollama 4.0G`` (``pid 77`` where its host could not see who it is)."""
        who = " ".join(x for x in (self.user, self.command) if x) or f"pid {self.pid}"
        return f"{who} {fmt_short(self.used)}"


MAX_OTHERS = 16
"""Non-instrumented processes kept per GPU."""


@dataclass
class Gpu:
    """One GPU cell: the newest figures Prometheus had for it."""

    host: str
    index: str
    name: str = ""
    instance: str = ""
    used: int | None = None
    total: int | None = None
    util: float | None = None
    """NVML utilisation, 0 to 1."""
    temp: float | None = None
    """Core temperature, °C."""
    power: float | None = None
    """Power draw, watts."""
    others: tuple[Other, ...] = ()
    """Processes on it that gpuwatch does not instrument, the most memory first."""
    up: bool = True
    ranks: tuple[int, ...] = ()
    phase: str | None = None
    step: int | None = None
    peak: int | None = None
    predicted: int | None = None
    seen: float = 0.0
    """Wall time (unix s) of the refresh that last had its series."""
    state: str = OK

    @property
    def key(self) -> str:
        return f"{self.host}:{self.index}"

    @property
    def headroom(self) -> int | None:
        if self.used is None or self.total is None:
            return None
        return self.total - self.used

    @property
    def fill(self) -> float:
        """used / total, 0 when unknown."""
        if self.used is None or not self.total:
            return 0.0
        return min(max(self.used / self.total, 0.0), 1.0)

    def put(self, family: str, value: float) -> None:
        """Take a series' value of a memory total, memory used or up family."""
        if family.endswith("total_bytes"):
            self.total = _bytes(value)
        elif family.endswith("used_bytes"):
            self.used = _bytes(value)
        else:
            self.up = value == 1

    def text(self) -> str:
        """What the filter matches against."""
        ranks = " ".join(f"rank {r}" for r in self.ranks)
        return f"{self.key} {self.name} {ranks} {self.phase or ''} {self.state}".lower()


@dataclass
class Answers:
    """One refresh's answers: the series of every family asked, or why a family failed."""

    at: float
    series: dict[str, list[Series]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    by_job: bool = False  # a matcher named a job label: only the job's hosts are shown
    last: dict[str, list[Series]] = field(default_factory=dict)
    """Per family of :data:`LAST_KNOWN`, the newest point of the down targets' series."""
    host: str | None = None
    """Only this host's figures were asked (:data:`HOST_FAMILIES`, under its panels)."""
    near: frozenset[str] | None = None
    """The targets whose :data:`ROW_FAMILIES` were asked (None: every target's)."""


NOT_ONE = ("gpuwatch_gpu_up", "up")
"""Families whose series are 1 but for the rare GPU NVML lost or target down: asked as
``(FAMILY != 1)`` joined to the query by ``or on(__name__)``, so that the answer carries
only the GPUs that are not up (a GPU the other families name and this one does not is up:
:meth:`Cluster.apply`) and the targets that are down (all the view reads of ``up``)."""


def family_queries(
    matchers: Sequence[tuple[str, str, str]] = (),
    families: Sequence[str] = FAMILIES,
    near: Collection[str] | None = None,
) -> list[tuple[str, tuple[str, ...]]]:
    """The instant queries of one refresh and the families each answers: every family (of
    ``families``) that takes the same matchers in one selector on the metric name
    (``{__name__=~"a|b|...",...}``, those of :data:`NOT_ONE` joined as ``or on(__name__)
    (F{...} != 1)``): one query without a job matcher, two with one. ``near``: the
    :data:`ROW_FAMILIES` are asked of these targets only (``instance=~"a|b"``), in a query
    of their own (none for no target)."""
    groups: dict[tuple[tuple[str, str, str], ...], list[str]] = {}
    for family in families:
        these = family_matchers(family, matchers)
        if near is not None and family in ROW_FAMILIES:
            if not near:
                continue
            regex = "|".join(re.escape(i) for i in sorted(near))
            these.append(("instance", "=~", quote(regex)))
        groups.setdefault(tuple(these), []).append(family)
    out = []
    for m, names in groups.items():
        plain = [n for n in names if n not in NOT_ONE]
        parts = [selector("", [("__name__", "=~", "|".join(plain)), *m])] if plain else []
        parts += [f"({selector(n, m)} != 1)" for n in names if n in NOT_ONE]
        # ``on(__name__)``: a plain ``or`` matches series on their labels without the
        # name, so a lost GPU's ``gpuwatch_gpu_up`` would give way to its memory total.
        out.append((" or on(__name__) ".join(parts), tuple(names)))
    return out


def _near(near: Collection[str] | None, host: str | None) -> Collection[str] | None:
    """``near`` as :func:`fetch` asks it: None (every target) under a host's panels, past
    :data:`MAX_NEAR` targets, or for a target a regex matcher should not name."""
    if near is not None and (
        host is not None or len(near) > MAX_NEAR or not all(map(_TARGET.fullmatch, near))
    ):
        return None
    return near


def _asked(slow: bool, host: str | None) -> Sequence[str]:
    """The families one refresh asks: a host's, else all (less the :data:`SLOW` ones)."""
    if host is not None:
        return HOST_FAMILIES
    return FAMILIES if slow else tuple(f for f in FAMILIES if f not in SLOW)


def _by_name(names: Sequence[str], got: list[Series]) -> dict[str, list[Series]]:
    """One query's series by family (``__name__``): every family it asked, if empty."""
    split: dict[str, list[Series]] = {name: [] for name in names}
    for series in got:
        found = split.get(series.labels.get("__name__", ""))
        if found is not None:
            found.append(series)
    return split


def _last_known(
    client: PromClient,
    matchers: Sequence[tuple[str, str, str]],
    down: Sequence[str],
    at: float,
    cancelled: Callable[[], bool],
    gone: Sequence[PromError],
) -> dict[str, list[Series]]:
    """The :data:`LAST_KNOWN` families' last figures of the ``down`` targets, best effort
    (a family that failed is left out: the host shows as lost)."""
    regex = "|".join(re.escape(i) for i in down)

    def ask_last(family: str) -> tuple[str, list[Series] | PromError]:
        if gone:  # the first round's server did not answer: this one would wait as long
            return family, gone[0]
        m = [*family_matchers(family, matchers), ("instance", "=~", quote(regex))]
        try:
            promql = f"last_over_time({selector(family, m)}[{int(FORGET_S)}s])"
            return family, client.query(promql, at=at)
        except PromError as exc:
            return family, exc

    got = each(ask_last, LAST_KNOWN, QUERY_THREADS, cancelled)
    return {family: last for family, last in got if not isinstance(last, PromError)}


def _others(series: Iterable[Series]) -> dict[str | None, list[Other]]:
    """The processes no gpuwatch instruments, by GPU key (a malformed series is left out)."""
    others: dict[str | None, list[Other]] = defaultdict(list)
    for one in series:
        labels = one.labels
        pid, used = _int(labels.get("pid")), _bytes(one.value)
        if labels.get("instrumented") == "1" or pid is None or used is None:
            continue
        user, command = labels.get("user", ""), labels.get("command", "")
        others[_key(labels)].append(Other(pid, user, command, used))
    return others


def _error_line(errors: Mapping[str, str]) -> str | None:
    """One line about the families a refresh could not read (None: it read them all)."""
    if not errors:
        return None
    family, why = next(iter(errors.items()))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{family}: {why}{more}"


def fetch(
    client: PromClient,
    matchers: Sequence[tuple[str, str, str]] = (),
    at: float | None = None,
    cancelled: Callable[[], bool] = never,
    live: Collection[str] = (),
    slow: bool = True,
    host: str | None = None,
    near: Collection[str] | None = None,
) -> Answers:
    """Ask every family, all at the same instant, in as few queries as their matchers
    allow (:func:`family_queries`), side by side; a failure is kept per family (every
    family of the query that failed).

    ``live``: targets whose figures the caller already had live (:meth:`Cluster.live`):
    when one goes down its last figures are the caller's own, and are not asked again.
    ``slow``: ask the :data:`SLOW` families too (a refresh without them keeps what they
    said last: :meth:`Cluster.apply`).
    ``host``: ask only that host's :data:`HOST_FAMILIES` (a refresh under its panels).
    ``near``: ask the :data:`ROW_FAMILIES` of these targets only (the grid's rows near its
    view; at most :data:`MAX_NEAR`, else every target's).

    Raises:
        Cancelled: ``cancelled()`` became true while queries were in flight (they end on
            their own threads, which nobody waits for; see :mod:`.background`).
    """
    at = time.time() if at is None else at
    start = time.perf_counter()
    near = _near(near, host)
    answers = Answers(
        at,
        by_job=any(m[0] in JOB_LABELS for m in matchers),
        host=host,
        near=None if near is None else frozenset(near),
    )
    if host is not None:
        matchers = [*matchers, ("host", "=", quote(host))]

    gone: list[PromError] = []  # the server did not answer: the rest would wait as long

    def ask(query: tuple[str, tuple[str, ...]]) -> list[Series] | PromError:
        if gone:
            return gone[0]
        try:
            return client.query(query[0], at=at)
        except PromError as exc:
            if exc.gone:
                gone.append(exc)
            return exc

    queries = family_queries(matchers, _asked(slow, host), answers.near)
    for (_, names), got in zip(queries, each(ask, queries, QUERY_THREADS, cancelled), strict=True):
        if isinstance(got, PromError):
            answers.errors.update(dict.fromkeys(names, str(got)))
        else:
            answers.series.update(_by_name(names, got))
    up = answers.series.get("up", [])
    down = sorted({x.labels.get("instance", "") for x in up if x.value == 0} - {"", *live})
    del down[MAX_DOWN_ASKED:]
    if down and host is None:  # a second round, only while a target is down
        answers.last.update(_last_known(client, matchers, down, at, cancelled, gone))
    answers.seconds = time.perf_counter() - start
    return answers


@dataclass(frozen=True)
class Worst:
    """The rank that stands out most: its job, rank and host, and why."""

    job: str
    rank: int
    host: str
    why: str


@dataclass
class _Process:
    host: str
    pid: int
    gpu: str | None
    job: str = ""
    rank: int | None = None
    step: int | None = None
    phase: str | None = None
    peaks: dict[str, int] = field(default_factory=dict)
    predicted: int | None = None
    strategy: str | None = None
    world_size: int | None = None
    info: bool = False
    """A ``gpuwatch_rank_info`` series was read for it (:meth:`Cluster.wants_slow`)."""


def _peaks(
    series: Iterable[Series], proc: Callable[[Series], _Process | None]
) -> dict[tuple[str, int], dict[str, int]]:
    """Each process's phase peaks, by (host, pid), from their family's series."""
    fresh: dict[tuple[str, int], dict[str, int]] = defaultdict(dict)
    for one in series:
        p = proc(one)
        peak = _bytes(one.value)
        name = one.labels.get("phase")
        if p is not None and peak is not None and name:
            fresh[(p.host, p.pid)][name] = peak
    return fresh


def _rank_info(p: _Process, labels: Mapping[str, str]) -> None:
    """A ``gpuwatch_rank_info`` series' layout into its process."""
    p.info = True
    strategy = labels.get("strategy")
    if strategy and strategy != "unknown":  # "unknown": no layout facts yet
        p.strategy = strategy
    p.world_size = _int(labels.get("world_size")) or p.world_size


class Cluster:
    """Every GPU the series name, kept across refreshes.

    Attributes:
        gpus: Cells by ``host:index``.
        error: One line about the newest refresh (None: it read everything).
        refreshed: Wall time of the newest refresh that read something.
        jobs: The ranks side by side, one table per job (``job_id``), by job.
        down: Scrape targets (``instance``) whose newest ``up`` is 0, and their host.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.gpus: dict[str, Gpu] = {}
        self.error: str | None = None
        self.refreshed: float | None = None
        self.jobs: dict[str, Ranks] = {}
        self.down: dict[str, str] = {}
        self._procs: dict[tuple[str, int], _Process] = {}
        # Processes missing from the last refreshes (a scrape that timed out): what they
        # said is theirs again when they are back, whatever families that refresh read.
        self._away: dict[tuple[str, int], tuple[float, _Process]] = {}
        self._clock = clock

    # ------------------------------------------------------------------ folding answers

    def failed(self, error: str) -> None:
        """A refresh read nothing: every figure is kept, every cell marked stale."""
        self.error = error
        for gpu in self.gpus.values():
            gpu.state = STALE

    def apply(self, answers: Answers) -> None:
        """Fold one refresh in (see the module's note on what is kept). A refresh of one
        host's figures (``answers.host``) updates those of its cells that exist, and
        nothing else: states, ranks and the other hosts stay as the last whole refresh
        left them (a failed one changes nothing)."""
        if answers.host is not None:
            self._figures(answers.series, make=False, host=answers.host)
            return
        core = ("gpuwatch_gpu_memory_total_bytes", "gpuwatch_gpu_memory_used_bytes")
        s = answers.series
        asked = [f for f in core if f in s or f in answers.errors]  # SLOW: total not always
        if asked and all(f in answers.errors for f in asked):
            self.failed(answers.errors[asked[0]])
            return
        self.refreshed = answers.at
        self.error = _error_line(answers.errors)
        if "up" in s:
            self.down = {
                x.labels.get("instance", ""): host_of(x.labels) for x in s["up"] if x.value == 0
            }
            self.down.pop("", None)
        seen = self._figures(s, make=True, near=answers.near)
        kept = self._last_known(answers.last, seen)
        self._processes(s, answers.at)
        if answers.by_job:  # the GPUs of the hosts the matched processes run on
            hosts = {p.host for p in self._procs.values()}
            for key in [k for k, g in self.gpus.items() if g.host not in hosts]:
                del self.gpus[key]
            seen = {k for k in seen if k in self.gpus}
        failed_core = any(f in answers.errors for f in (*core, "gpuwatch_gpu_up"))
        for key in [
            k
            for k, g in self.gpus.items()
            if k not in seen and k not in kept and answers.at - g.seen > FORGET_S
        ]:
            del self.gpus[key]
        for key, cell in self.gpus.items():
            if key in seen:
                cell.seen = answers.at
            if key not in seen or failed_core or cell.instance in self.down:
                cell.state = STALE
            elif not cell.up:
                cell.state = LOST
            else:
                cell.state = OK

    def _last_known(self, last: Mapping[str, list[Series]], seen: set[str]) -> set[str]:
        """Fold in the last figures of the GPUs of down targets (those not ``seen`` live
        this refresh) and return their keys; a cell this view had live keeps its own."""
        kept: set[str] = set()
        for family in LAST_KNOWN:
            for series in last.get(family, []):
                key = _key(series.labels)
                if key is None or key in seen or (cell := self._cell(key, series.labels)) is None:
                    continue
                kept.add(key)
                if cell.seen:  # this view had it live: its own last figures stand
                    continue
                cell.put(family, series.value)
        return kept

    def _figures(
        self,
        s: Mapping[str, list[Series]],
        make: bool,
        host: str | None = None,
        near: frozenset[str] | None = None,
    ) -> set[str]:
        """Fold in the GPU families' figures (memory, up, sensors, other processes) and
        return the keys of the cells they name; ``make``: new GPUs get a cell; ``host``:
        only that host's cells take figures; ``near``: the :data:`ROW_FAMILIES` were
        asked of these targets only (the other cells' are cleared: a row that comes into
        view shows ``-`` until a refresh asks them, never figures of long ago)."""
        # Each series' key is worked out once a refresh: at 64 hosts there are thousands.
        gpus = self.gpus
        seen, have, ups = self._gpu_figures(s, make, host)
        if "gpuwatch_gpu_up" in s:  # read, and silent about a GPU: it is up
            for key in seen - ups:
                gpus[key].up = True
        rows = seen
        if near is not None:
            rows = {k for k in seen if gpus[k].instance in near}
            for key in seen - rows:
                cell = gpus[key]
                cell.util = cell.temp = cell.power = None
                cell.others = ()
        for family, attr in SENSORS.items():  # absent when NVML does not say: unknown
            if family in s:
                self._sensor(s[family], attr, rows)
        if "gpuwatch_gpu_process_memory_bytes" in s:
            others = _others(s["gpuwatch_gpu_process_memory_bytes"])
            for key in rows:
                found = sorted(others.get(key, ()), key=lambda o: (-o.used, o.pid))
                gpus[key].others = tuple(found[:MAX_OTHERS])
        # Used is absent for a lost GPU (its last values are not its values now).
        if "gpuwatch_gpu_memory_used_bytes" in s:
            for key in seen - have:
                gpus[key].used = None
        return seen

    def _gpu_figures(
        self, s: Mapping[str, list[Series]], make: bool, host: str | None
    ) -> tuple[set[str], set[str], set[str]]:
        """Fold in the :data:`_GPU_FIGURES` families; the keys of the cells they name, of
        those with a used figure and of those with an up series (asked as ``!= 1``)."""
        seen: set[str] = set()
        have: set[str] = set()
        ups: set[str] = set()
        for family, attr in _GPU_FIGURES.items():
            for series in s.get(family, ()):
                key = _key(series.labels)
                if key is None:
                    continue
                cell = self._cell(key, series.labels) if make else self.gpus.get(key)
                if cell is None or (host is not None and cell.host != host):
                    continue
                seen.add(key)
                cell.put(family, series.value)
                if attr == "used":
                    have.add(key)
                elif attr == "up":
                    ups.add(key)
        return seen, have, ups

    def _sensor(self, series: Iterable[Series], attr: str, rows: set[str]) -> None:
        """One of the :data:`SENSORS` into the cells of ``rows``; None where it is silent."""
        got: set[str] = set()
        for one in series:
            v = one.value
            if v == v and abs(v) < 1e9:  # NaN and absurd figures are not figures
                key = _key(one.labels)
                if key in rows:
                    setattr(self.gpus[key], attr, v)
                    got.add(key)
        for key in rows - got:
            setattr(self.gpus[key], attr, None)

    def _cell(self, key: str, labels: Mapping[str, str]) -> Gpu | None:
        """The cell of ``key`` (a GPU series' :func:`_key`), made if new and room is left."""
        cell = self.gpus.get(key)
        if cell is None:
            if len(self.gpus) >= MAX_GPUS:
                return None
            cell = self.gpus[key] = Gpu(host_of(labels), labels["gpu"])
        cell.name = labels.get("name", cell.name)
        cell.instance = labels.get("instance", cell.instance)
        return cell

    def wants_slow(self) -> bool:
        """Whether the next refresh should ask the :data:`SLOW` families whatever the
        count: no GPU yet, a GPU with a used figure but no total, a rank whose
        ``gpuwatch_rank_info`` was never read (new ones; an older exporter's, always)."""
        if not self.gpus or any(g.total is None and g.used is not None for g in self.gpus.values()):
            return True
        return any(p.rank is not None and not p.info for p in self._procs.values())

    def _processes(self, s: dict[str, list[Series]], at: float) -> None:
        """Processes from their families: phase, step, peaks, prediction, rank."""
        families = (
            "gpuwatch_process_phase_info",
            "gpuwatch_process_step",
            "gpuwatch_process_phase_peak_allocated_bytes",
            "gpuwatch_process_predicted_peak_bytes",
        )
        if not any(f in s for f in families):
            return  # none read: keep what the cells show
        for key in [k for k, (t, _) in self._away.items() if at - t > FORGET_S]:
            del self._away[key]
        procs: dict[tuple[str, int], _Process] = {}

        def proc(series: Series) -> _Process | None:
            return self._proc(procs, series.labels)

        for series in s.get("gpuwatch_process_phase_info", []):
            if (p := proc(series)) is not None and series.value == 1:
                p.phase = series.labels.get("phase") or None
        for series in s.get("gpuwatch_process_step", []):
            if (p := proc(series)) is not None and series.value == series.value:
                p.step = int(series.value) if abs(series.value) < 2**53 else None
        if "gpuwatch_process_phase_peak_allocated_bytes" in s:
            fresh = _peaks(s["gpuwatch_process_phase_peak_allocated_bytes"], proc)
            for key, p in procs.items():
                p.peaks = fresh.get(key, {})
        for series in s.get("gpuwatch_process_predicted_peak_bytes", []):
            if (p := proc(series)) is not None:
                p.predicted = _bytes(series.value)
        for series in s.get("gpuwatch_rank_info", []):
            if (p := proc(series)) is not None:
                _rank_info(p, series.labels)
        self._leave(procs, at)
        self._procs = procs
        self._cells_from(procs.values())
        by_job: dict[str, list[RankRow]] = defaultdict(list)
        for job, row in self._rank_rows(procs.values()):
            by_job[job].append(row)
        self.jobs = {job: compare(by_job[job]) for job in sorted(by_job)}

    def _proc(
        self, procs: dict[tuple[str, int], _Process], labels: Mapping[str, str]
    ) -> _Process | None:
        """The process a series names, made in ``procs`` at its first series (with what
        it said before, for a family not read this time); None: no pid, or no room."""
        pid = _int(labels.get("pid"))
        if pid is None:
            return None
        key = (host_of(labels), pid)
        p = procs.get(key)
        if p is None:
            if len(procs) >= MAX_GPUS * 8:
                return None
            old = self._procs.get(key) or self._back(key)
            job = labels.get("job_id") or job_id(labels, key[0])  # an older exporter's
            p = procs[key] = _Process(key[0], pid, labels.get("gpu") or None, job)
            if old is not None:  # a family not read this time keeps its figures
                p.step, p.predicted, p.peaks = old.step, old.predicted, dict(old.peaks)
                p.strategy, p.world_size, p.info = old.strategy, old.world_size, old.info
        if p.gpu is None and labels.get("gpu"):
            p.gpu = labels["gpu"]
        p.rank = _int(labels.get("rank")) if p.rank is None else p.rank
        return p

    def _back(self, key: tuple[str, int]) -> _Process | None:
        away = self._away.pop(key, None)
        return away[1] if away is not None else None

    def _leave(self, procs: dict[tuple[str, int], _Process], at: float) -> None:
        """Keep the processes this refresh lost, for :data:`FORGET_S` and at most as many
        as a refresh may hold: back in a refresh that does not ask their layout (a
        :data:`SLOW` family), they show it at once."""
        for key, p in self._procs.items():
            if key not in procs:
                self._away[key] = (at, p)
        while len(self._away) > MAX_GPUS * 8:  # oldest first: dicts keep insertion order
            del self._away[next(iter(self._away))]

    def _cells_from(self, procs: Iterable[_Process]) -> None:
        by_gpu: dict[str, list[_Process]] = defaultdict(list)
        for p in procs:
            if p.gpu is not None:
                by_gpu[f"{p.host}:{p.gpu}"].append(p)
        for key, cell in self.gpus.items():
            on = by_gpu.get(key)
            if on is None:  # most GPUs of a big cluster run no instrumented process
                cell.ranks = ()
                cell.phase = cell.step = cell.peak = cell.predicted = None
                continue
            cell.ranks = tuple(sorted({p.rank for p in on if p.rank is not None}))
            phases = [p.phase for p in on if p.phase]
            cell.phase = phases[0] if phases else None
            steps = [p.step for p in on if p.step is not None]
            cell.step = max(steps) if steps else None
            peaks = [max(p.peaks.values()) for p in on if p.peaks]
            cell.peak = sum(peaks) if peaks else None
            predicted = [p.predicted for p in on if p.predicted is not None]
            cell.predicted = sum(predicted) if predicted else None

    def _rank_rows(self, procs: Iterable[_Process]) -> list[tuple[str, RankRow]]:
        rows = []
        for p in procs:
            if p.rank is None:
                continue
            cell = self.gpus.get(f"{p.host}:{p.gpu}") if p.gpu is not None else None
            phases: dict[str, RankPhase] = {}
            for name, peak in p.peaks.items():  # a column each: long names cut
                short = ellipsis(printable(name), PHASE_WIDTH)
                if short not in phases or (phases[short].peak or 0) < peak:
                    phases[short] = RankPhase(peak=peak)
            row = RankRow(
                rank=p.rank,
                host=p.host,
                gpu=f"{p.host}:{p.gpu}" if p.gpu is not None else None,
                pid=p.pid,
                step=p.step,
                used=cell.used if cell is not None else None,
                phases=phases,
                strategy=p.strategy,
                world_size=p.world_size,
            )
            rows.append((p.job, row))
        return rows

    # ------------------------------------------------------------------ the view's questions

    def hosts(self) -> list[str]:
        return sorted({g.host for g in self.gpus.values()})

    def live(self) -> set[str]:
        """Targets of which some GPU was read live (not only from its last figures)."""
        return {g.instance for g in self.gpus.values() if g.seen}

    def lost_hosts(self) -> dict[str, str]:
        """Down targets of which no GPU is known (gone before the view started, more than
        :data:`FORGET_S` ago, or never exporting a GPU): their host name (the ``host``
        target label, else the target) -> target."""
        held = {g.instance for g in self.gpus.values()}
        return {host: inst for inst, host in sorted(self.down.items()) if inst not in held}

    def host_note(self, gpus: Sequence[Gpu]) -> str:
        """A host line's note: its GPUs, how many are not ok, whether its target is down."""
        odd = sum(g.state != OK for g in gpus)
        note = f"{len(gpus)} GPUs" + (f", {odd} not ok" if odd else "")
        down = sorted({g.instance for g in gpus if g.instance in self.down})
        if down:
            note += f" · lost: target {', '.join(down)} down, last known figures"
        return note

    def lost_lines(self, text: str = "") -> list[tuple[str, str]]:
        """(host, note) of the lost hosts with no figures whose line holds ``text``."""
        needle = " ".join(text.lower().split())
        out = []
        for host, inst in self.lost_hosts().items():
            note = f"lost: target {inst} down, no figures seen"
            if needle in f"{host} {note}".lower():
                out.append((host, note))
        return out

    def cells(self, sort: str = "host", text: str = "") -> list[tuple[str, list[Gpu]]]:
        """The GPUs grouped by host, in the order ``sort`` asks, those whose text (key, name,
        ranks, phase, state) holds ``text`` (case and runs of spaces aside).

        Hosts come in the order of their first GPU, so the fullest host leads a memory sort.
        The host sort (the first) puts the hosts with a GPU not ok first: on an 80x24
        screen they are on the first page, not below the fold.
        """
        needle = " ".join(text.lower().split())
        chosen = [g for g in self.gpus.values() if not needle or needle in g.text()]
        if sort == "host":
            odd = self.odd_hosts()
            chosen.sort(key=lambda g: (g.host not in odd, g.host, _index_key(g.index)))
        else:
            chosen.sort(key=_SORT_KEYS[sort])
        groups: dict[str, list[Gpu]] = {}
        for g in chosen:
            groups.setdefault(g.host, []).append(g)
        return list(groups.items())

    def odd_hosts(self) -> list[str]:
        """The hosts with a GPU not ok (lost, stale), by name."""
        return sorted({g.host for g in self.gpus.values() if g.state != OK})

    def fullest(self) -> Gpu | None:
        known = [g for g in self.gpus.values() if g.used is not None and g.total]
        return max(known, key=lambda g: (g.fill, g.key)) if known else None

    @property
    def rank_count(self) -> int:
        return sum(len(r.rows) for r in self.jobs.values())

    def worst_rank(self) -> Worst | None:
        """The rank that stands out most over every job: the largest excess over its job's
        median a flag names (then any other flag), else the highest peak of any phase."""
        flagged = [(job, f) for job, r in self.jobs.items() for f in r.flags]
        if flagged:
            job, flag = min(
                flagged, key=lambda jf: (jf[1].kind != "above_median", -jf[1].bytes, jf[0])
            )
            return Worst(job, flag.rank, _host(self.jobs[job], flag.rank), flag.text)
        spreads = [(job, s) for job, r in self.jobs.items() for s in r.spreads]
        if not spreads:
            return None
        job, top = max(spreads, key=lambda js: (js[1].max_bytes, js[0]))
        why = f"{top.phase} peak {fmt_bytes(top.max_bytes)}"
        return Worst(job, top.max_rank, _host(self.jobs[job], top.max_rank), why)

    def summary(self) -> str:
        """One line: GPUs, hosts, ranks, the states not ok, the worst rank, the fullest GPU."""
        return " · ".join(self.summary_parts())

    def summary_parts(self, view: Sequence[str] = ()) -> list[str]:
        """The summary's parts, most important first; ``view`` (the view's own: interval,
        sort, filter) goes after the worst rank and before the fullest GPU."""
        states: dict[str, int] = defaultdict(int)
        for g in self.gpus.values():
            states[g.state] += 1
        lost = self.lost_hosts()
        parts = [
            f"{len(self.gpus)} GPUs",
            f"{len(self.hosts()) + len(lost)} hosts",
            f"{self.rank_count} ranks",
        ]
        odd = [f"{n} {state}" for state, n in sorted(states.items()) if state != OK]
        if self.down:
            odd.append(f"{len(self.down)} down")
        if odd:
            parts.append(", ".join(odd) + _on_hosts(self.odd_hosts()))
        if (worst := self.worst_rank()) is not None:
            host, job = ellipsis(printable(worst.host), 24), ellipsis(printable(worst.job), 24)
            parts.append(f"worst rank {worst.rank} on {host} ({job})")
        parts += view
        if (full := self.fullest()) is not None:
            parts.append(
                f"fullest {ellipsis(printable(full.key), 24)} "
                f"{fmt_short(full.used)}/{fmt_short(full.total)} ({full.fill:.0%})"
            )
        return parts


ODD_HOSTS_SHOWN = 3
"""Hosts the summary names where GPUs are not ok (the rest: ``+N``)."""


def _on_hosts(hosts: Sequence[str]) -> str:
    """`` on a, b +2``: where the GPUs not ok are ("" for none)."""
    if not hosts:
        return ""
    names = [ellipsis(printable(h), 24) for h in hosts[:ODD_HOSTS_SHOWN]]
    more = len(hosts) - ODD_HOSTS_SHOWN
    return " on " + ", ".join(names) + (f" +{more}" if more > 0 else "")


def _host(ranks: Ranks, rank: int) -> str:
    return next((r.host for r in ranks.rows if r.rank == rank), "?")


def _index_key(index: str) -> tuple[int, str]:
    return (int(index), "") if index.isdigit() and len(index) < 10 else (1 << 30, index)


_SORT_KEYS: dict[str, Callable[[Gpu], tuple[object, ...]]] = {
    "memory": lambda g: (-g.fill, g.host, _index_key(g.index)),
    "headroom": lambda g: (
        g.headroom is None,
        g.headroom if g.headroom is not None else 0,
        g.host,
        _index_key(g.index),
    ),
    "host": lambda g: (g.host, _index_key(g.index)),
    "rank": lambda g: (
        not g.ranks,
        g.ranks[0] if g.ranks else 0,
        g.host,
        _index_key(g.index),
    ),
}
