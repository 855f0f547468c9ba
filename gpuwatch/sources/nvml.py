"""The one door to NVML: a thin wrapper over ``pynvml`` (the ``nvidia-ml-py`` package).

Nothing else in gpuwatch imports ``pynvml``. Every read returns a value or :data:`NA`
("n/a": the GPU, driver or library does not offer it), and raises one of a few exceptions
only for states the sampler must act on:

- :class:`NvmlUnavailable`: no library, no driver, or NVML stopped answering as a whole;
- :class:`GpuLost`: this GPU fell off the bus (or needs a reset): stop sampling it;
- :class:`NvmlNoPermission`: this process may not read it (process lists, typically);
- :class:`NvmlCallFailed`: a timeout or unknown error: worth retrying.

Versioned NVML symbols are tried newest first (memory info v2 with the driver-reserved
figure, then v1; process lists v3, v2, v1; ``nvmlDeviceGetTemperatureV`` then the legacy
call), and whichever one works is remembered per device. A field that is not supported
is remembered too, so it costs nothing on later ticks.

The backend is a module (or any object) with pynvml's names. It is ``pynvml`` unless a
constructor argument or ``$GPUWATCH_NVML_BACKEND`` says otherwise; nothing is patched at
run time. The variable names a module (``tests.fake_nvml``: importable, or a file of that
dotted path under the current directory, so the installed ``gpuwatch`` command finds a
repository's fake from its root) or a Python file (``/path/to/fake_nvml.py``). Nothing of
the kind ships with gpuwatch, and a session on such a backend carries a note saying its
GPUs are not this machine's.
"""

from __future__ import annotations

import enum
import importlib
import os
from typing import Any, Final, Literal, NamedTuple

BACKEND_ENV = "GPUWATCH_NVML_BACKEND"
"""Environment variable naming the module to use instead of ``pynvml``."""

# pynvml's error codes, for backends that do not define every constant (old bindings).
_CODES = {
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "NOT_FOUND": 6,
    "INSUFFICIENT_POWER": 8,
    "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "LIB_RM_VERSION_MISMATCH": 18,
    "NO_DATA": 21,
    "ARGUMENT_VERSION_MISMATCH": 25,
    "DEPRECATED": 26,
    "NOT_READY": 27,
    "UNKNOWN": 999,
}

# Codes that mean "this call will never work here": remembered, never called again.
_NEVER = ("NOT_SUPPORTED", "FUNCTION_NOT_FOUND", "DEPRECATED", "ARGUMENT_VERSION_MISMATCH")
# Codes that mean "no value right now": n/a for this tick, asked again next time.
_NOT_NOW = ("NO_DATA", "NOT_READY", "NOT_FOUND", "INSUFFICIENT_POWER")
_UNAVAILABLE = (
    "UNINITIALIZED",
    "DRIVER_NOT_LOADED",
    "LIBRARY_NOT_FOUND",
    "LIB_RM_VERSION_MISMATCH",
)
_LOST = ("GPU_IS_LOST", "RESET_REQUIRED")


class NotAvailable(enum.Enum):
    """The type of :data:`NA`: a field NVML cannot give on this GPU (falsy, prints n/a).

    An enum of one member, so that ``value is NA`` narrows ``T | NotAvailable`` to ``T``
    for the type checker as it does at run time.
    """

    NA = "n/a"

    def __bool__(self) -> Literal[False]:
        return False

    def __repr__(self) -> str:
        return "n/a"

    __str__ = __repr__


NA: Final = NotAvailable.NA
"""The one "n/a" value: compare with ``is NA``."""


