"""Cost of ``gpuwatch cluster`` at scale: 1, 16 and 64 hosts x 8 GPUs, refreshing each second.

Sixteen real ``gpuwatch record --prometheus 127.0.0.1:0`` exporters run on loopback, each
on the fake NVML with 8 GPUs (tests/fake_nvml.py, sampled once a second) and one
instrumented rank stepping through its phases (tests/scripts/cluster_rank.py). Sixty-four
real exporters do not fit on this project's 2-core machine beside Prometheus and the view,
so hosts 16 to 63 are **stand-ins**: one process serving, on a port of its own for each,
the live ``/metrics`` of real exporter ``k % 16`` (fetched when scraped), so Prometheus
ingests 64 targets of 8 GPUs whose figures move as the real ones do. One real Prometheus
scrapes all 64 every second, giving each its own ``host`` label.

The real cluster view (:class:`gpuwatch.tui.cluster.ClusterApp`) then runs in a real
terminal (tmux, 200x50: Textual's own driver writes every frame to it), in a process of its
own, over 1 host (the anchor), 16 hosts and all 64, in the same run: half the window on
the grid, then half with a host's panels open (the drill-down: its range queries and
charts, the grid still refreshing underneath).

Figures, with the issue's targets (issues 28 and 40):

1. **The view's whole CPU per refresh**: its process CPU time (every thread: the queries'
   JSON, folding, laying out and painting the terminal) over the refreshes in the window.
   Target: at most 250 ms at 64 hosts, drill-down included.
2. **CPU share**: the same CPU time over wall time. Target: at most 10% of one core.
3. **Refresh latency**: its queries plus folding the answers in and redrawing (median, max).
4. **RSS** of the view's process at the end. Target: at most 200 MB.

The machine is shared (other engineers' jobs run on the same two cores): compare sizes
within one run only; the load average is printed. ``--base DIR`` also runs the view of
another checkout (``DIR``'s gpuwatch) over the same exporters and Prometheus, each size
right after this tree's, and prints the ratio of the two.

``--scripted`` puts the tests' scripted Prometheus (tests/support/promstub.py, keep-alive,
every figure moving each second) in place of the exporters and the real Prometheus: on a
loaded machine a real Prometheus over 64 targets starves and answers late, so a view
refreshes less often than each second and its cost per refresh says little; the scripted
one answers at once and costs the cores far less, so the view's own cost is measured.
``--profile DIR`` writes each view's cProfile statistics (every thread).

Run: python benchmarks/bench_cluster.py [--real 16] [--hosts 1,16,64] [--gpus 8] [--seconds 30]
[--base DIR] [--scripted] [--profile DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
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
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_memory import rss_mb  # noqa: E402

TREE = "GPUWATCH_BENCH_TREE"
"""The view child's gpuwatch checkout (``--base``)."""
PROFILE = "GPUWATCH_BENCH_PROFILE"
"""Where the view child writes its cProfile statistics, every thread's (``--profile``)."""
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
    """The child, in a real terminal: the view for ``seconds`` after its first refresh,
    the first half on the grid, the second with host node-00's panels open."""
    from gpuwatch.cluster import PromClient, parse_matchers
    from gpuwatch.tui.cluster import ClusterApp, HostScreen

    class Measured(ClusterApp):
        def on_mount(self) -> None:
            super().on_mount()
            self.marks: list[tuple[float, float, int, int]] = []  # cpu, wall, refreshes, loads
            self.set_interval(0.1, self._bench)

        def _loads(self) -> int:
            return self.screen.version if isinstance(self.screen, HostScreen) else 0

        def _bench(self) -> None:
            if self.refreshes < 1:
                return
            now = time.monotonic()
            mark = (time.process_time(), now, self.refreshes, self._loads())
            if not self.marks:
                self.marks.append(mark)
                self._lat0 = len(self.latencies)
            elif len(self.marks) == 1 and now - self.marks[0][1] >= seconds / 2:
                self.marks.append(mark)
                self.open_host("node-00")
            elif len(self.marks) == 2 and now - self.marks[0][1] >= seconds and self._loads():
                self.marks.append(mark)
                self._write()
                self.exit(0)

        def _write(self) -> None:
            (c0, w0, n0, _), (c1, w1, n1, _), (c2, w2, n2, l2) = self.marks
            lat = list(self.latencies)[self._lat0 :]
            result = {
                "gpus": len(self.cluster.gpus),
                "hosts": len(self.cluster.hosts()),
                "ranks": self.cluster.rank_count,
                "interval": self.interval,
                "grid": {"refreshes": n1 - n0, "cpu_s": c1 - c0, "wall_s": w1 - w0},
                "drill": {"refreshes": n2 - n1, "cpu_s": c2 - c1, "wall_s": w2 - w1, "loads": l2},
                "latencies_ms": [(q + d) * 1000 for q, d in lat],
                "query_ms": [q * 1000 for q, _ in lat],
                "draw_ms": [d * 1000 for _, d in lat],
                "rss_mb": rss_mb(os.getpid()),
                "error": self.cluster.error,
            }
            Path(out).write_text(json.dumps(result))

    profile = os.environ.get(PROFILE)
    if not profile:
        Measured(PromClient(url), parse_matchers(match) if match else []).run()
        return
    with _profiled(Path(profile)):
        Measured(PromClient(url), parse_matchers(match) if match else []).run()


