"""A scripted stand-in for exactly the pynvml functions gpuwatch.sources.nvml calls.

It raises pynvml's real ``NVMLError`` classes with pynvml's codes and returns pynvml's real
ctypes structures, so the wrapper under test sees what it would see on a GPU. It models
several GPUs, memory traces, every error the sampler handles (per call, per GPU, for a
number of calls or for good), missing versioned symbols (old drivers) and missing Python
functions (old bindings), slow and hanging calls, and how CUDA numbers the GPUs under
``CUDA_VISIBLE_DEVICES`` (which NVML ignores).

Two ways to use it:

- tests build a :class:`FakeNvml` and pass it as the backend
  (``Nvml(fake)`` / ``GpuSampler(session, nvml=Nvml(fake))``);
- a child process runs with ``GPUWATCH_NVML_BACKEND=tests.fake_nvml`` (importable, or run
  from the repository root: the installed ``gpuwatch`` command looks for the dotted path
  under the current directory) or ``GPUWATCH_NVML_BACKEND=/path/to/tests/fake_nvml.py``:
  this module then behaves as pynvml itself, serving a fake built from the JSON in
  ``$GPUWATCH_FAKE_NVML`` (see :meth:`FakeNvml.from_spec`).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml

GiB = 1 << 30
MiB = 1 << 20

NVMLError = pynvml.NVMLError
Trace = int | Sequence[int] | Callable[[int], int]


@dataclass(eq=False)
class FakeGpu:
    """One modelled GPU; also serves as its NVML handle.

    Attributes:
        uuid: NVML's UUID (``GPU-…``).
        name: Product name.
        bus_id: PCI bus id.
        total: Total memory in bytes.
        used: Memory trace: a constant, a sequence played one value per memory call (the
            last value holds), or a function of ``time.monotonic_ns()``.
        reserved: Driver-reserved bytes (memory info v2).
        util: (GPU %, memory %).
        temp: °C.
        power_mw: Power draw in milliwatts.
        power_limit_mw: Enforced power limit in milliwatts.
        clock_sm: MHz.
        clock_mem: MHz.
        compute: Compute processes as (pid, used bytes or None).
        graphics: Graphics processes as (pid, used bytes or None).
        lost: Every call on it raises GPU_IS_LOST (it fell off the bus).
        mig: Its MIG instances (MIG mode on), or None: MIG not supported (see
            :func:`mig_instances`).
        mig_of: For a MIG instance, the GPU it is carved from.
        proc_util: Per-process utilisation: pid -> (SM %, memory %) (see the
            "per-process utilisation" section of :class:`FakeNvml`).
        hidden: Used bytes of processes NVML does not list (another container, no
            permission): added to ``used``, attributed to no listed process.
    """

    uuid: str
    name: str = "NVIDIA Fake A100-SXM4-80GB"
    bus_id: str = "00000000:00:00.0"
    total: int = 80 * GiB
    used: Trace = 512 * MiB
    reserved: int = 480 * MiB
    util: tuple[int, int] = (0, 0)
    temp: int = 35
    power_mw: int = 60_000
    power_limit_mw: int = 400_000
    clock_sm: int = 1410
    clock_mem: int = 1593
    compute: list[tuple[int, int | None]] = field(default_factory=list)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    lost: bool = False
    # MIG (issue 38): a GPU in MIG mode lists its instances; an instance names its parent.
    mig: list[FakeGpu] | None = None
    mig_of: FakeGpu | None = None
    proc_util: dict[int, tuple[int, int]] = field(default_factory=dict)
    hidden: int = 0
    _step: int = 0
    _util_samples: list[tuple[int, int, int, int]] = field(default_factory=list)

    def used_now(self) -> int:
        """The trace's next value (advances a sequence trace by one)."""
        u = self.used
        if isinstance(u, int):
            return u + self.hidden
        if callable(u):
            return int(u(time.monotonic_ns())) + self.hidden
        v = u[min(self._step, len(u) - 1)]
        self._step += 1
        return v + self.hidden


