"""The metrics of a live session and the server Prometheus scrapes them from.

:class:`SessionCollector` reads the newest values from the session when Prometheus
scrapes (``Table.last()`` and snapshots, each under its table's short lock), so nothing
runs on the sampling threads and a slow scrape cannot delay a sample.
:class:`MetricsServer` serves it from one thread whatever its clients do
(:mod:`gpuwatch.prometheus.http_server`: idle connections time out, their number is capped). The
metrics, their labels and units are listed in :data:`METRICS` and documented in
``docs/prometheus.md``.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .._version import __version__
from ..analysis.forecast import foresight_of
from ..analysis.predicted import predictions
from ..predict import CATEGORIES
from ..protocol import MAX_RANK, job_id, label_text
from ..session import MISSING_INT, Process, Session
from .http_server import ScrapeServer

if TYPE_CHECKING:
    from prometheus_client.samples import Exemplar, Timestamp

GPU = ("gpu", "uuid", "name", "host")
JOB = ("slurm_job", "slurm_step", "k8s_namespace", "k8s_pod", "job_name", "torch_run", "job_id")
"""The scheduler's identity of a process (its hello's ``scheduler``), on every
per-process series: empty where the process did not say (Prometheus drops empty labels);
``job_id`` is the job its ranks are compared within (:func:`gpuwatch.protocol.job_id`),
never empty."""
PROC = ("pid", "rank", "host", *JOB)
GPU_PROC = (*GPU, "pid", "user", "command", "instrumented")
"""Labels of every process on a GPU (instrumented or not), as the Processes tab lists them:
its command name, never its arguments (they may hold secrets and make a series per run)."""
PROC_GPU = ("pid", "rank", "gpu", "host", *JOB)
RANK_INFO = (
    "pid",
    "rank",
    "local_rank",
    "world_size",
    "host",
    "strategy",
    "shard_size",
    "replicate_size",
    *JOB,
    "slurm_procid",
    "slurm_nodelist",
    "k8s_job",
    "torch_master",
)

STRATEGIES = ("ddp", "fsdp2", "fsdp1", "zero", "tp", "device_map", "none")
"""The ``strategy`` values of the layout facts (``docs/facts.md``); the label is also
``unknown`` before a process sends facts and ``other`` for any other string."""

MAX_PHASE_NAMES = 64
"""Distinct phase names exported as themselves; later ones are labelled ``other``, so a
script that puts a step number into its phase names cannot grow the series without end."""

OTHER_PHASE = "other"


@dataclass(frozen=True)
class Spec:
    """One exported metric: name (with its unit suffix), type, labels and meaning."""

    name: str
    kind: str  # "gauge" or "counter"
    labels: tuple[str, ...]
    help: str


METRICS = (
    Spec("gpuwatch_build_info", "gauge", ("version", "host"), "gpuwatch's version (always 1)."),
    Spec(
        "gpuwatch_gpu_up",
        "gauge",
        GPU,
        "1 while NVML samples the GPU; 0 when it is lost or NVML keeps failing on it.",
    ),
    Spec(
        "gpuwatch_gpu_memory_used_bytes",
        "gauge",
        GPU,
        "NVML used device memory (what nvidia-smi shows), newest sample.",
    ),
    Spec("gpuwatch_gpu_memory_total_bytes", "gauge", GPU, "Total device memory."),
    Spec(
        "gpuwatch_gpu_utilization_ratio",
        "gauge",
        GPU,
        "NVML GPU utilisation, 0 to 1 (time a kernel ran over NVML's last period).",
    ),
    Spec("gpuwatch_gpu_power_watts", "gauge", GPU, "Power draw."),
    Spec("gpuwatch_gpu_temperature_celsius", "gauge", GPU, "GPU core temperature."),
    Spec(
        "gpuwatch_gpu_process_memory_bytes",
        "gauge",
        GPU_PROC,
        "Memory NVML says a process holds on the GPU, every process on it (newest process "
        "list); instrumented is 1 for a process gpuwatch instruments.",
    ),
    Spec(
        "gpuwatch_process_torch_allocated_bytes",
        "gauge",
        PROC_GPU,
        "Bytes of live tensors (torch.cuda.memory_allocated) the process last reported.",
    ),
    Spec(
        "gpuwatch_process_torch_reserved_bytes",
        "gauge",
        PROC_GPU,
        "Bytes the caching allocator holds (torch.cuda.memory_reserved), last reported.",
    ),
    Spec(
        "gpuwatch_process_torch_inactive_split_bytes",
        "gauge",
        PROC_GPU,
        "Cached free bytes the allocator cannot hand out whole: inactive blocks of split "
        "segments (fragmentation), last reported.",
    ),
    Spec(
        "gpuwatch_process_allocator_retries_total",
        "counter",
        PROC_GPU,
        "Times the allocator freed its cache and retried a failed cudaMalloc.",
    ),
    Spec(
        "gpuwatch_process_allocator_ooms_total",
        "counter",
        PROC_GPU,
        "Out-of-memory errors the allocator raised (its own count, caught ones included).",
    ),
    Spec(
        "gpuwatch_process_rss_bytes",
        "gauge",
        PROC,
        "Resident set size of the instrumented process, sampled by gpuwatch.",
    ),
    Spec(
        "gpuwatch_process_cpu_ratio",
        "gauge",
        PROC,
        "Host CPU of the instrumented process over the last second or more (1: one core).",
    ),
    Spec(
        "gpuwatch_gpu_process_sm_utilization_ratio",
        "gauge",
        GPU_PROC,
        "The process's share of SM time from NVML's per-process samples, 0 to 1; absent "
        "where NVML does not offer them.",
    ),
    Spec(
        "gpuwatch_gpu_process_cpu_ratio",
        "gauge",
        GPU_PROC,
        "Host CPU of the process between the last two process lists (1: one core).",
    ),
    Spec(
        "gpuwatch_gpu_process_host_rss_bytes",
        "gauge",
        GPU_PROC,
        "Resident set size of the process on the host, at the newest process list.",
    ),
    Spec(
        "gpuwatch_process_phase_info",
        "gauge",
        (*PROC_GPU, "phase"),
        "The phase the process is in now (the innermost open one); absent between phases.",
    ),
    Spec(
        "gpuwatch_process_step",
        "gauge",
        PROC_GPU,
        "The training step of the current (else the last ended) phase.",
    ),
    Spec(
        "gpuwatch_process_phase_peak_allocated_bytes",
        "gauge",
        (*PROC_GPU, "phase"),
        "Exact allocator peak of allocated bytes inside the last ended phase of this name.",
    ),
    Spec(
        "gpuwatch_process_phase_peak_reserved_bytes",
        "gauge",
        (*PROC_GPU, "phase"),
        "Exact allocator peak of reserved bytes inside the last ended phase of this name.",
    ),
    Spec(
        "gpuwatch_process_phases_total",
        "counter",
        (*PROC_GPU, "phase"),
        "Phases of this name that ended.",
    ),
    Spec(
        "gpuwatch_process_phase_seconds_total",
        "counter",
        (*PROC_GPU, "phase"),
        "Time spent in ended phases of this name (exact, whatever the scrape interval).",
    ),
    Spec(
        "gpuwatch_process_predicted_bytes",
        "gauge",
        PROC_GPU,
        "Predicted allocated bytes now, from the model facts and the phases.",
    ),
    Spec(
        "gpuwatch_process_predicted_peak_bytes",
        "gauge",
        PROC_GPU,
        "Highest predicted allocated bytes over all phases (the first step included).",
    ),
    Spec(
        "gpuwatch_process_predicted_category_bytes",
        "gauge",
        (*PROC_GPU, "category"),
        "Predicted allocated bytes now, by category (weights, gradients, ddp_buckets, ...).",
    ),
    Spec(
        "gpuwatch_process_predicted_peak_category_bytes",
        "gauge",
        (*PROC_GPU, "category"),
        "The predicted peak (gpuwatch_process_predicted_peak_bytes), by category.",
    ),
    Spec(
        "gpuwatch_forecast_peak_bytes",
        "gauge",
        (*PROC_GPU, "phase", "first_step"),
        "Forecast peak allocated bytes of each phase not yet run (first_step: the first "
        "optimizer step's variant, before the optimizer state exists, or a later step's); "
        "a phase whose forecast rests on unknowns is left out.",
    ),
    Spec(
        "gpuwatch_forecast_usable_bytes",
        "gauge",
        PROC_GPU,
        "What the process's allocator can have on its GPU: the total less the other "
        "processes and its own CUDA context (NVML); the host's memory for a CPU run.",
    ),
    Spec(
        "gpuwatch_rank_info",
        "gauge",
        RANK_INFO,
        "Who an instrumented process is (always 1): its rank, its parallel layout and its "
        "scheduler's job.",
    ),
    Spec(
        "gpuwatch_process_ooms_total",
        "counter",
        PROC,
        "Out-of-memory errors the process reported.",
    ),
    Spec(
        "gpuwatch_process_dropped_events_total",
        "counter",
        PROC,
        "Events the process dropped before sending (its queue was full or no one listened).",
    ),
    Spec(
        "gpuwatch_process_lost_events_total",
        "counter",
        PROC,
        "Events the process sent that were never recorded (lost on the way; not rejected).",
    ),
    Spec(
        "gpuwatch_receiver_rejected_datagrams_total",
        "counter",
        ("reason", "host"),
        "Datagrams the annotation receiver refused, by reason (json, version, kind, "
        "field, size, internal).",
    ),
)
"""Everything the exporter can export, in exposition order."""


@dataclass
class _Folded:
    """What the collector has gathered from one process's ended phases so far (from its
    :class:`~gpuwatch.session.session.Tally`, kept exact by the session as phases end,
    however many rows memory lets go)."""

    count: Counter[int] = field(default_factory=Counter)  # name id -> ended phases
    seconds: Counter[int] = field(default_factory=Counter)  # name id -> ns inside
    peaks: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # -> (alloc, res, dev)
    last_step: int | None = None
    last_dev: int | None = None


class SessionCollector:
    """Turns the newest state of a session into Prometheus metric families.

    Args:
        session: The live session.
        host: The ``host`` label (default: this machine's host name).
        gone: Says whether an instrumented process has exited without saying goodbye
            (the host sampler knows); such processes are no longer exported.
    """

    def __init__(
        self,
        session: Session,
        host: str | None = None,
        gone: Callable[[int], bool] | None = None,
    ) -> None:
        self.session = session
        self.host = host or socket.gethostname()
        self.gone = gone
        self._folded: dict[int, _Folded] = {}
        # Concurrent scrapes (one thread per request) share _folded; no sampler takes this.
        self._lock = threading.Lock()
        self.scrapes = 0
        self.cpu_seconds = 0.0  # this collector's thread CPU time, encoding included

    def describe(self) -> Iterable[Metric]:
        """The families, without samples (lets a registry refuse a clashing name)."""
        return list(_families().values())

    def collect(self) -> Iterator[Metric]:
        """The metric families as of now.

        A generator: its CPU time is counted until the registry has consumed it, so
        :attr:`cpu_seconds` includes formatting the samples for the response.
        """
        start = time.thread_time()
        try:
            with self._lock:
                families = _families()
                self._gpus(families)
                self._processes(families)
                self._receiver(families)
            yield from families.values()
        finally:
            with self._lock:
                self.scrapes += 1
                self.cpu_seconds += time.thread_time() - start

    # ------------------------------------------------------------------ GPUs

    def _gpus(self, f: dict[str, _Family]) -> None:
        s = self.session
        f["gpuwatch_build_info"].add_metric([__version__, self.host], 1)
        for dev in list(s.devices.values()):
            if dev.kind != "gpu":
                continue
            labels = [_index(dev.index), dev.uuid or "", dev.name, self.host]
            table = s.gpu.get(dev.key)
            row = table.last() if table is not None else None
            up = dev.state == "ok" and dev.source == "nvml" and row is not None
            f["gpuwatch_gpu_up"].add_metric(labels, 1 if up else 0)
            total = dev.total if dev.total is not None else (row or {}).get("total")
            _add(f["gpuwatch_gpu_memory_total_bytes"], labels, total)
            if not up or row is None:
                continue  # the newest values of a lost GPU are not its values now
            _add(f["gpuwatch_gpu_memory_used_bytes"], labels, row["used"])
            util = _number(row["util_gpu"])
            _add(f["gpuwatch_gpu_utilization_ratio"], labels, None if util is None else util / 100)
            _add(f["gpuwatch_gpu_power_watts"], labels, row["power"])
            _add(f["gpuwatch_gpu_temperature_celsius"], labels, row["temp"])
            self._gpu_processes(f, labels, dev.key)

    def _gpu_processes(self, f: dict[str, _Family], labels: list[str], key: str) -> None:
        """The GPU's newest NVML process list: who else holds memory on it."""
        s = self.session
        table = s.gpu_procs.get(key)
        last = table.last() if table is not None else None
        if table is None or last is None or last["type"] == -1:
            return  # no list yet, or an empty one
        t = int(last["t"])
        names = ("pid", "used", "sm", "cpu", "rss")
        rows = table.rows(table.search(t, "left"), table.search(t, "right"), names)
        cols = {k: rows[k].tolist() for k in names}
        held: dict[int, int] = {}  # one series a PID, whatever the list repeats: its largest row
        for i, (pid, used) in enumerate(zip(cols["pid"], cols["used"], strict=True)):
            if used != MISSING_INT and (pid not in held or used > cols["used"][held[pid]]):
                held[pid] = i
        for pid, i in held.items():
            info = s.proc_info.get(pid) or {}
            user, name = info.get("user"), info.get("name")
            mine = "1" if pid in s.processes else "0"
            who = [str(pid), user if isinstance(user, str) else "", _command(name), mine]
            series = [*labels, *who]
            _add(f["gpuwatch_gpu_process_memory_bytes"], series, cols["used"][i])
            # Unknown figures (another PID namespace, no NVML sample): no series, not a 0.
            sm, cpu = _number(cols["sm"][i]), _number(cols["cpu"][i])
            _add(
                f["gpuwatch_gpu_process_sm_utilization_ratio"],
                series,
                None if sm is None else sm / 100,
            )
            _add(f["gpuwatch_gpu_process_cpu_ratio"], series, None if cpu is None else cpu / 100)
            _add(f["gpuwatch_gpu_process_host_rss_bytes"], series, cols["rss"][i])

    # ------------------------------------------------------------------ processes

    def _processes(self, f: dict[str, _Family]) -> None:
        s = self.session
        ooms = Counter(o.pid for o in list(s.ooms))
        shown: set[int] = set()
        for proc in s.running():  # a scrape costs what runs, not every process ever seen
            pid = proc.pid
            if self.gone is not None and self.gone(pid):
                continue
            shown.add(pid)
            folded = self._folded.setdefault(pid, _Folded())
            self._fold(proc, folded)
            who = _Who.of(proc, self.host)
            self._process(f, proc, folded, who, ooms[pid])
            f["gpuwatch_rank_info"].add_metric(who.info(self.host), 1)
        for pid in set(self._folded) - shown:  # ended: forget, so the state stays bounded
            del self._folded[pid]

    def _process(
        self, f: dict[str, _Family], proc: Process, folded: _Folded, who: _Who, ooms: int
    ) -> None:
        host = self.host
        ids, job = [who.pid, who.rank], who.job

        def at(gpu: str) -> list[str]:  # the PROC_GPU labels
            return [*ids, gpu, host, *job]

        torch = _torch_last(proc)
        for dev, (allocated, reserved, split, retries, alloc_ooms) in torch.items():
            labels = at(self._gpu_of(proc, dev, ""))
            _add(f["gpuwatch_process_torch_allocated_bytes"], labels, allocated)
            _add(f["gpuwatch_process_torch_reserved_bytes"], labels, reserved)
            _add(f["gpuwatch_process_torch_inactive_split_bytes"], labels, split)
            _add(f["gpuwatch_process_allocator_retries_total"], labels, retries)
            _add(f["gpuwatch_process_allocator_ooms_total"], labels, alloc_ooms)
        per_proc = [*ids, host, *job]
        rss = proc.rss.last()
        _add(f["gpuwatch_process_rss_bytes"], per_proc, rss["rss"] if rss else None)
        cpu = _number(rss.get("cpu")) if rss else None
        _add(f["gpuwatch_process_cpu_ratio"], per_proc, None if cpu is None else cpu / 100)
        # The process's main GPU: where it last reported figures, else the first it named.
        main_dev = next(reversed(torch), None) if torch else folded.last_dev
        if (main_dev is None or main_dev == MISSING_INT) and proc.devices:
            main_dev = min(proc.devices)
        gpu = self._gpu_of(proc, main_dev, "")
        opened = list(proc.open.values())
        step = folded.last_step
        if opened:
            now = max(opened, key=lambda o: (o.depth, o.t0))
            labels = at(self._gpu_of(proc, now.dev, gpu))
            f["gpuwatch_process_phase_info"].add_metric([*labels, self._phase(now.name)], 1)
            step = now.step if now.step is not None else step
        _add(f["gpuwatch_process_step"], at(gpu), step)
        for nid, (pa, pr, dev) in folded.peaks.items():
            labels = [*at(self._gpu_of(proc, dev, gpu)), self._phase_of(nid)]
            _add(f["gpuwatch_process_phase_peak_allocated_bytes"], labels, pa)
            _add(f["gpuwatch_process_phase_peak_reserved_bytes"], labels, pr)
        for nid, n in folded.count.items():
            labels = [*at(gpu), self._phase_of(nid)]
            f["gpuwatch_process_phases_total"].add_metric(labels, n)
            seconds = folded.seconds[nid] / 1e9
            f["gpuwatch_process_phase_seconds_total"].add_metric(labels, seconds)
        self._predicted(f, proc, at(gpu))
        self._forecast(f, proc.pid, at(gpu))
        f["gpuwatch_process_ooms_total"].add_metric(per_proc, ooms)
        f["gpuwatch_process_dropped_events_total"].add_metric(per_proc, proc.dropped)
        f["gpuwatch_process_lost_events_total"].add_metric(per_proc, proc.gaps)

    def _predicted(self, f: dict[str, _Family], proc: Process, labels: list[str]) -> None:
        if not proc.facts:
            return
        try:
            # The session's shared line (the dashboard reads the same one). Facts come from
            # the script: a fact the predictor trips on costs this process its predicted
            # series, not the whole scrape.
            line = predictions(self.session).line(proc)
            if line is None or line.prediction is None:
                return
            prediction = line.prediction
            parts = line.breakdown_at(self.session.now())
            peak_parts = prediction.phases[prediction.peak_phase].peak
        except Exception:
            return
        _add(f["gpuwatch_process_predicted_peak_bytes"], labels, prediction.peak_bytes)
        for cat in CATEGORIES:
            value = peak_parts.get(cat, 0)
            _add(f["gpuwatch_process_predicted_peak_category_bytes"], [*labels, cat], value)
        if parts is None:  # before the first phase: no "now" on the curve yet
            return
        _add(f["gpuwatch_process_predicted_bytes"], labels, sum(parts.values()))
        for cat in CATEGORIES:
            value = parts.get(cat, 0)
            _add(f["gpuwatch_process_predicted_category_bytes"], [*labels, cat], value)

    def _forecast(self, f: dict[str, _Family], pid: int, labels: list[str]) -> None:
        """The forecast the live sources' foresight made, as it stands: a scrape forecasts
        nothing itself."""
        fs = foresight_of(self.session)
        forecast = fs.forecasts.get(pid) if fs is not None else None
        if forecast is None or forecast.capacity is None:
            return
        _add(f["gpuwatch_forecast_usable_bytes"], labels, forecast.capacity.usable)
        for p in forecast.ahead():
            if not p.unknowns:
                series = [*labels, self._phase(p.phase), "true" if p.first_step else "false"]
                _add(f["gpuwatch_forecast_peak_bytes"], series, p.peak)

    def _fold(self, proc: Process, folded: _Folded) -> None:
        """Read the process's tally; names past the cap share one key (and one label), so
        their series stay one each."""
        tally = proc.tally
        count: Counter[int] = Counter()
        seconds: Counter[int] = Counter()
        for nid, n in list(tally.count.items()):
            count[min(nid, MAX_PHASE_NAMES)] += n
        for nid, ns in list(tally.ns.items()):
            seconds[min(nid, MAX_PHASE_NAMES)] += ns
        latest: dict[int, tuple[int, int, int, int]] = {}
        for nid, peak in list(tally.peaks.items()):
            key = min(nid, MAX_PHASE_NAMES)
            if key not in latest or peak[0] >= latest[key][0]:
                latest[key] = peak
        folded.count, folded.seconds = count, seconds
        folded.peaks = {nid: (pa, pr, dev) for nid, (_, pa, pr, dev) in latest.items()}
        folded.last_step, folded.last_dev = tally.step, tally.dev

    # ------------------------------------------------------------------ helpers

    def _gpu_of(self, proc: Process, dev: int | None, default: str) -> str:
        """The ``gpu`` label (NVML index) of a process's torch device; ``default`` when
        the device is not known (none given, or not among those the process named)."""
        key = proc.devices.get(dev) if dev is not None else None
        device = self.session.devices.get(key) if key is not None else None
        return _index(device.index) if device is not None else default

    def _phase(self, name: str) -> str:
        """The ``phase`` label of an open span (its name is interned when it ends)."""
        nid = self.session.find_name(name)
        if nid is None:  # first of its name: it gets the next id when it ends
            nid = len(self.session.names)
        return name if nid < MAX_PHASE_NAMES else OTHER_PHASE

    def _phase_of(self, nid: int) -> str:
        return self.session.names[nid] if nid < MAX_PHASE_NAMES else OTHER_PHASE

    def _receiver(self, f: dict[str, _Family]) -> None:
        for reason, n in sorted(dict(self.session.rejects).items()):
            f["gpuwatch_receiver_rejected_datagrams_total"].add_metric([reason, self.host], n)


@dataclass(frozen=True)
class _Who:
    """A process's identity as labels, each value bounded whatever its hello and facts
    held (both are the script's word: checked by the protocol, cleaned again here)."""

    pid: str
    rank: str
    local_rank: str
    world_size: str
    strategy: str
    shard_size: str
    replicate_size: str
    job: tuple[str, ...]  # JOB's values
    slurm_procid: str
    slurm_nodelist: str
    k8s_job: str
    torch_master: str

    @classmethod
    def of(cls, proc: Process, host: str) -> _Who:
        hello = proc.hello
        facts = proc.facts if isinstance(proc.facts, dict) else None
        given = facts.get("parallel") if facts is not None else None
        layout: dict[str, Any] = given if isinstance(given, dict) else {}
        fsdp = part if isinstance(part := layout.get("fsdp"), dict) else {}
        zero = part if isinstance(part := layout.get("zero"), dict) else {}
        if facts is None:
            strategy = "unknown"  # no facts yet: the layout is not known
        else:
            named = layout.get("strategy", "none")
            strategy = named if named in STRATEGIES else "other"
        told = hello.get("scheduler")
        sched: dict[str, Any] = told if isinstance(told, dict) else {}
        # torchrun's RANK, else the process group's (mp.spawn sets no RANK).
        rank = _count(hello.get("rank")) or _count(layout.get("rank"))
        world = _count(hello.get("world_size")) or _count(layout.get("world_size"))
        return cls(
            pid=str(proc.pid),
            rank=rank,
            local_rank=_count(hello.get("local_rank")),
            world_size=world,
            strategy=strategy,
            # ZeRO divides the states by its partition count: its shard size.
            shard_size=_count(fsdp.get("mesh_size")) or _count(zero.get("partition_count")),
            replicate_size=_count(fsdp.get("replicate_size")),
            job=(*(label_text(sched.get(k)) for k in JOB[:-1]), job_id(sched, host)),
            slurm_procid=label_text(sched.get("slurm_procid")),
            slurm_nodelist=label_text(sched.get("slurm_nodelist")),
            k8s_job=label_text(sched.get("k8s_job")),
            torch_master=label_text(sched.get("torch_master")),
        )

    def info(self, host: str) -> list[str]:
        """The labels of ``gpuwatch_rank_info``, in :data:`RANK_INFO` order."""
        return [
            self.pid,
            self.rank,
            self.local_rank,
            self.world_size,
            host,
            self.strategy,
            self.shard_size,
            self.replicate_size,
            *self.job,
            self.slurm_procid,
            self.slurm_nodelist,
            self.k8s_job,
            self.torch_master,
        ]


def _command(name: Any) -> str:
    """A process's command name as a label: its name (not its arguments, which may hold
    secrets and make a series per run), at most 64 characters."""
    return name[:64] if isinstance(name, str) else ""


def _count(v: Any) -> str:
    """A rank or size as a label: a whole number 0 … MAX_RANK, else ``""``."""
    return str(v) if type(v) is int and 0 <= v <= MAX_RANK else ""


def label_value(value: str) -> str:
    """A label value safe to show wherever it is read: each character that is not
    printable (ESC, BEL, newlines, C1 controls, bidirectional overrides) becomes a visible
    escape (``\\x1b``, ``\\u202e``) and a backslash ``\\\\``, so two names that differ
    only there stay two series (Prometheus rejects a scrape that names one series twice).
    Phase names, GPU names and the like are the script's or the driver's word; job labels
    are cleaned further (:func:`~gpuwatch.protocol.label_text`)."""
    if value.isprintable() and "\\" not in value:
        return value
    return "".join(_escaped(c) for c in value)


def _escaped(c: str) -> str:
    if c == "\\":
        return "\\\\"
    if c.isprintable():
        return c
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


class _Gauge(GaugeMetricFamily):
    """A gauge whose every label value goes through :func:`label_value`."""

    def add_metric(
        self, labels: Sequence[str], value: float, timestamp: Timestamp | float | None = None
    ) -> None:
        super().add_metric([label_value(v) for v in labels], value, timestamp)


class _Counter(CounterMetricFamily):
    """A counter whose every label value goes through :func:`label_value`."""

    def add_metric(
        self,
        labels: Sequence[str],
        value: float,
        created: float | None = None,
        timestamp: Timestamp | float | None = None,
        exemplar: Exemplar | None = None,
    ) -> None:
        super().add_metric([label_value(v) for v in labels], value, created, timestamp, exemplar)


_Family = _Gauge | _Counter
"""A metric family gpuwatch fills: every label value made safe to show."""


def _families() -> dict[str, _Family]:
    out: dict[str, _Family] = {}
    for spec in METRICS:
        cls = _Counter if spec.kind == "counter" else _Gauge
        out[spec.name] = cls(spec.name, spec.help, labels=spec.labels)
    return out


def _number(v: Any) -> float | None:
    """A stored value as a number, None where it is n/a (NaN or MISSING_INT)."""
    if v is None or v == MISSING_INT or (isinstance(v, float) and math.isnan(v)):
        return None
    return float(v)


def _add(family: _Family, labels: list[str], value: Any) -> None:
    v = _number(value)
    if v is not None:
        family.add_metric(labels, v)


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _index(index: int | None) -> str:
    return "" if index is None else str(index)


def _torch_last(proc: Process) -> dict[int, tuple[int, ...]]:
    """torch device index -> its newest figures (``Tally.torch``), the newest device
    last; a figure the process did not report is MISSING_INT."""
    return dict(proc.tally.torch)


class MetricsServer:
    """Serves ``/metrics`` for a session from prometheus_client's HTTP server.

    Args:
        session: The live session.
        host: Address to bind (``127.0.0.1``, ``0.0.0.0``, ``::1``, a host name).
        port: TCP port; 0 picks a free one (see :attr:`port`).
        gone: See :class:`SessionCollector`.
    """

    def __init__(
        self,
        session: Session,
        host: str = "127.0.0.1",
        port: int = 9400,
        gone: Callable[[int], bool] | None = None,
    ) -> None:
        self.collector = SessionCollector(session, gone=gone)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.host = host
        self.port = port
        self._server: ScrapeServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and serve on a daemon thread.

        Raises:
            OSError: The address cannot be bound (in use, not this machine's, unknown).
        """
        self._server = ScrapeServer(self.host, self.port, make_wsgi_app(self.registry))
        self._server.start()
        self._thread = self._server.thread
        self.port = self._server.port

    @property
    def url(self) -> str:
        return f"http://{host_port(self.host, self.port)}/metrics"

    def stop(self) -> None:
        """Stop serving and release the port."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()
