"""The NVML wrapper over the scripted fake: values, n/a, versioned fallbacks, errors."""

from __future__ import annotations

import ast

import pynvml
import pytest
from conftest import HAVE_GPU, ROOT

from gpuwatch.sources import nvml as nv
from gpuwatch.sources.nvml import (
    BACKEND_ENV,
    NA,
    GpuLost,
    MemoryInfo,
    Nvml,
    NvmlCallFailed,
    NvmlNoPermission,
    NvmlProcess,
    NvmlUnavailable,
    load_backend,
)
from tests import fake_nvml
from tests.fake_nvml import FakeNvml, GiB, MiB, default_gpu


def opened(fake: FakeNvml) -> Nvml:
    n = Nvml(fake)
    n.init()
    return n


def test_reads_every_field() -> None:
    gpu = default_gpu(0, used=3 * GiB, reserved=400 * MiB, util=(87, 41), temp=71, power_mw=312_500)
    fake = FakeNvml([gpu, default_gpu(1)])
    n = opened(fake)
    assert n.device_count() == 2
    assert n.driver_version() == "550.54.15"
    d = n.device(0)
    assert d.name() == gpu.name
    assert d.uuid() == gpu.uuid
    assert d.bus_id() == "00000000:10:00.0"
    assert d.memory() == MemoryInfo(
        total=gpu.total, free=gpu.total - 400 * MiB - 3 * GiB, used=3 * GiB, reserved=400 * MiB
    )
    assert d.utilization() == (87, 41)
    assert d.temperature() == 71
    assert d.power() == pytest.approx(312.5)
    assert d.power_limit() == pytest.approx(400.0)
    assert (d.clock("sm"), d.clock("mem")) == (1410, 1593)
    assert n.device(1).uuid() != gpu.uuid


def test_na_is_one_falsy_value() -> None:
    assert not NA
    assert repr(NA) == "n/a" == str(NA)
    assert nv.NotAvailable("n/a") is NA


def test_memory_falls_back_to_v1_when_the_driver_lacks_v2() -> None:
    fake = FakeNvml(
        [default_gpu(0, used=GiB, reserved=100 * MiB)],
        missing_symbols=["nvmlDeviceGetMemoryInfo_v2"],
    )
    d = opened(fake).device(0)
    for _ in range(3):
        m = d.memory()
        # v1 has no reserved figure and counts it in "used", as NVML documents.
        assert m == MemoryInfo(80 * GiB, 80 * GiB - GiB - 100 * MiB, GiB + 100 * MiB, None)
    assert fake.calls["nvmlDeviceGetMemoryInfo_v2"] == 1  # tried once, then v1 only
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == 3


def test_memory_v1_when_the_binding_has_no_v2() -> None:
    fake = FakeNvml(1, missing_functions=["nvmlMemory_v2"])
    assert not hasattr(fake, "nvmlMemory_v2")
    m = opened(fake).device(0).memory()
    assert m.reserved is None
    assert fake.calls["nvmlDeviceGetMemoryInfo_v2"] == 0


def test_temperature_falls_back_to_the_legacy_call() -> None:
    fake = FakeNvml([default_gpu(0, temp=66)], missing_symbols=["nvmlDeviceGetTemperatureV"])
    d = opened(fake).device(0)
    assert [d.temperature() for _ in range(3)] == [66, 66, 66]
    assert fake.calls["nvmlDeviceGetTemperatureV"] == 1
    assert fake.calls["nvmlDeviceGetTemperature"] == 3


@pytest.mark.parametrize(
    ("missing_symbols", "missing_functions", "used_call"),
    [
        ((), (), "nvmlDeviceGetComputeRunningProcesses_v3"),
        (
            ("nvmlDeviceGetComputeRunningProcesses_v3",),
            (),
            "nvmlDeviceGetComputeRunningProcesses_v2",
        ),
        (
            (
                "nvmlDeviceGetComputeRunningProcesses_v3",
                "nvmlDeviceGetComputeRunningProcesses_v2",
            ),
            (),
            "nvmlDeviceGetComputeRunningProcesses",
        ),
        (
            (),
            ("nvmlDeviceGetComputeRunningProcesses_v3",),
            "nvmlDeviceGetComputeRunningProcesses_v2",
        ),
    ],
)
def test_process_lists_use_the_newest_version_there_is(
    missing_symbols: tuple[str, ...], missing_functions: tuple[str, ...], used_call: str
) -> None:
    gpu = default_gpu(0, compute=[(101, GiB)])
    fake = FakeNvml([gpu], missing_symbols=missing_symbols, missing_functions=missing_functions)
    d = opened(fake).device(0)
    for _ in range(3):
        assert d.processes() == [NvmlProcess(101, GiB, 0)]
    assert fake.calls[used_call] == 3


