"""Cost of ``gpuwatch cluster`` at scale: 16 hosts x 8 GPUs, refreshing each second.

Sixteen real ``gpuwatch record --prometheus 127.0.0.1:0`` exporters run on loopback, each
on the fake NVML with 8 GPUs (tests/fake_nvml.py, sampled once a second) and one
instrumented rank stepping through its phases (tests/scripts/cluster_rank.py), and one
real Prometheus scrapes them every second, giving each its own ``host`` label. The real
cluster view (:class:`gpuwatch.tui.cluster.ClusterApp`, Textual running headless at
140x45, so the grid is laid out and painted as on a terminal) then runs in a process of
its own, first over one host (``--match '{host="node-00"}'``: the anchor) and then over
all sixteen, in the same run.

Figures, with the issue's targets (issue 28):

1. **Refresh latency**: its queries (one per metric family) plus folding the answers in
   and updating the grid, median and max over the window. Target: at most 250 ms.
2. **CPU**: the view's process CPU time over wall time in the window (after its first
   refresh), painting included. Target: at most 10% of one core.
3. **RSS** of the view's process at the end. Target: at most 200 MB.

Run: python benchmarks/bench_cluster.py [--hosts 16] [--gpus 8] [--seconds 30]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_memory import rss_mb  # noqa: E402

TARGET_MS = 250.0
TARGET_CPU = 10.0
TARGET_RSS = 200.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond, timeout: float, interval: float = 0.2) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(interval)
    return bool(cond())


def view(url: str, match: str, seconds: float, out: str) -> None:
    """The child: the real view, headless, for ``seconds`` after its first refresh."""
    import asyncio

    from gpuwatch.cluster import PromClient, parse_matchers
    from gpuwatch.tui.cluster import ClusterApp

    app = ClusterApp(PromClient(url), parse_matchers(match) if match else [])

    async def run() -> None:
        async with app.run_test(size=(140, 45), headless=True) as pilot:
            while app.refreshes < 1:
                await pilot.pause(0.05)
            cpu0, wall0, n0 = time.process_time(), time.monotonic(), app.refreshes
            lat0 = len(app.latencies)
            while time.monotonic() - wall0 < seconds:
                await pilot.pause(0.25)
            cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
            result = {
                "gpus": len(app.cluster.gpus),
                "hosts": len(app.cluster.hosts()),
                "ranks": app.cluster.rank_count,
                "refreshes": app.refreshes - n0,
                "interval": app.interval,
                "latencies_ms": [(q + d) * 1000 for q, d in list(app.latencies)[lat0:]],
                "query_ms": [q * 1000 for q, _ in list(app.latencies)[lat0:]],
                "draw_ms": [d * 1000 for _, d in list(app.latencies)[lat0:]],
                "cpu_pct": 100 * cpu / wall,
                "rss_mb": rss_mb(os.getpid()),
                "error": app.cluster.error,
            }
            Path(out).write_text(json.dumps(result))

    asyncio.run(run())


def _exporters(hosts: int, gpus: int, tmp: Path) -> tuple[list[subprocess.Popen], list[str]]:
    procs, addrs = [], []
    py = sys.executable
    for i in range(hosts):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        env["GPUWATCH_NVML_BACKEND"] = "tests.fake_nvml"
        env["GPUWATCH_FAKE_NVML"] = json.dumps({"gpus": gpus, "trace": "training"})
        env.pop("GPUWATCH_SOCKET", None)
        rank = ROOT / "tests" / "scripts" / "cluster_rank.py"
        job = f"RANK={i} LOCAL_RANK=0 WORLD_SIZE={hosts} exec {py} {rank} {1000 + 100 * i}"
        err = open(tmp / f"rec{i}.err", "w")  # noqa: SIM115 (closed at exit)
        procs.append(
            subprocess.Popen(
                [
                    py,
                    "-m",
                    "gpuwatch",
                    "record",
                    "--out",
                    str(tmp / f"n{i}.gpuwatch"),
                    "--socket",
                    str(tmp / f"n{i}.sock"),
                    "--prometheus",
                    "127.0.0.1:0",
                    "--interval",
                    "1000",
                    "--log",
                    str(tmp / f"job{i}.log"),
                    "--",
                    "sh",
                    "-c",
                    job,
                ],
                env=env,
                cwd=ROOT,
                stderr=err,
                stdout=subprocess.DEVNULL,
            )
        )
    for i in range(hosts):
        path = tmp / f"rec{i}.err"

        def port(path: Path = path) -> str | None:
            for line in path.read_text().splitlines():
                if "metrics on http://" in line:
                    return line.split("http://")[1].split("/")[0]
            return None

        if not wait_for(lambda p=port: p() is not None, 120):
            raise SystemExit(f"exporter {i} did not start: {path.read_text()[-500:]}")
        addrs.append(port())
    return procs, addrs


def _prometheus(addrs: list[str], tmp: Path) -> tuple[subprocess.Popen, str]:
    exe = shutil.which("prometheus")
    if exe is None:
        raise SystemExit("needs the prometheus server on PATH (Debian: apt-get install prometheus)")
    static = "".join(
        f"      - targets: ['{a}']\n        labels: {{host: node-{i:02d}}}\n"
        for i, a in enumerate(addrs)
    )
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: gpuwatch\n    static_configs:\n" + static
    )
    port = free_port()
    log = open(tmp / "prometheus.log", "w")  # noqa: SIM115 (closed at exit)
    proc = subprocess.Popen(
        [
            exe, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(base + "/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    if not wait_for(ready, 60):
        raise SystemExit("prometheus did not start")
    return proc, base


def _count(base: str, promql: str) -> int:
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return len(json.load(r)["data"]["result"])
    except (OSError, ValueError, KeyError):
        return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument(
        "--view", nargs=4, metavar=("URL", "MATCH", "SECONDS", "OUT"), help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    if args.view:
        url, match, seconds, out = args.view
        view(url, match, float(seconds), out)
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="gw-bc-", dir="/tmp"))
    procs: list[subprocess.Popen] = []
    try:
        exporters, addrs = _exporters(args.hosts, args.gpus, tmp)
        procs += exporters
        prom, base = _prometheus(addrs, tmp)
        procs.append(prom)
        want = args.hosts * args.gpus
        if not wait_for(lambda: _count(base, "gpuwatch_gpu_memory_used_bytes") >= want, 120):
            raise SystemExit("prometheus never had every GPU")
        wait_for(
            lambda: _count(base, "gpuwatch_process_phase_peak_allocated_bytes") >= args.hosts, 30
        )
        print(f"{args.hosts} exporters x {args.gpus} fake GPUs, Prometheus scraping each 1 s")
        results = {}
        for label, match in (("1 host", '{host="node-00"}'), (f"{args.hosts} hosts", "")):
            out = tmp / f"view-{len(results)}.json"
            subprocess.run(
                [sys.executable, __file__, "--view", base, match, str(args.seconds), str(out)],
                check=True,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            results[label] = json.loads(out.read_text())
        ok = True
        anchor = results["1 host"]
        for label, r in results.items():
            lat = r["latencies_ms"] or [float("nan")]
            med, top = statistics.median(lat), max(lat)
            good = top <= TARGET_MS and r["cpu_pct"] <= TARGET_CPU and r["rss_mb"] <= TARGET_RSS
            ok &= good and r["gpus"] == (args.gpus if label == "1 host" else want)
            ratio = ""
            if r is not anchor:
                a_med = statistics.median(anchor["latencies_ms"] or [float("nan")])
                ratio = (
                    f"  (x{med / a_med:.1f} latency, x{r['cpu_pct'] / anchor['cpu_pct']:.1f} CPU, "
                    f"x{r['rss_mb'] / anchor['rss_mb']:.2f} RSS of 1 host)"
                )
            print(
                f"{label:>9}: {r['gpus']} GPUs, {r['ranks']} ranks, {r['refreshes']} refreshes "
                f"every {r['interval']:g} s; refresh median {med:.1f} ms, max {top:.1f} ms "
                f"(<= {TARGET_MS:.0f}); CPU {r['cpu_pct']:.1f}% of a core (<= {TARGET_CPU:.0f}%); "
                f"RSS {r['rss_mb']:.0f} MB (<= {TARGET_RSS:.0f}){ratio}  "
                + ("PASS" if good else "FAIL")
            )
            q = statistics.median(r["query_ms"] or [float("nan")])
            d = statistics.median(r["draw_ms"] or [float("nan")])
            print(f"{'':>11}of which the queries {q:.1f} ms, folding and the grid {d:.1f} ms")
            if r["error"]:
                print(f"           last refresh error: {r['error']}")
        load = os.getloadavg()
        print(f"load average {load[0]:.1f} / {load[1]:.1f} on {os.cpu_count()} cores")
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
