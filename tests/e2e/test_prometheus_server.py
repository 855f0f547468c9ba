"""A real Prometheus scrapes ``gpuwatch record --prometheus`` while it records a real run.

Prometheus (Debian's ``prometheus`` package, as ``.ci/run`` installs it) runs on loopback
with a private config and storage directory and a 1 s scrape interval. gpuwatch records
``samples/train_tiny_gpt.py`` on the CPU with two fake NVML GPUs; the series are then read
back through Prometheus's HTTP query API. A CPU run reports no allocator figures (torch
allocated / reserved are checked by tests/e2e/test_prometheus.py over a GPU-shaped session);
here the GPU, phase, prediction and RSS series must arrive.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLE, record_cmd, wait_for
from test_grafana_dashboard import dashboard_queries

from gpuwatch.store import open_recording, open_session

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="needs the prometheus server on PATH (Debian: apt-get install prometheus)",
)
PHASES = {"data", "forward", "backward", "optimizer.step", "zero_grad"}
ALERTS = ROOT / "samples" / "prometheus-alerts.yml"
SCRIPTS = ROOT / "tests" / "scripts"
# Besides $host and $gpu.
VARIABLES = {"$slurm_job": ".*", "$job_id": ".*", "$__rate_interval": "1m"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except OSError as exc:
        return getattr(exc, "code", 0), str(exc)


class Lines:
    """A child's stderr, read line by line on a thread (so it never fills its pipe)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def find(self, pattern: str) -> re.Match[str] | None:
        return next((m for line in list(self.lines) if (m := re.search(pattern, line))), None)