@dataclass
class _Rule:
    """A scripted behaviour of one pynvml function (on one GPU, or all when index None)."""

    call: str
    index: int | None
    code: int | None = None  # raise NVMLError(code)
    times: int | None = None  # how many calls it applies to (None: for good)
    delay: float = 0.0  # seconds each call takes
    gate: threading.Event | None = None  # the call blocks until this is set


class FakeNvml:
    """A fake pynvml with scripted GPUs.

    Args:
        gpus: The GPUs in NVML's order (PCI bus order), or how many default ones to make.
        driver: Driver version string.
        init_error: NVML error code ``nvmlInit`` raises (e.g. LIBRARY_NOT_FOUND).
        missing_symbols: Functions the "driver" lacks: calling them raises
            FUNCTION_NOT_FOUND, as pynvml does for a symbol libnvidia-ml does not export.
        missing_functions: Names the "binding" lacks altogether (AttributeError), as in an
            older nvidia-ml-py.
        cuda_order: NVML indices in CUDA's enumeration order (CUDA orders fastest first
            unless CUDA_DEVICE_ORDER=PCI_BUS_ID, so on mixed GPUs it differs from NVML).
            Default: NVML's order.
    """

    def __init__(
        self,
        gpus: int | Sequence[FakeGpu] = 1,
        *,
        driver: str = "550.54.15",
        init_error: int | None = None,
        missing_symbols: Sequence[str] = (),
        missing_functions: Sequence[str] = (),
        cuda_order: Sequence[int] | None = None,
    ) -> None:
        if isinstance(gpus, int):
            gpus = [default_gpu(i) for i in range(gpus)]
        self.gpus: list[FakeGpu] = list(gpus)
        self.driver = driver
        self.init_error = init_error
        self.missing_symbols = set(missing_symbols)
        self.missing_functions = set(missing_functions)
        self.cuda_order = list(range(len(self.gpus))) if cuda_order is None else list(cuda_order)
        self.calls: Counter[str] = Counter()
        self.processes_file: str | None = None  # see _reload_compute
        self.initialised = 0
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        if self.missing_functions:
            # An older binding: these names are absent (hasattr is False). A class of its
            # own keeps attribute lookup plain and fast for every other fake.
            hidden = {n: property(_absent(n)) for n in self.missing_functions}
            self.__class__ = type("FakeNvmlOldBinding", (FakeNvml,), hidden)

    # ------------------------------------------------------------------ scripting

    def fail(self, call: str, code: int, index: int | None = None, times: int | None = None):
        """Make ``call`` raise NVMLError(code) on GPU ``index`` (all: None)."""
        self._add(_Rule(call, index, code=code, times=times))

    def slow(self, call: str, seconds: float, index: int | None = None) -> None:
        """Make every ``call`` on GPU ``index`` (all: None) take ``seconds``."""
        self._add(_Rule(call, index, delay=seconds))

    def hang(self, call: str, index: int | None = None) -> threading.Event:
        """Make ``call`` block until the returned event is set (``release`` sets it)."""
        gate = threading.Event()
        self._add(_Rule(call, index, gate=gate))
        return gate

    def release(self) -> None:
        """Unblock every hanging call and drop the hang rules."""
        with self._lock:
            for r in self._rules:
                if r.gate is not None:
                    r.gate.set()
            self._rules = [r for r in self._rules if r.gate is None]

    def clear(self) -> None:
        """Drop every scripted behaviour (hangs are released first)."""
        self.release()
        with self._lock:
            self._rules = []

    def lose(self, index: int) -> None:
        """GPU ``index`` falls off the bus: every call on it raises GPU_IS_LOST."""
        self.gpus[index].lost = True

    def _add(self, rule: _Rule) -> None:
        with self._lock:
            self._rules.append(rule)

    # ------------------------------------------------------------------ CUDA's view

    def cuda_devices(self, visible: str | None) -> list[FakeGpu]:
        """The GPUs a CUDA process sees, in torch's index order, for a CUDA_VISIBLE_DEVICES.

        Entries are CUDA indices or (prefixes of) UUIDs; as in CUDA, the first entry that
        matches nothing, or repeats one, ends the list. None: every GPU.
        """
        ordered = [self.gpus[i] for i in self.cuda_order]
        if visible is None:
            return ordered
        out: list[FakeGpu] = []
        for entry in (e.strip() for e in visible.split(",")):
            if entry.isdigit():
                i = int(entry)
                gpu = ordered[i] if i < len(ordered) else None
            else:
                matches = [g for g in ordered if entry and g.uuid.startswith(entry)]
                gpu = matches[0] if len(matches) == 1 else None
            if gpu is None or gpu in out:
                break
            out.append(gpu)
        return out

    @staticmethod
    def torch_uuid(gpu: FakeGpu) -> str:
        """The UUID as ``str(torch.cuda.get_device_properties(i).uuid)`` prints it."""
        return gpu.uuid.removeprefix("GPU-")

    # ------------------------------------------------------------------ pynvml surface

    def __getattr__(self, name: str) -> Any:
        # Constants, structures and error classes: pynvml's own.
        if name in self.__dict__.get("missing_functions", ()):
            raise AttributeError(name)
        if name.startswith(("NVML_", "nvmlMemory_", "NVMLError", "c_nvml", "nvmlTemperature_")):
            return getattr(pynvml, name)
        raise AttributeError(name)

    def _enter(self, call: str, gpu: FakeGpu | None) -> None:
        """Count the call and apply the script (errors, delays, hangs, lost GPUs)."""
        self.calls[call] += 1
        if not self.initialised:
            raise NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if call in self.missing_symbols:
            raise NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if self._rules:
            self._scripted(call, gpu)
        if gpu is not None and gpu.mig_of is not None:
            _mig_enter(call, gpu)
        if gpu is not None and gpu.lost:
            raise NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    def _scripted(self, call: str, gpu: FakeGpu | None) -> None:
        if gpu is not None and gpu.mig_of is not None:
            gpu = gpu.mig_of  # a rule on a GPU applies to its MIG instances too
        index = None if gpu is None else self.gpus.index(gpu)
        with self._lock:
            rules = [
                r for r in self._rules if r.call == call and (r.index is None or r.index == index)
            ]
            for r in rules:
                if r.times is not None:
                    r.times -= 1
                    if r.times <= 0:
                        self._rules.remove(r)
        for r in rules:
            if r.gate is not None:
                r.gate.wait()
            if r.delay:
                time.sleep(r.delay)
            if r.code is not None:
                raise NVMLError(r.code)

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self._rules:  # a slow or hanging start of the driver
            self._scripted("nvmlInit", None)
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown", None)
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion", None)
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount", None)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if not 0 <= index < len(self.gpus):
            self._enter("nvmlDeviceGetHandleByIndex", None)
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        self._enter("nvmlDeviceGetHandleByIndex", gpu)
        return gpu

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        self._enter("nvmlDeviceGetName", h)
        return h.name

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        self._enter("nvmlDeviceGetUUID", h)
        return h.uuid

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> Any:
        self._enter("nvmlDeviceGetPciInfo", h)
        info = pynvml.nvmlPciInfo_t()
        info.busId = h.bus_id.encode()
        return info

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu, version: int | None = None) -> Any:
        if version:
            self._enter("nvmlDeviceGetMemoryInfo_v2", h)
            if version != pynvml.nvmlMemory_v2:
                raise NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
            m = pynvml.c_nvmlMemory_v2_t()
            m.version = version
            m.total = h.total
            m.reserved = h.reserved
            m.used = h.used_now()
            m.free = h.total - h.reserved - m.used
            return m
        self._enter("nvmlDeviceGetMemoryInfo", h)
        m = pynvml.c_nvmlMemory_t()
        m.total = h.total
        m.used = h.used_now() + h.reserved  # v1's used includes the driver's reservation
        m.free = h.total - m.used
        return m

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates", h)
        u = pynvml.c_nvmlUtilization_t()
        u.gpu, u.memory = h.util
        return u

    def nvmlDeviceGetTemperatureV(self, h: FakeGpu, sensor: int, version: int = 0) -> int:
        self._enter("nvmlDeviceGetTemperatureV", h)
        return h.temp

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", h)
        return h.temp

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetPowerUsage", h)
        return h.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetEnforcedPowerLimit", h)
        return h.power_limit_mw

    def nvmlDeviceGetPowerManagementLimit(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetPowerManagementLimit", h)
        return h.power_limit_mw

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, kind: int) -> int:
        self._enter("nvmlDeviceGetClockInfo", h)
        if kind == pynvml.NVML_CLOCK_SM:
            return h.clock_sm
        if kind == pynvml.NVML_CLOCK_MEM:
            return h.clock_mem
        raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _procs(self, call: str, h: FakeGpu, rows: list[tuple[int, int | None]]) -> list[Any]:
        self._enter(call, h)
        return [
            pynvml.nvmlFriendlyObject(
                {
                    "pid": pid,
                    "usedGpuMemory": used,
                    "gpuInstanceId": 0xFFFFFFFF,
                    "computeInstanceId": 0xFFFFFFFF,
                }
            )
            for pid, used in rows
        ]

    def _reload_compute(self) -> None:
        """Read the compute processes of every GPU anew from :attr:`processes_file`, when
        one is set: a test lists processes that start after gpuwatch did."""
        if self.processes_file is None:
            return
        try:
            with open(self.processes_file) as f:
                rows = json.load(f)
        except (OSError, ValueError):
            return  # not written yet, or caught mid-write: the last list holds
        for gpu in self.gpus:
            gpu.compute = []
        for pid, used, index in rows:
            self.gpus[index].compute.append((int(pid), used))

    def nvmlDeviceGetComputeRunningProcesses_v3(self, h: FakeGpu) -> list[Any]:
        self._reload_compute()
        return self._procs("nvmlDeviceGetComputeRunningProcesses_v3", h, h.compute)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h: FakeGpu) -> list[Any]:
        self._reload_compute()
        return self._procs("nvmlDeviceGetComputeRunningProcesses_v2", h, h.compute)

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[Any]:
        self._reload_compute()
        return self._procs("nvmlDeviceGetComputeRunningProcesses", h, h.compute)

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, h: FakeGpu) -> list[Any]:
        return self._procs("nvmlDeviceGetGraphicsRunningProcesses_v3", h, h.graphics)

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, h: FakeGpu) -> list[Any]:
        return self._procs("nvmlDeviceGetGraphicsRunningProcesses_v2", h, h.graphics)

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: FakeGpu) -> list[Any]:
        return self._procs("nvmlDeviceGetGraphicsRunningProcesses", h, h.graphics)

    # ------------------------------------------------------------------ MIG (issue 38)

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", h)
        if h.mig is None:
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if h.mig else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", h)
        if h.mig is None:
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return MIG_SLOTS

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeGpu, slot: int) -> FakeGpu:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", h)
        if h.mig is None:
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= slot < MIG_SLOTS:
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if slot >= len(h.mig):  # as on a GPU: an empty slot is not found
            raise NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return h.mig[slot]

    # ------------------------------------------------------------------ per-process utilisation
    # (issue 38: processes, nvitop-complete) NVML keeps a buffer of per-process samples per
    # GPU and returns those newer than the caller's timestamp (CPU µs since the epoch), or
    # NOT_FOUND when there is none. Each call here adds one sample per pid of
    # ``proc_util`` to the buffer first, as a busy GPU would have since the last call.

    def set_process(
        self,
        index: int,
        pid: int,
        used: int | None,
        sm: int | None = None,
        mem: int = 0,
    ) -> None:
        """List ``pid`` as a compute process on GPU ``index`` using ``used`` bytes, and,
        when ``sm`` is given, give it per-process utilisation samples of (sm %, mem %).

        The process's user is whoever owns ``pid`` on this machine (pid 1: root), as with
        the real driver: NVML reports pids, psutil says whose they are.
        """
        gpu = self.gpus[index]
        gpu.compute = [r for r in gpu.compute if r[0] != pid] + [(pid, used)]
        if sm is not None:
            gpu.proc_util[pid] = (sm, mem)

    def nvmlDeviceGetProcessUtilization(self, h: FakeGpu, timeStamp: int) -> list[Any]:
        self._enter("nvmlDeviceGetProcessUtilization", h)
        now_us = time.time_ns() // 1000
        for pid, (sm, mem) in h.proc_util.items():
            h._util_samples.append((pid, now_us, sm, mem))
        # The driver's buffer holds the last samples (a few per process here: enough for
        # a caller that reads every second, and a short scan for a fake serving hundreds).
        keep = 4 * max(1, len(h.proc_util))
        del h._util_samples[: max(0, len(h._util_samples) - keep)]
        out = []
        for pid, ts, sm, mem in h._util_samples:
            if ts > timeStamp:
                s = pynvml.c_nvmlProcessUtilizationSample_t()
                s.pid, s.timeStamp, s.smUtil, s.memUtil = pid, ts, sm, mem
                out.append(s)
        if not out:
            raise NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return out

    # ------------------------------------------------------------------ from a spec

    @classmethod
    def from_spec(cls, spec: str | dict[str, Any]) -> FakeNvml:
        """A fake from JSON (for child processes), e.g.
        ``{"gpus": 2, "trace": "training", "processes": [[1234, 1073741824, 0]]}``.

        Keys: ``gpus`` (count), ``trace`` (``flat``, ``ramp`` or ``training``),
        ``init_error`` (an NVML_ERROR_ name without the prefix, e.g. ``LIBRARY_NOT_FOUND``),
        ``processes`` ([pid, used bytes, NVML index] compute processes), ``processes_file``
        (a JSON file of such rows, read anew at each process-list call), ``mig``
        ([NVML index, instances] GPUs in MIG mode, see :func:`mig_instances`), ``lose``
        ([NVML index, seconds after start]), ``missing_symbols`` (list), ``proc_util``
        ([pid, SM %, memory %, NVML index] per-process utilisation), ``hidden``
        ([NVML index, bytes] used by processes NVML does not list), ``util`` ([NVML index,
        GPU %, memory %] utilisation).
        """
        if isinstance(spec, str):
            spec = json.loads(spec) if spec.strip() else {}
        trace = TRACES[spec.get("trace", "training")]
        gpus = [default_gpu(i, used=trace(i)) for i in range(int(spec.get("gpus", 1)))]
        for pid, used, index in spec.get("processes", ()):
            gpus[index].compute.append((int(pid), used))
        for index, count in spec.get("mig", ()):
            mig_instances(gpus[int(index)], int(count))
        init_error = spec.get("init_error")
        fake = cls(
            gpus,
            init_error=None if init_error is None else getattr(pynvml, "NVML_ERROR_" + init_error),
            missing_symbols=spec.get("missing_symbols", ()),
        )
        fake.processes_file = spec.get("processes_file")
        for pid, sm, mem, index in spec.get("proc_util", ()):
            gpus[index].proc_util[int(pid)] = (int(sm), int(mem))
        for index, hidden in spec.get("hidden", ()):
            gpus[index].hidden = int(hidden)
        for index, gpu_pct, mem_pct in spec.get("util", ()):
            gpus[index].util = (int(gpu_pct), int(mem_pct))
        if "lose" in spec:
            index, after = spec["lose"]
            timer = threading.Timer(float(after), fake.lose, args=(int(index),))
            timer.daemon = True
            timer.start()
        return fake


