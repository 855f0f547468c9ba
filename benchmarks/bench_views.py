"""What a second view of one machine costs (issue 51 item 1): the owner's CPU with a view
attached (and with a stuck one) against the owner alone, the view's own CPU, and the
view's dashboard against the owner's, all in one run on this tree.

The owner is a child process with a live session as bench_processes.py builds it: 8 fake
GPUs sampled at 10 Hz (tests/fake_nvml.py, in the process), the host sampler at 10 Hz, 200
real processes (``sleep``) listed on the GPUs, 40 of them instrumented (a hello naming
their GPU, then a phase boundary each a second: 80 messages a second), and the view
socket (:class:`~gpuwatch.sources.views.ViewHub`). Each figure is CPU time over wall time
(every thread of the process, read from /proc) in % of one core, for ``--seconds``:

- owner alone (the anchor), owner with one view attached (the view reading), owner with
  a stuck view (connected, reading nothing: its queue fills and drops);
- the view's own: a process with a :class:`~gpuwatch.sources.views.ViewFeed` and a
  session, no dashboard (what attaching costs);
- the view's dashboard (the real app headless at 200x50, idle, then the Processes tab)
  over the fed session, against the owner's dashboard over its own session (the same
  app in the owner process; its own share less the owner alone), measured the same way.

Targets: the owner with a view (and with a stuck one) at most 1.1x the owner alone; the
view's own CPU at most 2% of a core.

Run: python benchmarks/bench_views.py [--seconds 10] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TARGET_RATIO = 1.1
TARGET_VIEW = 2.0  # % of one core

OWNER = r"""
import asyncio, json, os, sys, threading, time
sys.path.insert(0, os.getcwd())
from gpuwatch.protocol import Message
from gpuwatch.session import Session
from gpuwatch.sources.gpu import GpuSampler
from gpuwatch.sources.host import HostSampler
from gpuwatch.sources.lock_file import LockFile
from gpuwatch.sources.nvml import Nvml
from gpuwatch.sources.views import ViewHub
from tests.fake_nvml import FakeNvml, GiB

sock, mode, seconds = sys.argv[1], sys.argv[3], float(sys.argv[4])
pids = [int(p) for p in sys.argv[2].split(",")]
fake = FakeNvml(8)
for i, pid in enumerate(pids):
    gpu = fake.gpus[i % 8]
    gpu.compute.append((pid, (1 + i % 7) * GiB))
s = Session()
s.bound()
sampler = GpuSampler(s, interval=0.1, process_interval=1.0)
sampler.nvml = Nvml(fake)
host = HostSampler(s, interval=0.1)
assert sampler.start()
host.start()
lock = LockFile.take(sock)
hub = ViewHub(s, sock, recording=lambda: None, once=lambda: {})
hub.start()
seq = {}
def msg(pid, kind, **body):
    n = seq[pid] = seq.get(pid, -1) + 1
    s.ingest(Message(kind=kind, pid=pid, seq=n, t=time.monotonic_ns(), dropped=0, body=body))
for rank, pid in enumerate(pids[:40]):
    gpu = fake.gpus[rank % 8]
    uuid = gpu.uuid.removeprefix("GPU-")
    device = {"index": 0, "uuid": uuid, "name": gpu.name, "total": gpu.total}
    msg(pid, "hello", argv=["python", "train.py"], rank=rank, world_size=40, devices=[device])
def steps():
    step = 0
    while True:
        step += 1
        for pid in pids[:40]:
            msg(pid, "phase", event="begin", name="forward", id=step, depth=0, step=step)
        time.sleep(0.5)
        for pid in pids[:40]:
            msg(pid, "phase", event="end", name="forward", id=step, depth=0, step=step)
        time.sleep(0.5)
threading.Thread(target=steps, daemon=True).start()
print("ready", flush=True)
if mode == "dash":
    from gpuwatch.tui.app import GpuwatchApp
    def cpu():
        t = os.times(); return t.user + t.system
    async def main():
        app = GpuwatchApp(s)
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.pause(3.0)
            out = {}
            for key in ("idle", "tab"):
                if key == "tab":
                    await pilot.press("3"); await pilot.pause(1.0)
                c0, w0 = cpu(), time.monotonic()
                await pilot.pause(seconds)
                out[key] = 100 * (cpu() - c0) / (time.monotonic() - w0)
        print(json.dumps(out), flush=True)
    asyncio.run(main())
else:
    sys.stdin.read()
"""

VIEW = r"""
import asyncio, json, os, sys, time
sys.path.insert(0, os.getcwd())
from gpuwatch.session import Session
from gpuwatch.sources.views import ViewFeed

sock, mode, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
s = Session()
s.bound()
feed = ViewFeed(s, sock)
feed.connect()
feed.start(lambda f: None)
def cpu():
    t = os.times(); return t.user + t.system
time.sleep(2.0)
c0, w0 = cpu(), time.monotonic()
time.sleep(seconds)
out = {"feed": 100 * (cpu() - c0) / (time.monotonic() - w0), "dropped": feed.applier.dropped,
       "refused": feed.applier.refused, "gpus": len(s.gpu), "processes": len(s.processes)}
