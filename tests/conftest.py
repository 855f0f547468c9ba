"""Shared fixtures: short private socket paths, subprocess environments, GPU and torch
detection, and the user's own directories kept out of reach of every test."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUPPORT = ROOT / "tests" / "support"
# The fakes and helpers the tests import by name (``import synthetic``), wherever they sit.
sys.path.insert(0, str(SUPPORT))

if sys.dont_write_bytecode:
    # PYTHONDONTWRITEBYTECODE also keeps pytest from caching the test modules it rewrites
    # for assert: every run, each worker, rewrote ~280 modules again, nearly half of the
    # collection's time. Cached outside the tree (.pytest_cache is ignored), nothing is
    # written beside the sources.
    sys.pycache_prefix = str(ROOT / ".pytest_cache" / "pycache")
    sys.dont_write_bytecode = False
SAMPLE = ROOT / "samples" / "train_tiny_gpt.py"

# ------------------------------------------------------------------ the user's directories

USER_DIRS = (
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
    "XDG_CONFIG_HOME",
    "XDG_RUNTIME_DIR",
    "XDG_CACHE_HOME",
)
"""Where gpuwatch keeps recordings, run logs and settings, its default socket, and the
native allocator reader it builds (a GPU machine's suite builds into the suite's own)."""

USER_ROOT = Path(tempfile.mkdtemp(prefix="gw-home-", dir="/tmp"))
"""Stands in for the user's directories for the whole session, in this process and in every
process a test starts (they inherit the environment): a default recording, a ``gpuwatch
run`` log or a default socket never lands in, or talks to, the real ones. The user's own
``GPUWATCH_*`` settings (a socket, ``GPUWATCH_DISABLE``) are not the suite's either."""


def _isolate_user_dirs() -> None:
    for name in [n for n in os.environ if n.startswith("GPUWATCH_")]:
        del os.environ[name]
    for name in USER_DIRS:
        path = USER_ROOT / name.removeprefix("XDG_").lower()
        path.mkdir(mode=0o700)
        os.environ[name] = str(path)


# At import, before any test module imports gpuwatch (whose client finds its socket then).
_isolate_user_dirs()