def _absent(name: str) -> Callable[[Any], Any]:
    def get(self: Any) -> Any:
        raise AttributeError(name)

    return get


# ---------------------------------------------------------------------- MIG (issue 38)

MIG_SLOTS = 7
"""What nvmlDeviceGetMaxMigDeviceCount answers (an A100's or H100's seven slices)."""

_MIG_NOT_SUPPORTED = frozenset(
    {
        # NVML gives these per GPU, not per MIG instance.
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetPowerManagementLimit",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMaxMigDeviceCount",
    }
)


def _mig_enter(call: str, instance: FakeGpu) -> None:
    """A MIG handle: lost with its GPU, and without the per-GPU readings."""
    parent = instance.mig_of
    assert parent is not None
    if parent.lost:
        raise NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    if call in _MIG_NOT_SUPPORTED:
        raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def mig_instances(gpu: FakeGpu, count: int) -> list[FakeGpu]:
    """Put ``gpu`` in MIG mode with ``count`` equal instances (0: MIG on, none made).

    Each instance has a quarter of the GPU's memory at most (as the 2g.20gb profile of an
    80 GB card), its own UUID (``MIG-…``) and a distinct flat used figure (2 GiB + 3 GiB
    per slot) that tests compare with what is shown. The GPU's own used memory becomes
    the instances' sum.
    """
    size = gpu.total // max(4, count + 1)
    gib = size // GiB
    stem = gpu.uuid.removeprefix("GPU-")[:8]
    gpu.mig = [
        FakeGpu(
            uuid=f"MIG-{stem}-{slot:04x}-4d1e-8c0a-{0xB000 + slot:012x}",
            name=f"{gpu.name} MIG 2g.{gib}gb",
            bus_id=gpu.bus_id,
            total=size,
            used=2 * GiB + 3 * GiB * slot,
            reserved=0,
            mig_of=gpu,
        )
        for slot in range(count)
    ]
    instances = gpu.mig
    gpu.used = lambda t_ns: sum(i.used_now() for i in instances)
    return gpu.mig