@contextlib.contextmanager
def _profiled(out: Path) -> Iterator[None]:
    """cProfile of the main thread and of every thread started meanwhile (each on a
    profiler of its own, merged at the end): the view's queries run on threads."""
    import cProfile
    import pstats
    import threading

    profiles: list[cProfile.Profile] = []
    run = threading.Thread.run

    def profiled_run(self: threading.Thread) -> None:
        prof = cProfile.Profile(time.thread_time)
        profiles.append(prof)
        prof.runcall(run, self)

    threading.Thread.run = profiled_run  # type: ignore[method-assign]
    main = cProfile.Profile(time.thread_time)
    main.enable()
    try:
        yield
    finally:
        main.disable()
        threading.Thread.run = run  # type: ignore[method-assign]
        stats = pstats.Stats(main)
        for prof in list(profiles):
            try:
                stats.add(prof)
            except TypeError:  # a thread still running has no statistics yet
                pass
        stats.dump_stats(out.with_suffix(".part"))
        out.with_suffix(".part").rename(out)  # whole, for the parent waiting on it


def stand_ins(real: list[str], count: int) -> None:
    """The child serving stand-in exporters: ``count`` ports, each answering with the
    ``/metrics`` of real exporter ``k % len(real)`` as it was at most a second ago (one
    fetch a second for all the stand-ins of one real exporter); writes its ports to
    stdout."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    cache: dict[str, tuple[float, bytes]] = {}
    lock = threading.Lock()

    def body_of(url: str) -> bytes | None:
        with lock:
            got = cache.get(url)
            if got is not None and time.monotonic() - got[0] < 1.0:
                return got[1]
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                body = r.read()
        except OSError:
            return None
        with lock:
            cache[url] = (time.monotonic(), body)
        return body

    servers = []
    for k in range(count):
        source = f"http://{real[k % len(real)]}/metrics"

        class Handler(BaseHTTPRequestHandler):
            url = source

            def do_GET(self) -> None:
                body = body_of(self.url)
                try:
                    self.send_response(200 if body is not None else 503)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(body or b"")))
                    self.end_headers()
                    self.wfile.write(body or b"")
                except OSError:
                    pass  # Prometheus gave up on the scrape (its timeout)

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    print(" ".join(f"127.0.0.1:{s.server_address[1]}" for s in servers), flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})


def scripted(hosts: int, gpus: int) -> None:
    """The child playing Prometheus itself (``--scripted``): the scripted server of the
    tests (tests/support/promstub.py, keep-alive as Prometheus is) answering for ``hosts``
    hosts of ``gpus`` GPUs and one rank each, every figure moving each second as a
    training job's do; writes its URL to stdout. It costs the machine far less than 64
    exporters and a real Prometheus, so the view's own CPU is what a run measures."""
    import math
    import re
    import threading

    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from promstub import GiB, PromStub, Stub, gpu_series, merge, rank_series

    def families(t: float) -> dict:
        parts = []
        for h in range(hosts):
            host = f"node-{h:02d}"
            wave = 0.5 + 0.5 * math.sin(t / 7 + h)
            parts.append(gpu_series(host, gpus, used_gib=20 + 40 * wave))
            peaks = {p: (8 + 4 * i + 10 * wave) * GiB for i, p in enumerate(PHASES)}
            parts.append(rank_series(host, 0, h, 1000 + h, peaks, step=int(t)))
            info = {"pid": str(1000 + h), "rank": str(h), "local_rank": "0", "host": host}
            info |= {"world_size": str(hosts), "strategy": "ddp"}  # as an exporter's
            parts.append({"gpuwatch_rank_info": [(info, 1)]})
        return merge(*parts)

    class HostStub(Stub):
        """Answers a query naming one host (the drill-down's range query) with that host's
        series only, as Prometheus does: the tests' stub ignores matchers, and the panels
        would parse every host's series."""

        def select(self, query: str) -> list[tuple[dict[str, str], float]]:
            found = super().select(query)
            host = re.search(r'host="([^"]*)"', query)
            return [x for x in found if x[0].get("host") == host.group(1)] if host else found

    stub = HostStub(families=families(time.time()))
    server = PromStub(stub, keep_alive=True)

    def move() -> None:
        while True:
            time.sleep(1.0)
            stub.families = families(time.time())
            stub.requests.clear()  # the log of requests would grow for the whole run

    threading.Thread(target=move, daemon=True).start()
    print(server.url, flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})