def _restore_sigint() -> None:
    """Give Ctrl-C back to the suite and its children where a shell took it away.

    A shell without job control starts a background job (``bash .ci/run &``, a CI runner's
    step) with SIGINT ignored, and an ignored signal stays ignored across fork and exec:
    every child would ignore it too, and a Python child would not even install its
    KeyboardInterrupt handler. The tests that stop a job with SIGINT, as Ctrl-C would,
    then saw it die of SIGTERM after the grace period, or still alive. A handler set
    here is reset to the default in each child on exec.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


_restore_sigint()


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(USER_ROOT, ignore_errors=True)


# ------------------------------------------------------------------ what this machine has


def _have_gpu() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return count > 0
    except Exception:
        return False


HAVE_GPU = _have_gpu()
HAVE_TORCH = importlib.util.find_spec("torch") is not None


# ------------------------------------------------------------------ the tiers

TIERS: dict[str, tuple[str, ...]] = {
    "e2e": ("tests/e2e/",),
    "accuracy": (
        "tests/predict/test_from_oom_vs_run.py",
        "tests/predict/test_hf_families.py",
        "tests/predict/test_measured_wins.py",
        "tests/predict/test_meta_params.py",
        "tests/predict/test_plan_vs_run.py",
        "tests/predict/test_ranks.py",
    ),
    "slow": (
        "tests/notebook/",  # real kernels
        "tests/serve/",  # real servers, forked dashboards, their visitors
        "tests/test_types.py",  # mypy over the package
        # Real training in child processes, torchrun, framework Trainers, the profiler.
        "tests/analysis/test_explain.py",
        "tests/analysis/test_forecast.py",
        "tests/cli/test_launch.py",
        "tests/instrument/test_activations.py",  # 43 in-process trainings: 1/3 of the rest
        "tests/instrument/test_integrations.py",
        "tests/instrument/test_no_held_tensors.py",
        "tests/predict/test_profmem.py",
        "tests/store/test_store_e2e.py",
        "tests/tui/test_process_tree_workers.py",
        # `gpuwatch estimate` (torch) or another gpuwatch child per case, or children
        # that run for seconds.
        "tests/cli/test_estimate_cli.py",
        "tests/cli/test_estimate_fit_cli.py",
        "tests/cli/test_estimate_trace.py",
        "tests/cli/test_export_cli.py",
        "tests/sources/test_gpu_process.py",
        "tests/store/test_disk_full.py",
        "tests/store/test_hostile_files.py",
        "tests/store/test_odd_recordings.py",  # 31 cases, each through the CLI and the app
        "tests/store/test_rename_recording.py",
        "tests/store/test_samples_open.py",
        # Seconds a test in real time: real processes signalled or sampled, NVML children,
        # a C++ build, the cluster app's refresh cadence, tracemalloc over long sessions.
        "tests/analysis/test_hostile_facts.py",
        "tests/cli/test_nvml_cli.py",
        "tests/cli/test_once.py",
        "tests/cluster/test_cluster_client.py",  # a real HTTP server (and TLS) per case
        "tests/cluster/test_cluster_tui.py",
        "tests/instrument/test_native.py",
        "tests/session/test_process_churn.py",
        "tests/sources/test_gpu_sampler.py",  # samplers run for a second or more per case
        "tests/store/test_sweep_reading.py",
        "tests/tui/test_damaged_replay.py",
        "tests/tui/test_process_history.py",
        "tests/tui/test_processes_fit.py",
        "tests/tui/test_processes_tui.py",
        "tests/tui/test_thresholds.py",
        # The sample recordings replayed at two or three sizes each.
        "tests/tui/test_one_story.py",
        "tests/tui/test_readable_replay.py",
        "tests/tui/test_replay_tui.py",
        # Seconds of real time each: a trickled backlog, a recording being written, CLI
        # children, a paused view's redraws over a second.
        "tests/sources/test_receiver.py::test_a_trickled_backlog_costs_the_relay_about_its_size",
        "tests/cli/test_cli_inputs.py::test_force_does_not_overwrite_a_recording_being_written",
        "tests/cli/test_cli_inputs.py::test_info_and_export_open_a_file_named_in_latin1",
        "tests/cli/test_cli_inputs.py::test_run_and_record_of_a_missing_command_exit_2",
        "tests/tui/test_tui.py::test_a_paused_view_shows_new_data_at_once_then_at_most_twice",
    ),
}
"""Node-id prefixes (a directory, a file or a test) and the tier marker their tests get:
a new file in tests/e2e/ or tests/notebook/ is in its tier with no marker of its own. A
file named ``*accuracy*`` or ``*_vs_run*`` is an accuracy test, and a test driven in
tmux (marker ``tmux``) a slow one, wherever they are. The fast tier is the rest:
``-m "not e2e and not accuracy and not slow"``."""


def tiers_of(item: pytest.Item) -> set[str]:
    """The tier markers ``item`` gets from :data:`TIERS` and the rules beside it."""
    node = item.nodeid
    found = {tier for tier, prefixes in TIERS.items() if node.startswith(prefixes)}
    name = node.partition("::")[0].rpartition("/")[2]
    if "accuracy" in name or "_vs_run" in name:
        found.add("accuracy")
    if item.get_closest_marker("tmux") is not None:
        found.add("slow")
    return found


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU (none found here)")
    skip_tmux = pytest.mark.skip(reason="needs tmux on PATH")
    skip_torch = pytest.mark.skip(reason="needs torch (not installed here)")
    for item in items:
        for tier in tiers_of(item):
            item.add_marker(tier)
        if "gpu" in item.keywords and not HAVE_GPU:
            item.add_marker(skip_gpu)
        if "tmux" in item.keywords and shutil.which("tmux") is None:
            item.add_marker(skip_tmux)
        if item.get_closest_marker("torch") is not None and not HAVE_TORCH:
            item.add_marker(skip_torch)


@pytest.fixture(autouse=True, scope="module")
def _rank_pools_end_with_their_module() -> Iterator[None]:
    """The rank processes ``ranks_cases.run_case`` keeps (each holds torch) end with the
    module that used them."""
    yield
    cases = sys.modules.get("ranks_cases")
    if cases is not None:
        cases.close_pools()


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A private (0700) directory with a short path (AF_UNIX paths are limited to 107 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="gw-", dir="/tmp"))
    os.chmod(d, 0o700)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def sock_path(sock_dir: Path) -> str:
    return str(sock_dir / "gw.sock")


@pytest.fixture
def sent(monkeypatch, sock_path: str) -> Iterator[list[dict[str, Any]]]:
    """Facts as ``watch()`` sends them, collected instead of sent (the client's own send is
    covered by test_auto); the phases go to a socket nobody reads, and none is left
    queued, hooked or counted for the next test."""
    import gpuwatch
    from gpuwatch.instrument import _api, _auto, _watch

    out: list[dict[str, Any]] = []
    monkeypatch.setattr(_api, "set_facts", out.append)
    monkeypatch.delenv("GPUWATCH_ACTIVATIONS", raising=False)
    gpuwatch.configure(socket=sock_path, enabled=True)
    yield out
    _auto.uninstall()
    _watch._primary = None
    _watch._reset_activations()
    gpuwatch.flush()
    _api._state.client.queue.clear()
    _api._state.stack().clear()
    _api._state.set_step(0)


@pytest.fixture
def sub_env(sock_path: str) -> dict[str, str]:
    """Environment for child processes: this checkout first on the path, our socket."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["GPUWATCH_SOCKET"] = sock_path
    env.pop("GPUWATCH_DISABLE", None)
    return env