if mode == "dash":
    from gpuwatch.tui.app import GpuwatchApp
    async def main():
        app = GpuwatchApp(s)
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.pause(3.0)
            for key in ("idle", "tab"):
                if key == "tab":
                    await pilot.press("3"); await pilot.pause(1.0)
                c0, w0 = cpu(), time.monotonic()
                await pilot.pause(seconds)
                out[key] = 100 * (cpu() - c0) / (time.monotonic() - w0)
    asyncio.run(main())
print(json.dumps(out), flush=True)
feed.stop()
"""

STUCK = r"""
import socket, sys
c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
c.connect(sys.argv[1] + ".views")
c.sendall(b"view\n")
print("ready", flush=True)
sys.stdin.read()
"""


def _ticks(pid: int) -> float:
    """CPU seconds of every thread of ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _share(pid: int, seconds: float) -> float:
    c0, w0 = _ticks(pid), time.monotonic()
    time.sleep(seconds)
    return 100 * (_ticks(pid) - c0) / (time.monotonic() - w0)


def _env() -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": tempfile.gettempdir(), "PYTHONPATH": str(ROOT)}


def _start(code: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise SystemExit(f"a child failed: {proc.args[3:]}")
    return proc


def _end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _view(sock: str, mode: str, seconds: float) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", VIEW, sock, mode, str(seconds)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=seconds * 4 + 120,
    )
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise SystemExit(f"the view failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def once(pids: list[int], seconds: float) -> dict[str, float]:
    """One run of every measurement; the figures by name."""
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="gw-bv-", dir="/tmp") as d:
        sock = os.path.join(d, "gw.sock")
        owner = _start(OWNER, sock, ",".join(map(str, pids)), "idle", str(seconds))
        try:
            time.sleep(3.0)  # every process list read twice
            out["owner_alone"] = _share(owner.pid, seconds)
            viewer = subprocess.Popen(
                [sys.executable, "-c", VIEW, sock, "feed", str(seconds)],
                cwd=ROOT,
                env=_env(),
                stdout=subprocess.PIPE,
                text=True,
            )
            time.sleep(2.0)  # as the view waits before it measures
            out["owner_view"] = _share(owner.pid, seconds)
            said, _ = viewer.communicate(timeout=seconds + 60)
            got = json.loads(said.strip().splitlines()[-1])
            out["view_feed"] = got["feed"]
            out["view_dropped"] = got["dropped"]
            out["view_gpus"], out["view_processes"] = got["gpus"], got["processes"]
            stuck = _start(STUCK, sock)
            try:
                time.sleep(2.0)
                out["owner_stuck"] = _share(owner.pid, seconds)
            finally:
                _end(stuck)
            dash = _view(sock, "dash", seconds)
            out["view_dash_idle"], out["view_dash_tab"] = dash["idle"], dash["tab"]
        finally:
            _end(owner)
        sock2 = os.path.join(d, "gw2.sock")
        own = _start(OWNER, sock2, ",".join(map(str, pids)), "dash", str(seconds))
        assert own.stdout is not None
        figures = json.loads(own.stdout.readline())
        _end(own)
        out["owner_dash_idle"], out["owner_dash_tab"] = figures["idle"], figures["tab"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds each share")
    parser.add_argument("--repeats", type=int, default=2, help="runs, medians reported")
    args = parser.parse_args()
    sleepers = [subprocess.Popen(["sleep", "3600"]) for _ in range(200)]
    try:
        runs = [once([p.pid for p in sleepers], args.seconds) for _ in range(args.repeats)]
    finally:
        for p in sleepers:
            p.kill()
            p.wait()

    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    print(
        f"8 fake GPUs at 10 Hz, 200 processes (40 instrumented, 80 messages/s), "
        f"{args.seconds:g} s a share, medians of {args.repeats} runs, CPU time over wall "
        f"time in % of a core; load average {os.getloadavg()[0]:.1f} (a shared machine: "
        "compare the ratios)"
    )
    alone = med("owner_alone")
    ok = True
    for key, what in (("owner_view", "a view attached"), ("owner_stuck", "a stuck view")):
        r = med(key) / alone if alone > 0 else float("inf")
        good = r <= TARGET_RATIO
        ok &= good
        print(
            f"owner with {what}: {med(key):5.2f}% | anchor, the owner alone: {alone:5.2f}% | "
            f"{r:4.2f}x | target <= {TARGET_RATIO:g}x: {'PASS' if good else 'FAIL'}"
        )
    feed = med("view_feed")
    good = feed <= TARGET_VIEW
    ok &= good
    print(
        f"the view's own (feed and session, no dashboard): {feed:5.2f}% | target <= "
        f"{TARGET_VIEW:g}%: {'PASS' if good else 'FAIL'} (it had {med('view_gpus'):.0f} GPUs, "
        f"{med('view_processes'):.0f} processes, {med('view_dropped'):.0f} facts dropped)"
    )
    for key, what in (("idle", "idle (Timelines)"), ("tab", "Processes tab open")):
        view, own = med(f"view_dash_{key}"), med(f"owner_dash_{key}")
        own_less, view_less = own - alone, view - feed
        print(
            f"dashboard {what}: the view's {view_less:5.2f}% (its process {view:5.2f}% less "
            f"its feed) | anchor, the owner's {own_less:5.2f}% (its process {own:5.2f}% less "
            f"the owner alone) | {view_less / own_less if own_less > 0 else float('inf'):4.2f}x"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