PHASES = ("forward", "backward", "optimizer.step")


def _exporters(hosts: int, gpus: int, tmp: Path) -> tuple[list[subprocess.Popen], list[str]]:
    procs, addrs = [], []
    py = sys.executable
    for i in range(hosts):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        env["GPUWATCH_NVML_BACKEND"] = "tests.fake_nvml"
        env["GPUWATCH_FAKE_NVML"] = json.dumps({"gpus": gpus, "trace": "training"})
        env.pop("GPUWATCH_SOCKET", None)
        rank = ROOT / "tests" / "scripts" / "cluster_rank.py"
        job = (
            f"GPUWATCH_JOB_NAME=bench RANK={i} LOCAL_RANK=0 WORLD_SIZE={hosts} "
            f"exec {py} {rank} {1000 + 100 * i}"
        )
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


def _run_view(
    base: str, match: str, seconds: float, out: Path, tree: Path = ROOT, profile: Path | None = None
) -> dict:
    """The view (``tree``'s gpuwatch) in a private tmux server at 200x50, until it writes
    its figures."""
    server = f"gw-bench-{os.getpid()}-{out.stem}"
    py = shlex.quote(sys.executable)
    command = (
        f"env -u COLUMNS -u LINES PYTHONPATH={shlex.quote(str(ROOT))} "
        f"{TREE}={shlex.quote(str(tree))} "
        + (f"{PROFILE}={shlex.quote(str(profile))} " if profile else "")
        + f"{py} "
        f"{shlex.quote(__file__)} --view {shlex.quote(base)} {shlex.quote(match or '-')} "
        f"{seconds} {shlex.quote(str(out))}"
    )
    tmux = ["tmux", "-L", server, "-f", "/dev/null"]
    if profile is not None:
        profile.unlink(missing_ok=True)  # the parent waits for this run's
    subprocess.run([*tmux, "new-session", "-d", "-x", "200", "-y", "50", command], check=True)
    try:
        if not wait_for(out.exists, seconds * 3 + 120, 0.5):
            screen = subprocess.run([*tmux, "capture-pane", "-p"], capture_output=True, text=True)
            raise SystemExit(f"the view did not finish:\n{screen.stdout}")
        if profile is not None:  # written once the view has closed
            wait_for(profile.exists, 60, 0.5)
        return json.loads(out.read_text())
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--real", type=int, default=16, help="real exporters (the rest stand-ins)")
    ap.add_argument("--hosts", default="1,16,64", help="view sizes, in hosts")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--base", type=Path, help="another checkout whose view runs too")
    ap.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="write each view's cProfile statistics (every thread) to DIR/view-N.prof",
    )
    ap.add_argument(
        "--view", nargs=4, metavar=("URL", "MATCH", "SECONDS", "OUT"), help=argparse.SUPPRESS
    )
    ap.add_argument(
        "--scripted",
        action="store_true",
        help="a scripted Prometheus (tests/support/promstub.py) instead of exporters and a "
        "real one: the view's own cost, without theirs on the same cores",
    )
    ap.add_argument("--stand-ins", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--scripted-server", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.scripted_server:
        scripted(*args.scripted_server)
        return 0
    if args.view:
        sys.path.insert(0, os.environ.get(TREE, str(ROOT)))  # whose gpuwatch the view is
        url, match, seconds, out = args.view
        view(url, "" if match == "-" else match, float(seconds), out)
        return 0
    if args.stand_ins:
        stand_ins(args.stand_ins[1:], int(args.stand_ins[0]))
        return 0
    sizes = sorted({int(x) for x in args.hosts.split(",")})
    hosts = sizes[-1]
    real_n = min(args.real, hosts)
    tmp = Path(tempfile.mkdtemp(prefix="gw-bc-", dir="/tmp"))
    procs: list[subprocess.Popen] = []
    try:
        if args.scripted:
            print(
                f"a scripted Prometheus (tests/support/promstub.py, one per size) of {hosts} "
                f"hosts x {args.gpus} GPUs at most, every figure moving each second; the view "
                f"in tmux at 200x50, {args.seconds / 2:g} s on the grid then "
                f"{args.seconds / 2:g} s with node-00's panels open"
            )
            return _report(args, sizes, _scripted_runs(args, sizes, tmp, procs))
        exporters, addrs = _exporters(real_n, args.gpus, tmp)
        procs += exporters
        if hosts > real_n:
            proxy = subprocess.Popen(
                [sys.executable, __file__, "--stand-ins", str(hosts - real_n), *addrs],
                stdout=subprocess.PIPE, text=True, cwd=ROOT,
            )  # fmt: skip
            procs.append(proxy)
            assert proxy.stdout is not None
            addrs += proxy.stdout.readline().split()
        prom, base = _prometheus(addrs, tmp)
        procs.append(prom)
        want = hosts * args.gpus
        if not wait_for(lambda: _count(base, "gpuwatch_gpu_memory_used_bytes") >= want, 180):
            raise SystemExit("prometheus never had every GPU")
        wait_for(lambda: _count(base, "gpuwatch_process_phase_peak_allocated_bytes") >= hosts, 60)
        print(
            f"{hosts} exporters x {args.gpus} fake GPUs ({real_n} real, {hosts - real_n} "
            f"stand-ins relaying a real one's /metrics), Prometheus scraping each 1 s; the view "
            f"in tmux at 200x50, {args.seconds / 2:g} s on the grid then {args.seconds / 2:g} s "
            "with node-00's panels open"
        )
        results: dict[int, dict] = {}
        based: dict[int, dict] = {}
        for n in sizes:
            names = "|".join(f"node-{i:02d}" for i in range(n))
            match = "" if n == hosts else f'{{host=~"{names}"}}'
            _both(args, base, match, n, tmp, results, based)
        return _report(args, sizes, (results, based))
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


def _both(
    args: argparse.Namespace,
    url: str,
    match: str,
    n: int,
    tmp: Path,
    results: dict[int, dict],
    based: dict[int, dict],
) -> None:
    """The view of this tree at ``n`` hosts, then the base's (``--base``) on the same server."""
    prof = args.profile / f"view-{n}.prof" if args.profile else None
    results[n] = _run_view(url, match, args.seconds, tmp / f"view-{n}.json", ROOT, prof)
    if args.base is not None:
        out = tmp / f"base-{n}.json"
        based[n] = _run_view(url, match, args.seconds, out, args.base.resolve())


def _scripted_runs(
    args: argparse.Namespace, sizes: list[int], tmp: Path, procs: list[subprocess.Popen]
) -> tuple[dict[int, dict], dict[int, dict]]:
    results: dict[int, dict] = {}
    based: dict[int, dict] = {}
    for n in sizes:
        # Its stderr dropped: a view closing resets its connections, and the server
        # writes a traceback for each.
        server = subprocess.Popen(
            [sys.executable, __file__, "--scripted-server", str(n), str(args.gpus)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
        )  # fmt: skip
        procs.append(server)
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        _both(args, url, "", n, tmp, results, based)
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    return results, based


def _report(
    args: argparse.Namespace, sizes: list[int], runs: tuple[dict[int, dict], dict[int, dict]]
) -> int:
    """Print each size's figures (and the base's) against the targets; 0 if all pass."""
    results, based = runs
    ok = True
    anchor = results[sizes[0]]

    def per(part: dict) -> tuple[float, float]:
        # With a host open, a refresh is the grid's and the panels' (each once an
        # interval): the CPU over the more of the two counts.
        refreshes = max(1, part["refreshes"], part.get("loads", 0))
        return 1000 * part["cpu_s"] / refreshes, 100 * part["cpu_s"] / part["wall_s"]

    for n, r in results.items():
        lat = r["latencies_ms"] or [float("nan")]
        med, top = statistics.median(lat), max(lat)
        grid_ms, grid_pct = per(r["grid"])
        drill_ms, drill_pct = per(r["drill"])
        good = (
            max(grid_ms, drill_ms) <= TARGET_MS
            and max(grid_pct, drill_pct) <= TARGET_CPU
            and r["rss_mb"] <= TARGET_RSS
            and r["gpus"] == n * args.gpus
        )
        ok &= good
        ratio = ""
        if r is not anchor:
            a_ms, _ = per(anchor["drill"])
            ratio = f" (x{drill_ms / a_ms:.1f} the CPU per refresh of {sizes[0]} host)"
        print(
            f"{n:>3} hosts: {r['gpus']} GPUs, {r['ranks']} ranks, every {r['interval']:g} s; "
            f"the view's CPU per refresh {grid_ms:.0f} ms on the grid, {drill_ms:.0f} ms with "
            f"a host open (<= {TARGET_MS:.0f}){ratio}; {grid_pct:.1f}% / {drill_pct:.1f}% of "
            f"a core (<= {TARGET_CPU:.0f}%); refresh latency median {med:.0f} ms, max "
            f"{top:.0f} ms; RSS {r['rss_mb']:.0f} MB (<= {TARGET_RSS:.0f})  "
            + ("PASS" if good else "FAIL")
        )
        q = statistics.median(r["query_ms"] or [float("nan")])
        d = statistics.median(r["draw_ms"] or [float("nan")])
        print(
            f"{'':>11}{r['grid']['refreshes']} + {r['drill']['refreshes']} refreshes, "
            f"{r['drill']['loads']} drill-down loads; latency: queries {q:.0f} ms, "
            f"folding and the grid {d:.0f} ms"
        )
        if r["error"]:
            print(f"{'':>11}last refresh error: {r['error']}")
        if n in based:
            b = based[n]
            b_grid, b_grid_pct = per(b["grid"])
            b_drill, b_drill_pct = per(b["drill"])
            print(
                f"{'':>11}{args.base}: {b_grid:.0f} ms / {b_drill:.0f} ms per refresh, "
                f"{b_grid_pct:.1f}% / {b_drill_pct:.1f}% of a core; this tree's CPU per "
                f"refresh x{grid_ms / b_grid:.2f} on the grid, x{drill_ms / b_drill:.2f} "
                "with a host open"
            )
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} / {load[1]:.1f} on {os.cpu_count()} cores (shared)")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
