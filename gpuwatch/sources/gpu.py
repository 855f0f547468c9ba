"""Every GPU on the machine, sampled from NVML fast enough to see a spike in one step.

One thread samples every GPU each tick (default 100 ms, down to 10 ms): memory used /
free / total / driver-reserved, utilisation, temperature, power and clocks. Each GPU's
process list, joined with psutil, is read at a lower rate and staggered across ticks so
no tick pays for all of them.

Faults are states, never crashes: no driver (one note, the host only); a field the GPU
does not support (None, drawn as n/a); no permission for process lists (a note, memory
keeps sampling); a GPU that falls off the bus (that device is marked lost, the others
continue); an NVML call that hangs (a watchdog marks that GPU, hands the other GPUs to a
fresh sampling thread, and takes the GPU back when the call returns). The UI never calls
NVML; the achieved rate per GPU in :meth:`GpuSampleSink.set_sampler_rate` shows a slow NVML.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import psutil

from ..session import Device, gpu_key
from ..session.ports import GpuSampleSink
from . import procstat
from .children import ChildWatch
from .nvml import (
    NA,
    GpuLost,
    MemoryInfo,
    Nvml,
    NvmlCallFailed,
    NvmlDevice,
    NvmlError,
    NvmlNoPermission,
    NvmlUnavailable,
)

MIN_INTERVAL = 0.01
"""The shortest sampling interval, in seconds."""

_ERRORS_BEFORE_STATE = 3  # consecutive failed memory reads before the device shows "error"


@dataclass(eq=False)
class _Gpu:
    """The sampler's private state for one GPU."""

    key: str
    index: int
    dev: NvmlDevice | None
    power_limit: float | None = None
    active: bool = True  # False once lost, or when NVML went away
    hung: bool = False  # an NVML call on it has not returned: skip it
    count: int = 0  # samples taken
    errors: int = 0  # consecutive failed memory reads
    procs_due: float = 0.0
    procs_denied: bool = False
    last_procs: list[tuple[Any, ...]] | None = None
    last_pids: frozenset[int] = field(default_factory=frozenset)
    util_since: int = 0  # NVML's time (µs) of the newest per-process sample seen


class _Worker:
    """One sampling thread's identity; ``busy`` is (GPU, start ns) while it is in NVML."""

    __slots__ = ("busy", "gen", "set_aside", "thread")

    def __init__(self, gen: int) -> None:
        self.gen = gen
        self.busy: tuple[_Gpu, int] | None = None
        self.set_aside: _Gpu | None = None  # the GPU whose call hung in this thread
        self.thread: threading.Thread | None = None


def describe_pid(pid: int) -> dict[str, Any]:
    """Name, user (and uid), command line, parent, start (wall seconds) and container pid
    of ``pid`` as psutil sees it from here.

    A PID NVML reports that this process cannot see (another PID namespace, e.g. a
    container) is described as ``visible: False``, never dropped.
    """
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            uids = _maybe(proc.uids)
            info = {
                "name": _maybe(proc.name),
                "user": _maybe(proc.username),
                "cmdline": _maybe(proc.cmdline),
                "visible": True,
                "uid": None if uids is None else uids.real,
                "ppid": _maybe(proc.ppid),
                "started": _maybe(proc.create_time),
            }
    except psutil.NoSuchProcess:
        return {"name": None, "user": None, "cmdline": None, "visible": False}
    inner = procstat.container_pid(pid)
    if inner is not None:
        info["container_pid"] = inner
    return info


def _maybe(read: Any) -> Any:
    try:
        return read()
    except (psutil.AccessDenied, psutil.ZombieProcess):
        return None


def _v(value: Any) -> Any:
    return None if value is NA else value