def start_recording(
    tmp_path: Path, sock_path: str, command: list[str], **extra_env: str
) -> tuple[subprocess.Popen, Lines, Path]:
    """``gpuwatch record --prometheus 127.0.0.1:0 -- COMMAND`` with two fake NVML GPUs."""
    out = tmp_path / "run.gpuwatch"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra_env}
    env["GPUWATCH_NVML_BACKEND"] = "tests.fake_nvml"
    env["GPUWATCH_FAKE_NVML"] = json.dumps({"gpus": 2, "trace": "training"})
    env["CUDA_VISIBLE_DEVICES"] = ""  # the script on the CPU, on a GPU machine too
    env.pop("GPUWATCH_SOCKET", None)
    proc = subprocess.Popen(
        [
            *record_cmd(str(out), sock_path),
            "--prometheus", "127.0.0.1:0", "--log", str(tmp_path / "train.log"), "--",
            *command,
        ],
        env=env,
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    return proc, Lines(proc), out


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def recording(tmp_path: Path, sock_path: str) -> Iterator[tuple[subprocess.Popen, Lines, Path]]:
    """``gpuwatch record --prometheus 127.0.0.1:0 -- python samples/train_tiny_gpt.py``."""
    # Runs until stopped: the test ends it once Prometheus has what it needs.
    command = [sys.executable, str(SAMPLE), "--steps", "1000000", "--eval-every", "0"]
    proc, lines, out = start_recording(tmp_path, sock_path, command)
    try:
        yield proc, lines, out
    finally:
        stop(proc)


def start_prometheus(folder: Path, config: Path, procs: list[subprocess.Popen]) -> str:
    """A real Prometheus on ``config`` (its data and log in ``folder``), added to
    ``procs``; its base URL once it says it is ready."""
    port = free_port()
    log = open(folder / "prometheus.log", "w")  # noqa: SIM115 (closed with the process)
    procs.append(
        subprocess.Popen(
            [
                str(PROMETHEUS),
                f"--config.file={config}",
                f"--storage.tsdb.path={folder / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=folder,
        )
    )
    base = f"http://127.0.0.1:{port}"
    ready = wait_for(lambda: http_get(base + "/-/ready")[0] == 200, timeout=60)
    assert ready, (folder / "prometheus.log").read_text()[-3000:]
    return base


def stop_all(procs: list[subprocess.Popen]) -> None:
    """Terminate each process, killing one that takes more than 30 s."""
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator:
    """Starts Prometheus scraping one target every second; returns its base URL."""
    procs: list[subprocess.Popen] = []

    def start(target: str) -> str:
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  scrape_timeout: 1s\n"
            "  evaluation_interval: 1s\n"
            f"rule_files: ['{ALERTS}']\n"
            "scrape_configs:\n"
            "  - job_name: gpuwatch\n"
            "    static_configs:\n"
            f"      - targets: ['{target}']\n"
        )
        return start_prometheus(tmp_path, config, procs)

    yield start
    stop_all(procs)


def ask(base: str, promql: str) -> tuple[int, dict]:
    """An instant query: HTTP status and Prometheus's JSON answer."""
    status, body = http_get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    try:
        return status, json.loads(body)
    except ValueError:
        return status, {"error": body}


def query(base: str, promql: str) -> list[dict]:
    """An instant query's result vector (empty while Prometheus has nothing)."""
    status, answer = ask(base, promql)
    return answer["data"]["result"] if status == 200 else []


@pytest.mark.torch
def test_prometheus_scrapes_a_recorded_run(recording, prometheus_factory) -> None:
    proc, stderr, out = recording
    assert wait_for(lambda: stderr.find(r"metrics on (http://\S+)") or proc.poll(), 60)
    url = stderr.find(r"metrics on http://(127\.0\.0\.1:(\d+))/metrics")
    assert url is not None and int(url.group(2)) > 0, stderr.lines
    base = prometheus_factory(url.group(1))

    def targets() -> str:
        return http_get(base + "/api/v1/targets")[1]

    # NVML used memory of both fake GPUs, with their identity as labels.
    used = lambda: query(base, 'gpuwatch_gpu_memory_used_bytes{job="gpuwatch"}')  # noqa: E731
    assert wait_for(lambda: len(used()) == 2, timeout=60), targets()
    gpus = {r["metric"]["gpu"]: r["metric"] for r in used()}
    assert set(gpus) == {"0", "1"}
    assert gpus["0"]["uuid"].startswith("GPU-") and gpus["0"]["host"] == socket.gethostname()
    for r in used():
        assert 0 < float(r["value"][1]) <= 80 * 2**30

    # The training process: its phases (counted, and the one it is in at a scrape),
    # the predicted peak from the facts watch() sent, and its RSS.
    ended = 'gpuwatch_process_phases_total{phase="forward"}'
    assert wait_for(lambda: query(base, f"{ended} > 2"), timeout=60), targets()
    (forward,) = query(base, ended)
    pid = forward["metric"]["pid"]
    current = "max by (pid, phase) (max_over_time(gpuwatch_process_phase_info[10m]))"
    assert wait_for(lambda: query(base, current), timeout=60), targets()
    seen = {r["metric"]["phase"] for r in query(base, current)}
    assert seen <= PHASES and seen, seen
    assert {r["metric"]["pid"] for r in query(base, current)} == {pid}
    (peak,) = query(base, "gpuwatch_process_predicted_peak_bytes")
    assert peak["metric"]["pid"] == pid and float(peak["value"][1]) > 0
    (rss,) = query(base, "gpuwatch_process_rss_bytes")
    assert rss["metric"]["pid"] == pid and float(rss["value"][1]) > 0
    assert query(base, 'up{job="gpuwatch"} == 1')

    # Every query of the Grafana dashboard is valid PromQL, and its NVML line has data.
    variables = {"$host": socket.gethostname(), "$gpu": "0", **VARIABLES}
    for q in dashboard_queries():
        if q.startswith("label_values("):
            continue  # Grafana's, not PromQL
        for var, v in variables.items():
            q = q.replace(var, v)
        status, answer = ask(base, q)
        assert status == 200 and answer.get("status") == "success", (q, answer)
    (nvml,) = [q for q in dashboard_queries() if q.startswith("gpuwatch_gpu_memory_used_bytes")]
    nvml = nvml.replace("$host", socket.gethostname()).replace("$gpu", "0")
    assert len(query(base, nvml)) == 1

    # Stop the run (SIGTERM reaches the script through gpuwatch); the recording names
    # the same process Prometheus saw.
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    rec = open_recording(out)
    try:
        session, loader = open_session(rec)
        loader.load_all()
        assert int(pid) in session.processes
    finally:
        rec.close()


@pytest.mark.torch
def test_prometheus_sees_each_ranks_layout_and_job(
    tmp_path: Path, sock_path: str, prometheus_factory
) -> None:
    # Two DDP ranks under torchrun, as Slurm would start them; gpuwatch's automatic
    # instrumentation sends their layout, the scheduler's variables their job.
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(SCRIPTS / "ddp_train.py"), "1000000", "0.05",
    ]  # fmt: skip
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "n[1-2]"}
    proc, stderr, _ = start_recording(tmp_path, sock_path, command, **slurm)
    try:
        assert wait_for(lambda: stderr.find(r"metrics on (http://\S+)") or proc.poll(), 60)
        url = stderr.find(r"metrics on http://(127\.0\.0\.1:(\d+))/metrics")
        assert url is not None, stderr.lines
        base = prometheus_factory(url.group(1))
        info = 'gpuwatch_rank_info{strategy="ddp"}'
        assert wait_for(lambda: len(query(base, info)) == 2, timeout=120), (
            query(base, "gpuwatch_rank_info"),
            (tmp_path / "train.log").read_text()[-2000:],
        )
        ranks = {r["metric"]["rank"]: r["metric"] for r in query(base, info)}
        assert set(ranks) == {"0", "1"}
        for rank, labels in ranks.items():
            assert labels["world_size"] == "2" and labels["local_rank"] == rank
            assert (labels["slurm_job"], labels["slurm_step"]) == ("4242", "0")
            assert labels["slurm_nodelist"] == "n[1-2]"
            assert labels["torch_run"] and labels["host"] == socket.gethostname()
        # The job labels reach the per-process series, and the prediction has DDP's buckets.
        phases = 'gpuwatch_process_phases_total{slurm_job="4242", phase="forward"}'
        assert wait_for(lambda: len(query(base, phases)) == 2, timeout=60)
        buckets = 'gpuwatch_process_predicted_peak_category_bytes{category="ddp_buckets"} > 0'
        assert wait_for(lambda: len(query(base, buckets)) == 2, timeout=60)
        # The dashboard's cluster panels: a GPU grid cell for each fake GPU.
        d = {q for q in dashboard_queries() if "gpu_memory_used_bytes / " in q}
        (grid,) = d
        assert wait_for(lambda: len(query(base, grid)) == 2, timeout=60)
        # The alert rules load and evaluate on the real series.
        status, answer = ask(base, "ALERTS")
        assert status == 200 and answer["status"] == "success"

        def rules() -> list[dict]:
            groups = json.loads(http_get(base + "/api/v1/rules")[1])["data"]["groups"]
            return [r for g in groups for r in g["rules"]]

        assert wait_for(lambda: {r["health"] for r in rules()} == {"ok"}, timeout=30), rules()
        # Every rule of the file is loaded (the forecast rule of issue 54 among them).
        alerts = ALERTS.read_text().count("- alert:")
        assert alerts >= 6 and len(rules()) == alerts
    finally:
        stop(proc)
