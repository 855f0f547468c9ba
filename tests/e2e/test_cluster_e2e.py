"""The whole path, real parts: three ``gpuwatch record --prometheus 127.0.0.1:0`` on the fake
NVML (one recording two instrumented ranks), a real Prometheus scraping them every second,
and ``gpuwatch cluster`` in tmux: every GPU, the ranks, a host's panels, and the stale
state once one exporter is killed.

The three exporters run on this one machine; Prometheus gives each its own ``host`` (a
target label, as a relabelling would), so they stand for three hosts.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, wait_for
from test_prometheus_server import Lines, free_port, start_prometheus, stop_all
from tmuxhelp import Tmux

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="needs the prometheus server on PATH (Debian: apt-get install prometheus)",
)
RANK = ROOT / "tests" / "scripts" / "cluster_rank.py"
HOSTS = {"node-a": 2, "node-b": 2, "node-c": 1}  # host -> fake GPUs


def _env(gpus: int) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env["GPUWATCH_NVML_BACKEND"] = "tests.fake_nvml"
    env["GPUWATCH_FAKE_NVML"] = json.dumps({"gpus": gpus, "trace": "training"})
    env.pop("GPUWATCH_SOCKET", None)
    return env


@pytest.fixture
def exporters(tmp_path: Path, sock_dir: Path) -> Iterator[dict[str, subprocess.Popen]]:
    """node-a records two ranks of a fake job; node-b and node-c only their GPUs."""
    py = shlex.quote(sys.executable)
    job = (
        f"RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 {py} {RANK} 1000 & "
        f"RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 {py} {RANK} 3000 & wait"
    )
    procs: dict[str, subprocess.Popen] = {}
    lines: dict[str, Lines] = {}
    for host, gpus in HOSTS.items():
        command = [
            sys.executable, "-m", "gpuwatch", "record", "--out", str(tmp_path / f"{host}.gpuwatch"),
            "--socket", str(sock_dir / f"{host}.sock"), "--prometheus", "127.0.0.1:0",
            "--interval", "250",
        ]  # fmt: skip
        if host == "node-a":
            command += ["--log", str(tmp_path / "job.log"), "--", "sh", "-c", job]
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
        # Every GPU of the three hosts, and the two ranks on node-a's GPUs.
        assert tmux.wait_for_text("5 GPUs · 3 hosts · 2 ranks", timeout=90), tmux.screen()
        screen = tmux.screen()
        for host in HOSTS:
            assert host in screen
        assert "every 1 s" in screen  # Prometheus' scrape interval
        assert tmux.wait_for_text("backward", timeout=30), tmux.screen()
        # The ranks table: rank 1's peaks stand out.
        tmux.keys("2")
        assert tmux.wait_for_text("ranks: 2", timeout=20), tmux.screen()
        # The layout from the exporter's gpuwatch_rank_info (WORLD_SIZE of the ranks).
        assert tmux.wait_for_text("world size 2", timeout=20), tmux.screen()
        assert tmux.wait_for_text("above the median", timeout=20), tmux.screen()
        screen = tmux.screen()
        assert "(rank 1)" in screen and "node-a:1" in screen
        # A drill-down: node-a's panels (the first row is its host line).
        tmux.keys("1", "Home", "Enter")
        assert tmux.wait_for_text("node-a · last 5:00", timeout=20), tmux.screen()
        assert tmux.wait_for_text("GPU 1", timeout=20), tmux.screen()
        assert tmux.wait_for_text("rank 1", timeout=20), tmux.screen()
        tmux.keys("Escape")
        assert tmux.wait_for_text("5 GPUs", timeout=20), tmux.screen()
        # One exporter killed: its GPU stays, marked stale; the others stay ok.
        procs["node-c"].kill()
        assert tmux.wait_for_text("1 stale", timeout=30), tmux.screen()
        screen = tmux.screen()
        cells = [line for line in screen.splitlines() if "G/80.0G" in line]
        assert len(cells) == 5 and len([c for c in cells if "stale" in c]) == 1, screen
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