def test_compute_and_graphics_processes_merge_by_pid() -> None:
    gpu = default_gpu(
        0,
        compute=[(10, 2 * GiB), (11, None)],  # None: NVML cannot say (WDDM, MIG)
        graphics=[(10, 2 * GiB), (12, 64 * MiB)],
    )
    procs = opened(FakeNvml([gpu])).device(0).processes()
    assert sorted(procs) == [
        NvmlProcess(10, 2 * GiB, 2),  # compute + graphics
        NvmlProcess(11, None, 0),
        NvmlProcess(12, 64 * MiB, 1),
    ]


def test_unsupported_field_is_na_and_never_asked_again() -> None:
    fake = FakeNvml(1)
    fake.fail("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_NOT_SUPPORTED)
    d = opened(fake).device(0)
    assert [d.power() for _ in range(5)] == [NA] * 5
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1
    assert not d.supports("power")
    assert d.temperature() == 35  # other fields unaffected


def test_no_data_yet_is_na_and_asked_again() -> None:
    fake = FakeNvml([default_gpu(0, util=(5, 6))])
    fake.fail("nvmlDeviceGetUtilizationRates", pynvml.NVML_ERROR_NO_DATA, times=1)
    d = opened(fake).device(0)
    assert d.utilization() is NA
    assert d.utilization() == (5, 6)
    assert d.supports("util")


@pytest.mark.parametrize(
    ("code", "exc_type"),
    [
        (pynvml.NVML_ERROR_GPU_IS_LOST, GpuLost),
        (pynvml.NVML_ERROR_RESET_REQUIRED, GpuLost),
        (pynvml.NVML_ERROR_NO_PERMISSION, NvmlNoPermission),
        (pynvml.NVML_ERROR_TIMEOUT, NvmlCallFailed),
        (pynvml.NVML_ERROR_UNKNOWN, NvmlCallFailed),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, NvmlUnavailable),
        (pynvml.NVML_ERROR_UNINITIALIZED, NvmlUnavailable),
    ],
)
def test_errors_become_the_samplers_exceptions(code: int, exc_type: type) -> None:
    fake = FakeNvml(1)
    d = opened(fake).device(0)
    for call, read in [
        ("nvmlDeviceGetMemoryInfo_v2", d.memory),
        ("nvmlDeviceGetClockInfo", lambda: d.clock("sm")),
        ("nvmlDeviceGetComputeRunningProcesses_v3", d.processes),
    ]:
        fake.fail(call, code, times=1)
        with pytest.raises(exc_type) as info:
            read()
        assert info.value.code == code
        assert info.value.call == call
        assert isinstance(info.value, nv.NvmlError)


def test_a_lost_gpu_fails_from_its_handle_on() -> None:
    fake = FakeNvml(2)
    n = opened(fake)
    d = n.device(1)
    fake.lose(1)
    with pytest.raises(GpuLost):
        d.memory()
    with pytest.raises(GpuLost):
        n.device(1)
    assert n.device(0).memory() is not NA


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED]
)
def test_init_without_library_or_driver(code: int) -> None:
    n = Nvml(FakeNvml(1, init_error=code))
    with pytest.raises(NvmlUnavailable):
        n.init()
    n.shutdown()  # harmless after a failed init


def test_a_backend_that_cannot_be_imported_is_unavailable(monkeypatch) -> None:
    with pytest.raises(NvmlUnavailable, match="no_such_nvml_binding"):
        load_backend("no_such_nvml_binding")
    monkeypatch.setenv(BACKEND_ENV, "no_such_nvml_binding")
    with pytest.raises(NvmlUnavailable):
        Nvml().init()


def test_the_environment_selects_the_backend(monkeypatch) -> None:
    monkeypatch.setenv(BACKEND_ENV, "tests.fake_nvml")
    monkeypatch.setenv("GPUWATCH_FAKE_NVML", '{"gpus": 3, "trace": "flat"}')
    monkeypatch.setattr(fake_nvml, "_default", None)  # built afresh from the spec
    n = Nvml()
    n.init()
    assert n.backend is fake_nvml
    assert n.device_count() == 3
    assert n.device(2).uuid() == default_gpu(2).uuid
    assert n.device(0).memory().used == 20 * GiB
    n.shutdown()


@pytest.mark.skipif(HAVE_GPU, reason="this machine has an NVIDIA driver")
def test_real_pynvml_without_a_driver_is_unavailable() -> None:
    n = Nvml()
    with pytest.raises(NvmlUnavailable):
        n.init()


def test_only_the_wrapper_imports_pynvml() -> None:
    importers = []
    for path in (ROOT / "gpuwatch").rglob("*.py"):
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n.split(".")[0] == "pynvml" for n in names):
                importers.append(path.relative_to(ROOT).as_posix())
        if '"pynvml"' in text:  # imported by name (importlib)
            importers.append(path.relative_to(ROOT).as_posix())
    assert sorted(set(importers)) == ["gpuwatch/sources/nvml.py"]