class NvmlError(Exception):
    """Base of the failures the sampler acts on.

    Attributes:
        code: NVML's error code, or None when the failure did not come from NVML.
        call: The pynvml function that failed, if any.
    """

    def __init__(self, message: str, code: int | None = None, call: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.call = call


class NvmlUnavailable(NvmlError):
    """No NVML here: the library or driver is missing, or NVML went away as a whole."""


class GpuLost(NvmlError):
    """The GPU fell off the bus or needs a reset; nothing more will be read from it."""


class NvmlNoPermission(NvmlError):
    """This process is not allowed to read it (e.g. other users' GPU processes)."""


class NvmlCallFailed(NvmlError):
    """A timeout, an unknown error or any other failure of one call: try again later."""


class MemoryInfo(NamedTuple):
    """One reading of a GPU's memory, in bytes.

    ``reserved`` is the driver's own reservation (memory info v2); None where only v1
    exists, in which case ``used`` includes it, as NVML documents for v1.
    """

    total: int
    free: int
    used: int
    reserved: int | None


class NvmlProcess(NamedTuple):
    """One process NVML reports on a GPU.

    Attributes:
        pid: Process id as the driver sees it (the host's PID namespace).
        used: GPU memory in bytes, None where NVML cannot say (e.g. under WDDM or MIG).
        type: 0 compute, 1 graphics, 2 both.
    """

    pid: int
    used: int | None
    type: int


def load_backend(name: str | None = None) -> Any:
    """Import the NVML binding: ``name``, else ``$GPUWATCH_NVML_BACKEND``, else pynvml.

    ``name`` is a module name or a ``.py`` file (see the module docstring).

    Raises:
        NvmlUnavailable: The module cannot be imported.
    """
    name = name or os.environ.get(BACKEND_ENV) or "pynvml"
    if name.endswith(".py") or os.sep in name:
        return _load_file(name, name)
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        # A console script does not put the current directory on sys.path the way
        # ``python -m`` does: look for the dotted path there before giving up.
        local = os.path.join(os.getcwd(), *name.split(".")) + ".py"
        if name != "pynvml" and os.path.isfile(local):
            return _load_file(local, name)
        raise NvmlUnavailable(f"cannot import {name} ({exc})")


def _load_file(path: str, name: str) -> Any:
    import importlib.util
    import sys

    module_name = "gpuwatch_nvml_backend_" + "".join(c if c.isalnum() else "_" for c in name)
    if module_name in sys.modules:
        return sys.modules[module_name]
    try:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"not a Python file: {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    except (ImportError, OSError, SyntaxError) as exc:
        sys.modules.pop(module_name, None)
        raise NvmlUnavailable(f"cannot load {path} ({exc})")
    return module


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class Nvml:
    """NVML for one gpuwatch process.

    Args:
        backend: A module or object with pynvml's names (tests pass a fake). None: load it
            with :func:`load_backend` when :meth:`init` runs.
    """

    def __init__(self, backend: Any = None) -> None:
        self.backend = backend
        self.substitute: str | None = None
        """The ``$GPUWATCH_NVML_BACKEND`` in use instead of pynvml, once :meth:`init` ran."""
        self.error_class: type[BaseException] = Exception
        self.codes: dict[str, int] = {}
        self._kind: dict[int, str] = {}
        self._started = False

    # ------------------------------------------------------------------ library

    def init(self) -> None:
        """Load the backend and initialise NVML.

        Raises:
            NvmlUnavailable: No binding, library or driver.
            NvmlError: Any other failure of ``nvmlInit``.
        """
        if self.backend is None:
            self.backend = load_backend()
            chosen = os.environ.get(BACKEND_ENV) or "pynvml"
            self.substitute = None if chosen == "pynvml" else chosen
        b = self.backend
        self.error_class = getattr(b, "NVMLError", None) or _NoSuchError
        self.codes = {k: getattr(b, "NVML_ERROR_" + k, v) for k, v in _CODES.items()}
        for names, kind in (
            (_NEVER, "never"),
            (_NOT_NOW, "not now"),
            (_UNAVAILABLE, "unavailable"),
            (_LOST, "lost"),
            (("NO_PERMISSION",), "denied"),
        ):
            for n in names:
                self._kind[self.codes[n]] = kind
        try:
            b.nvmlInit()
        except self.error_class as exc:
            raise self._error(exc, "nvmlInit", default=NvmlUnavailable)
        except Exception as exc:  # e.g. a binding that lets the loader's OSError through
            raise NvmlUnavailable(f"nvmlInit: {exc}", call="nvmlInit")
        self._started = True

    def shutdown(self) -> None:
        """Release NVML (never raises: it runs on the way out)."""
        if not self._started:
            return
        self._started = False
        try:
            self.backend.nvmlShutdown()
        except Exception:
            pass

    def driver_version(self) -> str | NotAvailable:
        """The driver's version string, or n/a."""
        try:
            return _text(self.backend.nvmlSystemGetDriverVersion())
        except self.error_class:
            return NA

    def device_count(self) -> int:
        """How many GPUs NVML sees (it ignores CUDA_VISIBLE_DEVICES).

        Raises:
            NvmlError: NVML cannot tell.
        """
        try:
            return int(self.backend.nvmlDeviceGetCount())
        except self.error_class as exc:
            raise self._error(exc, "nvmlDeviceGetCount")

    def device(self, index: int) -> NvmlDevice:
        """The GPU at NVML's ``index``.

        Raises:
            GpuLost: It is there but lost.
            NvmlError: Any other failure.
        """
        try:
            handle = self.backend.nvmlDeviceGetHandleByIndex(index)
        except self.error_class as exc:
            raise self._error(exc, "nvmlDeviceGetHandleByIndex")
        return NvmlDevice(self, index, handle)

    # ------------------------------------------------------------------ errors

    def classify(self, exc: BaseException) -> str:
        """``never``, ``not now``, ``unavailable``, ``lost``, ``denied`` or ``failed``."""
        code = getattr(exc, "value", None)
        return self._kind.get(code, "failed") if isinstance(code, int) else "failed"

    def _error(
        self, exc: BaseException, call: str, default: type[NvmlError] = NvmlCallFailed
    ) -> NvmlError:
        code = getattr(exc, "value", None)
        kind = self.classify(exc)
        cls = {
            "unavailable": NvmlUnavailable,
            "lost": GpuLost,
            "denied": NvmlNoPermission,
        }.get(kind, default)
        return cls(f"{call}: {exc}", code=code, call=call)


class _NoSuchError(Exception):
    """Stands in for NVMLError with a backend that has none, so ``except`` clauses work."""


class NvmlDevice:
    """One GPU. Reads return a value or :data:`NA`.

    Reads raise :class:`GpuLost`, :class:`NvmlUnavailable` and :class:`NvmlCallFailed`
    as described in the module docstring; :meth:`processes` also raises
    :class:`NvmlNoPermission`. Instances are used from one thread at a time.

    Attributes:
        index: NVML's index (a MIG instance's is its parent's).
        handle: The backend's device handle (a MIG handle for an instance: its own memory;
            utilisation, temperature and power are n/a there, NVML gives them per GPU).
    """

    def __init__(self, nvml: Nvml, index: int, handle: Any, mig_slot: int | None = None) -> None:
        self.nvml = nvml
        self.index = index
        self.handle = handle
        self.mig_slot = mig_slot
        """Its slot among its parent's MIG instances; None for a whole GPU."""
        self._b = nvml.backend
        self._err = nvml.error_class
        self._never: set[str] = set()  # fields not supported here: never asked again
        b = self._b
        self._mem_v2 = getattr(b, "nvmlMemory_v2", None)  # None: use v1
        self._temp_v = hasattr(b, "nvmlDeviceGetTemperatureV")
        self._t_gpu = getattr(b, "NVML_TEMPERATURE_GPU", 0)
        self._clk = {
            "sm": getattr(b, "NVML_CLOCK_SM", 1),
            "mem": getattr(b, "NVML_CLOCK_MEM", 2),
        }
        self._proc_calls = {
            kind: [n for n in (f"{base}_v3", f"{base}_v2", base) if callable(getattr(b, n, None))]
            for kind, base in (
                ("compute", "nvmlDeviceGetComputeRunningProcesses"),
                ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
            )
        }

    def _fail(self, exc: BaseException, field: str, call: str) -> NotAvailable:
        """n/a for the codes that mean it; raise the sampler's exception for the rest."""
        kind = self.nvml.classify(exc)
        if kind == "never":
            self._never.add(field)
            return NA
        if kind == "not now":
            return NA
        raise self.nvml._error(exc, call)

    def _read(self, field: str, call: str, *args: Any) -> Any:
        """``call(handle, *args)``, or n/a: the one guard around a read of ``field``
        (never asked again once NVML says it is not supported here; see :meth:`_fail`)."""
        if field in self._never:
            return NA
        try:
            return getattr(self._b, call)(self.handle, *args)
        except self._err as exc:
            return self._fail(exc, field, call)

    def supports(self, field: str) -> bool:
        """False once NVML said ``field`` is not supported on this GPU."""
        return field not in self._never

    # ------------------------------------------------------------------ static facts

    def name(self) -> str | NotAvailable:
        """Product name."""
        return self._static("name", "nvmlDeviceGetName")

    def uuid(self) -> str | NotAvailable:
        """NVML's UUID (``GPU-…``)."""
        return self._static("uuid", "nvmlDeviceGetUUID")

    def bus_id(self) -> str | NotAvailable:
        """PCI bus id (``00000000:3B:00.0``)."""
        info = self._read("bus_id", "nvmlDeviceGetPciInfo")
        return NA if info is NA else _text(info.busId)

    def _static(self, field: str, call: str) -> str | NotAvailable:
        value = self._read(field, call)
        return NA if value is NA else _text(value)

    def power_limit(self) -> float | NotAvailable:
        """The enforced power limit in watts (else the management limit)."""
        for call in ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit"):
            if call in self._never or not hasattr(self._b, call):
                continue
            try:
                return float(getattr(self._b, call)(self.handle)) / 1000.0
            except self._err as exc:
                if self.nvml.classify(exc) != "never":
                    return self._fail(exc, "power_limit", call)
                self._never.add(call)
        return NA

    # ------------------------------------------------------------------ per tick

    def memory(self) -> MemoryInfo | NotAvailable:
        """Total, free, used and driver-reserved bytes (v2 where the driver has it)."""
        b = self._b
        if self._mem_v2 is not None:
            try:
                m = b.nvmlDeviceGetMemoryInfo(self.handle, version=self._mem_v2)
                return MemoryInfo(m.total, m.free, m.used, m.reserved)
            except self._err as exc:
                if self.nvml.classify(exc) != "never":
                    return self._fail(exc, "memory", "nvmlDeviceGetMemoryInfo_v2")
                self._mem_v2 = None  # an older driver: v1 from now on
            except TypeError:  # a binding without the version argument
                self._mem_v2 = None
        m = self._read("memory", "nvmlDeviceGetMemoryInfo")
        return NA if m is NA else MemoryInfo(m.total, m.free, m.used, None)

    def utilization(self) -> tuple[int, int] | NotAvailable:
        """(GPU %, memory-controller %) over NVML's last sample period."""
        u = self._read("util", "nvmlDeviceGetUtilizationRates")
        return NA if u is NA else (u.gpu, u.memory)

    def temperature(self) -> int | NotAvailable:
        """GPU core temperature in °C."""
        if self._temp_v:
            try:
                return int(self._b.nvmlDeviceGetTemperatureV(self.handle, self._t_gpu))
            except self._err as exc:
                if self.nvml.classify(exc) != "never":
                    return self._fail(exc, "temp", "nvmlDeviceGetTemperatureV")
                self._temp_v = False  # fall back to the legacy call
        t = self._read("temp", "nvmlDeviceGetTemperature", self._t_gpu)
        return NA if t is NA else int(t)

    def power(self) -> float | NotAvailable:
        """Power draw in watts."""
        mw = self._read("power", "nvmlDeviceGetPowerUsage")
        return NA if mw is NA else float(mw) / 1000.0

    def clock(self, which: str) -> int | NotAvailable:
        """Current ``"sm"`` or ``"mem"`` clock in MHz."""
        mhz = self._read("clock_" + which, "nvmlDeviceGetClockInfo", self._clk[which])
        return NA if mhz is NA else int(mhz)

    def processes(self) -> list[NvmlProcess] | NotAvailable:
        """Compute and graphics processes on this GPU, one entry per PID.

        Raises:
            NvmlNoPermission: This process may not list them.
        """
        kinds: dict[int, int] = {}  # pid -> bits: 1 compute, 2 graphics
        used: dict[int, int | None] = {}
        answered = False
        for kind, bit in (("compute", 1), ("graphics", 2)):
            procs = self._process_list(kind)
            if procs is NA:
                continue
            answered = True
            for p in procs:
                pid = int(p.pid)
                kinds[pid] = kinds.get(pid, 0) | bit
                if used.get(pid) is None:  # a C+G process is listed twice, same figure
                    used[pid] = p.usedGpuMemory
        if not answered:
            return NA
        return [NvmlProcess(pid, used[pid], _PROC_TYPE[bits]) for pid, bits in kinds.items()]

    def _process_list(self, kind: str) -> list[Any] | NotAvailable:
        calls = self._proc_calls[kind]
        while calls:
            try:
                return list(getattr(self._b, calls[0])(self.handle))
            except self._err as exc:
                if self.nvml.classify(exc) != "never":
                    return self._fail(exc, "procs_" + kind, calls[0])
                calls.pop(0)  # this version is missing here: the next one from now on
        return NA

    # ------------------------------------------------------------------ MIG

    def mig_enabled(self) -> bool:
        """Whether MIG mode is on now (False where the GPU, driver or binding has no MIG)."""
        if not hasattr(self._b, "nvmlDeviceGetMigMode"):
            return False
        mode = self._read("mig_mode", "nvmlDeviceGetMigMode")
        if mode is NA:
            return False
        return int(mode[0]) == getattr(self._b, "NVML_DEVICE_MIG_ENABLE", 1)

    def mig_devices(self) -> list[NvmlDevice]:
        """The MIG instances of this GPU, each with its own memory; empty without MIG.

        NVML numbers MIG slots up to ``nvmlDeviceGetMaxMigDeviceCount``; a slot with no
        instance answers NOT_FOUND and is skipped. An instance keeps its parent's index.

        Raises:
            GpuLost, NvmlUnavailable, NvmlCallFailed: As the other reads.
        """
        if not self.mig_enabled():
            return []
        count = self._read("mig_count", "nvmlDeviceGetMaxMigDeviceCount")
        if count is NA:
            return []
        out: list[NvmlDevice] = []
        for slot in range(int(count)):
            try:
                handle = self._b.nvmlDeviceGetMigDeviceHandleByIndex(self.handle, slot)
            except self._err as exc:
                kind = self.nvml.classify(exc)
                if kind == "not now":  # an empty slot
                    continue
                if kind == "never":
                    break
                raise self.nvml._error(exc, "nvmlDeviceGetMigDeviceHandleByIndex")
            out.append(NvmlDevice(self.nvml, self.index, handle, mig_slot=slot))
        return out

    # ------------------------------------------------------------------ per-process utilisation

    def process_utilization(self, since: int) -> dict[int, tuple[int, int, int]] | NotAvailable:
        """Per-process SM and memory utilisation from the samples NVML took after ``since``
        (CPU µs since the epoch; 0: every sample it still holds).

        Returns:
            pid -> (newest sample's time in µs, SM %, memory %); an empty dict when NVML
            has no sample newer than ``since`` (no process used the GPU since); n/a where
            the GPU or driver does not offer it (never asked again).
        """
        if "proc_util" in self._never or not hasattr(self._b, "nvmlDeviceGetProcessUtilization"):
            return NA
        try:
            samples = self._b.nvmlDeviceGetProcessUtilization(self.handle, since)
        except self._err as exc:
            if self.nvml.classify(exc) == "not now":  # NOT_FOUND: no sample since
                return {}
            return self._fail(exc, "proc_util", "nvmlDeviceGetProcessUtilization")
        out: dict[int, tuple[int, int, int]] = {}
        for s in samples:
            pid, ts = int(s.pid), int(s.timeStamp)
            if pid not in out or ts >= out[pid][0]:
                out[pid] = (ts, int(s.smUtil), int(s.memUtil))
        return out


_PROC_TYPE = {1: 0, 2: 1, 3: 2}