class GpuSampler:
    """Samples every GPU NVML sees into a session, on a background thread.

    Args:
        session: Where devices, samples, process lists and notes go.
        interval: Seconds between samples of each GPU (at least 0.01).
        nvml: The NVML wrapper (tests pass one over a fake backend); None: the real one.
        process_interval: Seconds between process lists of each GPU.
        hang_after: Seconds an NVML call may take before its GPU is set aside.
        init_timeout: Seconds :meth:`start` waits for NVML to initialise.
    """

    def __init__(
        self,
        session: GpuSampleSink,
        interval: float = 0.1,
        nvml: Nvml | None = None,
        process_interval: float = 1.0,
        hang_after: float = 2.0,
        init_timeout: float = 5.0,
    ) -> None:
        if interval < MIN_INTERVAL:
            raise ValueError(f"interval {interval} s is below {MIN_INTERVAL} s")
        self.session = session
        self.interval = interval
        self.nvml = nvml if nvml is not None else Nvml()
        self.process_interval = process_interval
        self.hang_after = hang_after
        self.init_timeout = init_timeout
        self.gpus: list[_Gpu] = []
        self._worker: _Worker | None = None
        self._workers: list[_Worker] = []
        self._monitor: threading.Thread | None = None
        self._stop = threading.Event()
        self._opened = threading.Event()
        self._ok = False
        self._info: dict[int, dict[str, Any]] = {}  # pid -> what psutil said
        self._cpu = procstat.CpuMeter(every=0.5)
        self._stat = procstat.Reader()  # the listed processes' /proc files, kept open
        self._parents: set[int] = set()  # parents described for the tree view
        self._listed: set[int] = set()  # pids some GPU lists
        self._children = ChildWatch(describe_pid, self._publish)  # a DataLoader's workers

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> bool:
        """Initialise NVML, register every GPU and start sampling. Never raises.

        Returns:
            False when there is no usable NVML or no GPU (a one-line note says so and the
            dashboard shows the host only); True when sampling (or still waiting for a slow
            NVML to initialise, which a note then says).
        """
        try:
            self._spawn(_Worker(0))
        except Exception as exc:  # cannot even start a thread: say so, show the host
            self.session.note(f"GPU sampling could not start ({exc}): showing the host only")
            return False
        if not self._opened.wait(self.init_timeout):
            self.session.note(
                f"NVML has not answered for {self.init_timeout:g} s: GPUs will appear when it does"
            )
        elif not self._ok:
            return False
        self._monitor = threading.Thread(target=self._watch, name="gpuwatch-nvml-watch")
        self._monitor.daemon = True
        self._monitor.start()
        return True

    def stop(self, timeout: float = 1.0) -> None:
        """Stop sampling within about ``timeout`` seconds, even if an NVML call hangs."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        threads = []
        if self._monitor is not None:  # first: once it has ended it starts no new worker
            self._monitor.join(timeout)
            threads.append(self._monitor)
        threads += [w.thread for w in self._workers if w.thread is not None]
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in threads):
            # An NVML call is stuck; shutting NVML down under it could block us too. The
            # threads are daemons, so they do not hold up the exit.
            return
        self._stat.close()
        self.nvml.shutdown()

    def open(self) -> bool:
        """Initialise NVML and register every GPU, on the calling thread.

        Returns:
            False (with a note) when there is no usable NVML or no GPU.
        """
        try:
            self.nvml.init()
            count = self.nvml.device_count()
        except NvmlUnavailable as exc:
            self.nvml.shutdown()  # a no-op unless nvmlInit itself succeeded
            return self._unavailable(f"no NVIDIA driver found ({exc}): showing the host only")
        except Exception as exc:
            self.nvml.shutdown()
            return self._unavailable(f"NVML is not usable ({exc}): showing the host only")
        if self.nvml.substitute:
            # Never let a fake pass for the machine's GPUs (in the dashboard or a recording).
            self.session.note(
                f"NVML from {self.nvml.substitute} ($GPUWATCH_NVML_BACKEND), "
                "not this machine's driver"
            )
        if count == 0:
            self.nvml.shutdown()
            return self._unavailable("NVML sees no GPU: showing the host only")
        driver = _v(self.nvml.driver_version())
        start = time.monotonic()
        for i in range(count):
            gpu = self._discover(i, driver)
            # Stagger process lists so that no single tick reads all of them.
            gpu.procs_due = start + i * self.process_interval / count
            self.gpus.append(gpu)
            for instance in self._discover_mig(gpu, driver):
                instance.procs_due = gpu.procs_due
                self.gpus.append(instance)
        self._ok = True
        self._opened.set()
        return True

    def _unavailable(self, note: str) -> bool:
        self.session.note(note)
        self._opened.set()
        return False

    def _discover(self, index: int, driver: str | None) -> _Gpu:
        """Read a GPU's static facts once and register it as a device."""
        facts: dict[str, Any] = {}
        state, note = "ok", ""
        dev: NvmlDevice | None = None
        try:
            dev = self.nvml.device(index)
            facts["uuid"] = _v(dev.uuid())
            facts["name"] = _v(dev.name())
            facts["bus_id"] = _v(dev.bus_id())
            mem = dev.memory()
            facts["total"] = None if mem is NA else mem.total
            facts["power_limit"] = _v(dev.power_limit())
        except GpuLost as exc:
            state, note = "lost", self._lost_note(exc)
        except NvmlError as exc:
            state, note = "error", f"NVML: {exc}"
        uuid = facts.get("uuid")
        key = gpu_key(uuid) if uuid else gpu_key(f"nvml{index}")
        gpu = _Gpu(key, index, dev, power_limit=facts.get("power_limit"))
        gpu.active = state != "lost" and dev is not None
        if state == "error":
            gpu.errors = _ERRORS_BEFORE_STATE  # the first good sample clears the state
        self.session.add_device(
            Device(
                key,
                "gpu",
                index=index,
                name=facts.get("name") or f"GPU {index}",
                uuid=uuid,
                bus_id=facts.get("bus_id"),
                total=facts.get("total"),
                state=state,
                note=note,
                source="nvml",
                extra={"driver": driver},
            )
        )
        if not gpu.active:
            self.session.set_sampler_rate(key, 0.0)
        return gpu

    def _discover_mig(self, parent: _Gpu, driver: str | None) -> list[_Gpu]:
        """Register each MIG instance of ``parent`` as a device with its own memory.

        The GPU stays a device too: utilisation, temperature and power are NVML's per GPU.
        A failure here leaves the GPU as it is (its instances unseen), never the sampler.
        """
        if parent.dev is None or not parent.active:
            return []
        try:
            instances = parent.dev.mig_devices()
        except NvmlError:
            return []
        out: list[_Gpu] = []
        for dev in instances:
            try:
                uuid = _v(dev.uuid())
                name = _v(dev.name())
                mem = dev.memory()
            except NvmlError:
                continue
            slot = dev.mig_slot if dev.mig_slot is not None else len(out)
            key = gpu_key(uuid) if uuid else f"{parent.key}/mig{slot}"
            self.session.add_device(
                Device(
                    key,
                    "gpu",
                    index=parent.index,
                    name=name or f"MIG {slot}",
                    uuid=uuid,
                    total=None if mem is NA else mem.total,
                    source="nvml",
                    extra={"driver": driver, "mig_parent": parent.key, "mig_slot": slot},
                )
            )
            out.append(_Gpu(key, parent.index, dev))
        return out

    # ------------------------------------------------------------------ sampling

    def _spawn(self, worker: _Worker) -> None:
        self._worker = worker
        self._workers.append(worker)
        worker.thread = threading.Thread(
            target=self._run, args=(worker,), name=f"gpuwatch-nvml-{worker.gen}"
        )
        worker.thread.daemon = True
        worker.thread.start()

    def _run(self, worker: _Worker) -> None:
        if worker.gen == 0:
            try:
                opened = self.open()
            except Exception as exc:  # never let the thread die silently
                opened = self._unavailable(f"GPU sampling failed to start ({exc})")
            if not opened:
                return
        next_t = time.monotonic()
        while not self._stop.is_set():
            if not self.sample_once(worker):
                return
            next_t += self.interval
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind (slow NVML): do not catch up in a burst
                next_t = time.monotonic()
                delay = 0.0
            self._stop.wait(delay)

    def sample_once(self, worker: _Worker | None = None) -> bool:
        """Sample every active GPU once, and the process lists that are due.

        Returns:
            False when the calling thread should stop sampling (it was replaced after a
            hung call, or NVML went away).
        """
        if worker is None:  # called directly, not from a sampling thread
            if self._worker is None:
                self._worker = _Worker(-1)
            worker = self._worker
        now = time.monotonic()
        for gpu in self.gpus:
            if worker is not self._worker:
                return self._retire(worker)
            if not gpu.active or gpu.hung:
                continue
            t0 = time.monotonic_ns()
            worker.busy = (gpu, t0)
            try:
                self._sample(gpu, worker, t0)
                if now >= gpu.procs_due:
                    gpu.procs_due = now + self.process_interval
                    self._sample_procs(gpu, worker)
            except GpuLost as exc:
                self._lost(gpu, exc)
            except NvmlUnavailable as exc:
                self._gone(exc)
                return False
            except Exception as exc:  # NvmlCallFailed, or anything unforeseen
                self._failed(gpu, exc)
            finally:
                worker.busy = None
        if worker is not self._worker:
            return self._retire(worker)
        return True

    def _retire(self, worker: _Worker) -> bool:
        """End a thread the watchdog replaced: its hung call has returned by now."""
        gpu = worker.set_aside
        if gpu is not None:
            gpu.hung = False  # the current thread samples it again from its next tick
            if gpu.active:
                self.session.set_device_state(gpu.key, "ok")
        return False

    def _sample(self, gpu: _Gpu, worker: _Worker, t0: int) -> None:
        dev = gpu.dev
        assert dev is not None
        mem = dev.memory()
        t1 = time.monotonic_ns()
        try:
            util = dev.utilization()
            temp = dev.temperature()
            power = dev.power()
            clock_sm = dev.clock("sm")
            clock_mem = dev.clock("mem")
        except (NvmlCallFailed, NvmlNoPermission):
            util = temp = power = clock_sm = clock_mem = NA  # one bad tick; memory counts
        if mem is NA:
            mem = _NO_MEMORY
        row = {
            # The midpoint of the memory call: what "used" refers to.
            "t": (t0 + t1) >> 1,
            "used": mem.used,
            "free": mem.free,
            "total": mem.total,
            "reserved": mem.reserved,
            "util_gpu": None if util is NA else util[0],
            "util_mem": None if util is NA else util[1],
            "temp": None if temp is NA else temp,
            "power": None if power is NA else power,
            "power_limit": gpu.power_limit,
            "clock_sm": None if clock_sm is NA else clock_sm,
            "clock_mem": None if clock_mem is NA else clock_mem,
        }
        if worker is not self._worker:
            return  # taken while the call hung: too stale to place on the axis
        self.session.add_gpu_sample(gpu.key, row)
        gpu.count += 1
        if gpu.errors:
            gpu.errors = 0
            self.session.set_device_state(gpu.key, "ok")

    def _sample_procs(self, gpu: _Gpu, worker: _Worker) -> None:
        assert gpu.dev is not None
        try:
            procs = gpu.dev.processes()
        except NvmlNoPermission:
            if not gpu.procs_denied:
                gpu.procs_denied = True
                self.session.note(
                    "no permission to list GPU processes (NVML): memory is still sampled; "
                    "run gpuwatch as root or the processes' owner to see them"
                )
            return
        except NvmlCallFailed:
            return  # try again at the next process interval
        if procs is NA or worker is not self._worker:
            return
        util = gpu.dev.process_utilization(gpu.util_since)
        t = time.monotonic_ns()
        if worker is not self._worker:
            return
        rows = sorted(self._row(p.pid, p.used, p.type, util) for p in procs)
        if util is not NA and util:
            gpu.util_since = max(ts for ts, _, _ in util.values())
        if rows != gpu.last_procs:
            gpu.last_procs = rows
            self.session.add_gpu_processes(gpu.key, t, rows)
        pids = frozenset(r[0] for r in rows)
        if pids != gpu.last_pids:
            gpu.last_pids = pids
            self._join(pids)
        self._children.update(self._listed, self._info.get)

    def _row(
        self, pid: int, used: int | None, kind: int, util: dict[int, tuple[int, int, int]] | Any
    ) -> tuple[int, int | None, int, float | None, float | None, float | None, int | None]:
        """One process of a snapshot: NVML's figures, then the host's (CPU %, RSS).

        A process without a sample since the last snapshot did not use the SMs: 0 %, where
        NVML offers the samples at all (n/a where it does not).
        """
        sm = mem = None
        if util is not NA:
            _, sm, mem = util.get(pid, (0, 0, 0))
        try:
            # A pid in another PID namespace is not found here: unknown.
            st = self._stat.read(pid)
        except PermissionError:
            st = None
        cpu = None if st is None else self._cpu.update(pid, st.cpu)
        return (pid, used, kind, sm, mem, cpu, None if st is None else st.rss)

    def _join(self, new: frozenset[int]) -> None:
        """Describe PIDs not seen before; forget those no GPU lists any more (PID reuse)."""
        for pid in new:
            if pid not in self._info:
                info = self._info[pid] = describe_pid(pid)
                self.session.set_proc_info(pid, info)
        listed = self._listed = set().union(*(g.last_pids for g in self.gpus))
        for pid in [p for p in self._info if p not in listed]:
            del self._info[pid]
        self._cpu.keep(listed)
        self._stat.keep(listed)
        # The launchers of what runs (torchrun, accelerate, a shell): the tree view shows
        # a process under its parent, which need not use a GPU itself.
        for pid in new:
            parent = self._info.get(pid, {}).get("ppid")
            if parent and parent > 1 and parent not in listed and parent not in self._parents:
                if len(self._parents) >= 4096:  # a bound, not a history
                    self._parents.clear()
                self._parents.add(parent)
                self.session.set_proc_info(parent, describe_pid(parent))

    def _publish(self, pid: int, info: dict[str, Any]) -> None:
        """A description for the session (a listed process's, with its children, is also
        the one the sampler keeps)."""
        if pid in self._info:
            self._info[pid] = info
        self.session.set_proc_info(pid, info)

    # ------------------------------------------------------------------ faults

    def _lost(self, gpu: _Gpu, exc: GpuLost) -> None:
        gpu.active = False
        self.session.set_device_state(gpu.key, "lost", self._lost_note(exc))
        self.session.set_sampler_rate(gpu.key, 0.0)

    def _lost_note(self, exc: GpuLost) -> str:
        if exc.code == self.nvml.codes.get("RESET_REQUIRED"):
            return "the GPU needs a reset: no more samples"
        return "GPU is lost (fell off the bus): no more samples"

    def _failed(self, gpu: _Gpu, exc: Exception) -> None:
        gpu.errors += 1
        if gpu.errors == _ERRORS_BEFORE_STATE:
            self.session.set_device_state(gpu.key, "error", f"NVML keeps failing: {exc}")

    def _gone(self, exc: NvmlUnavailable) -> None:
        """NVML as a whole went away (driver unloaded or replaced): stop every GPU."""
        for gpu in self.gpus:
            if gpu.active:
                gpu.active = False
                self.session.set_device_state(gpu.key, "error", f"NVML went away: {exc}")
                self.session.set_sampler_rate(gpu.key, 0.0)
        self.session.note(f"NVML went away ({exc}): GPU sampling stopped")

    # ------------------------------------------------------------------ watchdog

    def _watch(self) -> None:
        """Publish achieved rates; set aside a GPU whose NVML call has hung."""
        period = min(0.25, max(0.02, self.hang_after / 4))
        window = max(1.0, 4 * self.interval)  # seconds of history per rate
        history: deque[tuple[float, dict[str, int]]] = deque()
        while not self._stop.wait(period):
            worker = self._worker
            busy = worker.busy if worker is not None else None
            if worker is not None and busy is not None:
                gpu, since = busy
                stuck = (time.monotonic_ns() - since) / 1e9
                if stuck > self.hang_after and not gpu.hung:
                    self._set_aside(worker, gpu, stuck)
            now = time.monotonic()
            gpus = list(self.gpus)  # open() may still be adding GPUs after a slow init
            history.append((now, {g.key: g.count for g in gpus}))
            while len(history) > 1 and now - history[1][0] >= window:
                history.popleft()
            then, old = history[0]
            span = now - then
            if span < min(window, max(0.5, 2 * self.interval)):
                continue
            counts = history[-1][1]
            for g in gpus:
                rate = (counts[g.key] - old.get(g.key, 0)) / span if g.active else 0.0
                self.session.set_sampler_rate(g.key, rate)

    def _set_aside(self, worker: _Worker, gpu: _Gpu, stuck: float) -> None:
        """Mark ``gpu`` hung and give the other GPUs to a fresh sampling thread."""
        gpu.hung = True
        worker.set_aside = gpu
        self.session.set_device_state(
            gpu.key,
            "error",
            f"an NVML call has not returned for {stuck:.1f} s: other GPUs keep sampling",
        )
        if worker is self._worker and not self._stop.is_set():
            self._spawn(_Worker(worker.gen + 1))


_NO_MEMORY = MemoryInfo(None, None, None, None)  # type: ignore[arg-type]