def default_gpu(index: int, **kw: Any) -> FakeGpu:
    """A plausible GPU for NVML index ``index`` (distinct UUID and bus id)."""
    kw.setdefault("uuid", f"GPU-{index:08x}-fa4e-4b1d-9c0a-{0xA100 + index:012x}")
    kw.setdefault("bus_id", f"00000000:{0x10 + index:02X}:00.0")
    return FakeGpu(**kw)


def _training_trace(index: int) -> Callable[[int], int]:
    """A training-like used-memory curve: ramps each 2 s step, spikes in the optimizer."""
    phase = index * 0.37

    def used(t_ns: int) -> int:
        s = t_ns / 1e9 + phase
        step = s % 2.0
        base = 20 * GiB + int(math.sin(s / 30) * GiB)
        acts = int(min(step, 1.4) / 1.4 * 12 * GiB) if step < 1.7 else 0
        spike = 6 * GiB if 1.7 <= step < 1.75 else 0
        return base + acts + spike

    return used


TRACES: dict[str, Callable[[int], Trace]] = {
    "flat": lambda index: 20 * GiB,
    "ramp": lambda index: lambda t_ns: (t_ns // 10_000_000 % 1000) * 64 * MiB,
    "training": _training_trace,
}

_default: FakeNvml | None = None
_default_lock = threading.Lock()


def default() -> FakeNvml:
    """The fake served by this module, built once from ``$GPUWATCH_FAKE_NVML``."""
    global _default
    with _default_lock:
        if _default is None:
            _default = FakeNvml.from_spec(os.environ.get("GPUWATCH_FAKE_NVML", ""))
        return _default


def __getattr__(name: str) -> Any:
    # As a backend module (GPUWATCH_NVML_BACKEND=tests.fake_nvml): pynvml's names, served
    # by the default fake.
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(default(), name)