FAKE_NVML = "tests.fake_nvml"
"""``$GPUWATCH_NVML_BACKEND`` that serves NVML from tests/fake_nvml.py in a child process."""


def record_cmd(out: str, sock: str) -> list[str]:
    """``gpuwatch record --out OUT --socket SOCK`` as this interpreter runs it (add a
    command after ``--``, or more options)."""
    return [sys.executable, "-m", "gpuwatch", "record", "--out", out, "--socket", sock]


def fake_nvml_env(env: dict[str, str], spec: dict[str, Any]) -> dict[str, str]:
    """``env`` for a gpuwatch child whose NVML is the fake built from ``spec`` (its JSON)."""
    return {**env, "GPUWATCH_NVML_BACKEND": FAKE_NVML, "GPUWATCH_FAKE_NVML": json.dumps(spec)}


def no_gpu_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for children that must take the CPU path on any machine, a GPU one included.

    torch sees no GPU (so a script picks the CPU and no optimizer step creates a CUDA
    context), and gpuwatch's NVML is the fake with no GPU.
    """
    return {**fake_nvml_env(env, {"gpus": 0}), "CUDA_VISIBLE_DEVICES": ""}


def wait_for(cond: Callable[[], bool], timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll ``cond`` until true or ``timeout`` seconds pass; returns the last result."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval)
    return cond()


async def until(pilot: Any, cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``cond`` while the app under ``pilot`` runs (:func:`wait_for` blocks its event
    loop: what a key started, a confirmation's callback say, cannot finish meanwhile);
    returns the last result."""
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        await pilot.pause(0.05)
    return cond()


def screen_text(app: Any) -> str:
    """What the terminal of a Textual ``app`` shows: every cell of its screen as text, as
    a snapshot would have it."""
    return "\n".join(
        "".join(seg.text for seg in line) for line in app.screen._compositor.render_strips()
    )


def in_threads(work: Callable[[], object], count: int) -> list[BaseException]:
    """Run ``work`` in ``count`` threads started together; what any of them raised."""
    start = threading.Barrier(count)
    errors: list[BaseException] = []

    def run() -> None:
        start.wait()
        try:
            work()
        except BaseException as exc:  # collected for the caller
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def run_gpuwatch(
    *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run this checkout's ``gpuwatch`` command to completion, output captured.

    Args:
        args: The command line after ``gpuwatch``.
        env: The whole environment (default: ours, with this checkout on the path).
        cwd: Where to run it.
        timeout: Seconds before the run counts as hung.
    """
    return subprocess.run(
        [sys.executable, "-m", "gpuwatch", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)} if env is None else env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``gpuwatch`` in this process: the same ``main()`` the command runs, its stdout
    and stderr captured, its exit status as a child's (1 and the traceback for an
    exception that escapes it, as Python's own exit would give).

    For commands whose work is a file's or a computation's (``info``, ``export``,
    ``estimate``): a child spends a second or more importing what this process has
    already. Not for what only a child shows: a terminal, signals, its own environment,
    or output that bypasses ``sys.stdout``/``sys.stderr`` (C code, warnings pytest keeps).
    """
    import contextlib
    import io
    import traceback

    from gpuwatch.cli import main

    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's refusals and --help
                code = exc.code if isinstance(exc.code, int) else 1
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(
        ["gpuwatch", *args], code, out.getvalue(), err.getvalue()
    )


def run_sample(
    env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess:
    """Run the tiny-GPT sample to completion."""
    return subprocess.run(
        [sys.executable, str(SAMPLE), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_sample(env: dict[str, str], *args: str) -> subprocess.Popen:
    """Start the tiny-GPT sample in the background."""
    return subprocess.Popen(
        [sys.executable, str(SAMPLE), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class FakeClock:
    """A wall clock that moves only when told to (replay tests)."""

    def __init__(self, start_s: float = 5.0) -> None:
        self.now = int(start_s * 10**9)

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * 10**9)
