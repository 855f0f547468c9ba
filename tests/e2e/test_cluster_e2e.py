"""The whole path, real parts: three ``gpuwatch record --prometheus 127.0.0.1:0`` on the fake
NVML (two recording the instrumented ranks of two jobs), a real Prometheus scraping them
every second, and ``gpuwatch cluster`` in tmux: every GPU, one ranks table per job, a
host's panels, and the stale state once one exporter is killed.

The jobs: a Slurm job step (``SLURM_JOB_ID``/``SLURM_STEP_ID``) of three ranks on node-a
and node-b whose rank 2 peaks 60% above the others, and a plain torchrun (run id ``none``,
a loopback rendezvous) of two balanced ranks on node-b, peaking above all of the first.
Folded into one table, the second job's ranks were flagged and the first's outlier not.

The three exporters run on this one machine; Prometheus gives each its own ``host`` (a
target label, as a relabelling would), so they stand for three hosts.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, wait_for
from test_prometheus_server import Lines, free_port, start_prometheus, stop_all
from tmuxhelp import Tmux

from gpuwatch.cluster import ROW_FAMILIES, PromClient, PromError, fetch
from gpuwatch.cluster.history import Timelines
from gpuwatch.protocol import label_text

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="needs the prometheus server on PATH (Debian: apt-get install prometheus)",
)
RANK = ROOT / "tests" / "scripts" / "cluster_rank.py"
HOSTS = {"node-a": 2, "node-b": 3, "node-c": 1}  # host -> fake GPUs
SLURM = "SLURM_JOB_ID=4242 SLURM_STEP_ID=0 WORLD_SIZE=3"
TORCHRUN = "TORCHELASTIC_RUN_ID=none MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 WORLD_SIZE=2"
SLURM_JOB = "slurm:4242.0"
EPOCH = time.time()
TORCHRUN_JOB = f"torchrun:{label_text(socket.gethostname())}:29517"


def _env(gpus: int) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env["GPUWATCH_NVML_BACKEND"] = "tests.fake_nvml"
    env["GPUWATCH_FAKE_NVML"] = json.dumps({"gpus": gpus, "trace": "training"})
    env["CLUSTER_EPOCH"] = str(EPOCH)  # the ranks' shared clock (tests/scripts/cluster_rank.py)
    env.pop("GPUWATCH_SOCKET", None)
    return env


@pytest.fixture
def exporters(tmp_path: Path, sock_dir: Path) -> Iterator[dict[str, subprocess.Popen]]:
    """node-a and node-b record the ranks of the two jobs; node-c only its GPU."""
    py = shlex.quote(sys.executable)
    jobs = {
        "node-a": (
            f"{SLURM} RANK=0 LOCAL_RANK=0 {py} {RANK} 1000 & "
            f"{SLURM} RANK=1 LOCAL_RANK=1 {py} {RANK} 1000 & wait"
        ),
        "node-b": (
            f"{SLURM} RANK=2 LOCAL_RANK=0 {py} {RANK} 1600 & "
            f"{TORCHRUN} RANK=0 LOCAL_RANK=1 {py} {RANK} 2600 & "
            f"{TORCHRUN} RANK=1 LOCAL_RANK=2 {py} {RANK} 2600 & wait"
        ),
    }
    procs: dict[str, subprocess.Popen] = {}
    lines: dict[str, Lines] = {}
    for host, gpus in HOSTS.items():
        command = [
            sys.executable, "-m", "gpuwatch", "record", "--out", str(tmp_path / f"{host}.gpuwatch"),
            "--socket", str(sock_dir / f"{host}.sock"), "--prometheus", "127.0.0.1:0",
            "--interval", "250",
        ]  # fmt: skip
        if host in jobs:
            command += ["--log", str(tmp_path / f"{host}.log"), "--", "sh", "-c", jobs[host]]
        procs[host] = subprocess.Popen(
            command, env=_env(gpus), cwd=ROOT, stderr=subprocess.PIPE, text=True
        )
        lines[host] = Lines(procs[host])
    try:
        for found in lines.values():
            assert wait_for(lambda f=found: f.find(r"metrics on http://(\S+)/metrics"), 60), (
                found.lines
            )
        procs_ports = {h: lines[h].find(r"metrics on http://(\S+)/metrics").group(1) for h in HOSTS}
        yield procs, procs_ports  # type: ignore[misc]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator:
    procs: list[subprocess.Popen] = []

    def start(targets: dict[str, str]) -> str:
        config = tmp_path / "prometheus.yml"
        static = "".join(
            f"      - targets: ['{addr}']\n        labels: {{host: {host}}}\n"
            for host, addr in targets.items()
        )
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: gpuwatch\n    static_configs:\n" + static
        )
        return start_prometheus(tmp_path, config, procs)

    yield start
    stop_all(procs)


@pytest.mark.tmux
def test_the_cluster_live_in_tmux(exporters, prometheus) -> None:
    procs, addresses = exporters
    base = prometheus(addresses)
    env = {"PYTHONPATH": str(ROOT), "GPUWATCH_PROMETHEUS_TOKEN": ""}
    tmux = Tmux(
        f"{shlex.quote(sys.executable)} -m gpuwatch cluster --prometheus {base} --job gpuwatch",
        env,
    )
    try:
        # Every GPU of the three hosts, and the five ranks of the two jobs.
        assert tmux.wait_for_text("6 GPUs · 3 hosts · 5 ranks", timeout=90), tmux.screen()
        screen = tmux.screen()
        for host in HOSTS:
            assert host in screen
        assert tmux.wait_for_text("backward", timeout=30), tmux.screen()
        # The worst rank is named with its host and job: the Slurm job's rank 2.
        assert tmux.wait_for_text(f"worst rank 2 on node-b ({SLURM_JOB})", timeout=30), (
            tmux.screen()
        )
        assert "every 1 s" in tmux.screen()  # Prometheus' scrape interval
        # The ranks: one table per job, the outlier flagged, the balanced job not.
        tmux.keys("2")
        assert tmux.wait_for_text(f"job {TORCHRUN_JOB}", timeout=20), tmux.screen()
        assert tmux.wait_for_text("above the median", timeout=20), tmux.screen()
        # The layout from the exporter's gpuwatch_rank_info (WORLD_SIZE of each job).
        # One screen with both tables whole: a scrape of node-b that timed out (1 s, on a
        # loaded machine) leaves its ranks out of one refresh.
        screens = [""]

        def whole() -> bool:
            screen = screens[0] = tmux.screen()
            return all(f"job {j}" in screen for j in (SLURM_JOB, TORCHRUN_JOB)) and all(
                f"world size {n}" in screen for n in (2, 3)
            )

        assert wait_for(whole, 30), screens[0]
        lines = screens[0].splitlines()
        a = next(i for i, line in enumerate(lines) if f"job {SLURM_JOB}" in line)
        b = next(i for i, line in enumerate(lines) if f"job {TORCHRUN_JOB}" in line)
        assert a < b, lines
        slurm, torchrun = lines[a:b], lines[b:]
        assert "ranks: 3" in slurm[1] and "world size 3" in slurm[1], slurm
        assert "ranks: 2" in torchrun[1] and "world size 2" in torchrun[1], torchrun
        above = [line for line in slurm if "above the median" in line]
        assert above and all(line.strip().startswith("! rank 2 ") for line in above), slurm
        assert [line for line in above if "rank 2 backward" in line], slurm
        assert [line for line in slurm if line.lstrip().startswith("!2 ")], slurm
        assert not [line for line in torchrun if "above the median" in line], torchrun
        assert not [line for line in torchrun if line.lstrip().startswith("!")], torchrun
        # A drill-down: node-a's panels (the first row is its host line).
        tmux.keys("1", "Home", "Enter")
        assert tmux.wait_for_text("node-a · last 5:00", timeout=20), tmux.screen()
        assert tmux.wait_for_text("GPU 1", timeout=20), tmux.screen()
        assert tmux.wait_for_text("rank 1", timeout=20), tmux.screen()
        assert "timelines kept" not in tmux.screen()  # no query of the panels failed
        # The panels' one range query (every line tagged with its role, joined by ``or``)
        # as the real Prometheus answers it: each line, each GPU, the band.
        history = Timelines("node-a", []).update(PromClient(base), seconds=60, step=1)
        assert history.error is None, history.error
        assert sorted(history.lines) == ["0", "1"]
        for gpu in ("0", "1"):
            assert {"nvml", "total", "reserved", "allocated"} <= history.lines[gpu].keys()
            assert [lane.label for lane in history.lanes[gpu]] == [f"rank {gpu}"]
        # What the grid's refresh asks under the panels, as the real Prometheus answers it:
        # node-a's figures only.
        under = fetch(PromClient(base), host="node-a")
        assert not under.errors, under.errors
        used = under.series["gpuwatch_gpu_memory_used_bytes"]
        assert sorted(x.labels["gpu"] for x in used) == ["0", "1"], used
        assert {x.labels["host"] for x in used} == {"node-a"}
        assert len(under.series["gpuwatch_gpu_utilization_ratio"]) == 2
        assert "gpuwatch_gpu_memory_total_bytes" not in under.series
        # The grid's row figures asked of the targets near its view only: the target's
        # address as an escaped regex (its dots literal), as the real Prometheus reads it.
        near = fetch(PromClient(base), near={addresses["node-b"]})
        assert not near.errors and near.near == {addresses["node-b"]}, near.errors
        rows = [x for f in ROW_FAMILIES for x in near.series[f]]
        assert rows and {x.labels["instance"] for x in rows} == {addresses["node-b"]}, rows
        assert len(near.series["gpuwatch_gpu_memory_used_bytes"]) == 6
        tmux.keys("Escape")
        assert tmux.wait_for_text("6 GPUs", timeout=20), tmux.screen()
        # One exporter killed: its GPU stays, marked stale; the others stay ok.
        procs["node-c"].kill()
        assert tmux.wait_for_text("1 stale", timeout=30), tmux.screen()
        screen = tmux.screen()
        cells = [line for line in screen.splitlines() if "G/80.0G  " in line]
        assert len(cells) == 6 and len([c for c in cells if "stale" in c]) == 1, screen
        (host_line,) = [line for line in screen.splitlines() if line.startswith(" node-c ")]
        assert "1 GPUs, 1 not ok" in host_line, screen
        assert not [line for line in screen.splitlines() if "node-a" in line and "not ok" in line]
        assert "Traceback" not in screen
        tmux.keys("q")
        assert tmux.wait_for_text("EXIT=0", timeout=20), tmux.screen()
    finally:
        tmux.close()


def test_a_real_prometheus_over_https(tmp_path: Path) -> None:
    """Prometheus serving TLS (its --web.config.file) with a certificate of our own making:
    refused unless --insecure, or trusted through --ca-file."""
    from promstub import self_signed

    made = self_signed(tmp_path)
    if made is None:
        pytest.skip("needs openssl to make a self-signed certificate")
    cert, key = made
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    (tmp_path / "prometheus.yml").write_text("global:\n  scrape_interval: 2s\n")
    port = free_port()
    log = open(tmp_path / "prometheus.log", "w")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(
        [
            str(PROMETHEUS), f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
            f"--web.config.file={web}",
        ],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
    )  # fmt: skip
    url = f"https://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GPUWATCH_PROMETHEUS_TOKEN", None)

    def once(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "gpuwatch", "cluster", "--prometheus", url, "--once", *extra],
            capture_output=True, text=True, env=env, cwd=ROOT, timeout=60,
        )  # fmt: skip

    try:
        assert wait_for(lambda: "Server is ready" in (tmp_path / "prometheus.log").read_text(), 60)
        refused = once()
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "TLS certificate not trusted" in refused.stdout
        insecure = once("--insecure")
        assert insecure.returncode == 0, insecure.stdout + insecure.stderr
        assert "0 GPUs" in insecure.stdout
        trusted = once("--ca-file", str(cert))
        assert trusted.returncode == 0, trusted.stdout + trusted.stderr
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_host_down_before_the_view_starts_is_listed_as_lost(
    tmp_path: Path, sock_dir: Path, prometheus
) -> None:
    """node-b's exporter is killed (-9) before the view starts and node-c's never answered:
    the view lists node-b with its last known figures and node-c as lost, from its first
    refresh (before, it said "2 GPUs · 1 hosts" and nothing else)."""
    procs: dict[str, subprocess.Popen] = {}
    try:
        addresses = {}
        for host in ("node-a", "node-b"):
            command = [
                sys.executable, "-m", "gpuwatch", "record",
                "--out", str(tmp_path / f"{host}.gpuwatch"),
                "--socket", str(sock_dir / f"{host}.sock"),
                "--prometheus", "127.0.0.1:0", "--interval", "250",
            ]  # fmt: skip
            procs[host] = subprocess.Popen(
                command, env=_env(2), cwd=ROOT, stderr=subprocess.PIPE, text=True
            )
            found = Lines(procs[host])
            assert wait_for(lambda f=found: f.find(r"metrics on http://(\S+)/metrics"), 60)
            addresses[host] = found.find(r"metrics on http://(\S+)/metrics").group(1)
        addresses["node-c"] = f"127.0.0.1:{free_port()}"  # nobody listens
        client = PromClient(prometheus(addresses))

        def up(host: str) -> float | None:
            try:
                got = client.query(f'up{{host="{host}"}}')
            except PromError:
                return None
            return got[0].value if got else None

        assert wait_for(lambda: up("node-b") == 1 and up("node-c") == 0, 60)
        assert wait_for(lambda: client.query('gpuwatch_gpu_memory_used_bytes{host="node-b"}'), 30)
        procs["node-b"].kill()
        procs["node-b"].wait(30)
        assert wait_for(lambda: up("node-b") == 0, 30)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("GPUWATCH_PROMETHEUS_TOKEN", None)
        out = subprocess.run(
            [sys.executable, "-m", "gpuwatch", "cluster", "--prometheus", client.base, "--once"],
            capture_output=True, text=True, env=env, cwd=ROOT, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        lines = out.stdout.splitlines()
        assert "4 GPUs · 3 hosts" in lines[0] and "2 down" in lines[0], lines
        (b,) = [line for line in lines if line.startswith("node-b ")]
        assert "2 GPUs, 2 not ok" in b and f"lost: target {addresses['node-b']} down" in b, lines
        i = lines.index(b)
        cells = lines[i + 1 : i + 3]
        assert all("G/80.0G" in c and "stale" in c for c in cells), lines  # its last figures
        (c,) = [line for line in lines if line.startswith("node-c ")]
        assert f"lost: target {addresses['node-c']} down, no figures seen" in c, lines
        (a,) = [line for line in lines if line.startswith("node-a ")]
        assert "not ok" not in a and "lost" not in a, lines
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
