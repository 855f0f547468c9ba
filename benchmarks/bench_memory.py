"""Memory of a long live session: the headless recorder and the dashboard, under phases.

A real ``gpuwatch record --out FILE`` (and the dashboard, ``gpuwatch --record FILE``, in a
tmux window when tmux is installed) receives an instrumented script's phases over the real
socket: a process that does nothing but ``with gpuwatch.phase("step"): pass`` at a fixed
rate for 30 s (10k phases/s: 20k datagrams/s). The figure is how much the gpuwatch
process's resident memory (VmRSS, sampled twice a second) grows from 3 s after the phases
start to their end, and its peak over that time.

Target (issue 16): at most 15 MB of growth over 30 s at 10k phases/s, whatever the run's
length (before: +117 B per phase, +34 MB in 30 s). Anchor, measured in the same run: the
same at 1k phases/s. Memory that grew with the run would grow 10x more at 10x the rate;
flat memory grows the same (ratio about 1).

Run: python benchmarks/bench_memory.py [--seconds 30] [--rate 10000] [--no-dashboard]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TARGET_MB = 15.0
SETTLE = 3.0

CLIENT = r"""
import sys, time
import gpuwatch

rate, seconds = float(sys.argv[1]), float(sys.argv[2])
p = gpuwatch.phase("step")
start = time.perf_counter()
n = 0
while True:
    now = time.perf_counter() - start
    if now >= seconds:
        break
    due = int(now * rate)
    while n < due:
        with p:
            pass
        n += 1
    time.sleep(0.001)
print(n)
"""


def rss_mb(pid: int) -> float | None:
    """The resident set of ``pid`` in MB, or None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def wait_for(check, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.1)
    return False


class Recorder:
    """``gpuwatch record`` in a process of its own."""

    name = "headless recorder (gpuwatch record)"

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.out = tmp / f"rec-{uuid.uuid4().hex[:6]}.gpuwatch"
        self.sock = str(tmp / f"r{uuid.uuid4().hex[:6]}.sock")
        cmd = [sys.executable, "-m", "gpuwatch", "record", "--out", str(self.out)]
        self.proc = subprocess.Popen(
            [*cmd, "--socket", self.sock],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.pid = self.proc.pid

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=60)


class Dashboard:
    """The live dashboard, recording, in a private tmux server."""

    name = "live dashboard (gpuwatch --record, in tmux)"

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.out = tmp / f"dash-{uuid.uuid4().hex[:6]}.gpuwatch"
        self.sock = str(tmp / f"d{uuid.uuid4().hex[:6]}.sock")
        self.server = f"gw-bench-{uuid.uuid4().hex[:8]}"
        exports = " ".join(f"{k}={v!r}" for k, v in env.items() if k.startswith(("XDG_", "GPU")))
        command = (
            f"cd {str(ROOT)!r} && exec env -u COLUMNS -u LINES {exports} {sys.executable} "
            f"-m gpuwatch --record {str(self.out)!r} --socket {self.sock!r}"
        )
        self._tmux("new-session", "-d", "-s", "main", "-x", "200", "-y", "60", command)
        wait_for(lambda: self._tmux("list-panes", "-t", "main", "-F", "#{pane_pid}").strip(), 10)
        self.pid = int(self._tmux("list-panes", "-t", "main", "-F", "#{pane_pid}").split()[0])

    def _tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.server, "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            check=False,
        ).stdout

    def stop(self) -> None:
        self._tmux("send-keys", "-t", "main", "q")
        wait_for(lambda: rss_mb(self.pid) is None, 30)
        self._tmux("kill-server")


def run(kind: type, rate: float, seconds: float, tmp: Path) -> dict[str, float]:
    """Phases at ``rate`` for ``seconds`` into a fresh gpuwatch; its memory over them."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR"):
        path = tmp / name.lower()
        path.mkdir(exist_ok=True, mode=0o700)
        env[name] = str(path)
    target = kind(tmp, env)
    if not wait_for(lambda: os.path.exists(target.sock), 30):
        target.stop()
        raise RuntimeError(f"{target.name} did not open its socket")
    time.sleep(1.0)  # the samplers started
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(rate), str(seconds)],
        env={**env, "GPUWATCH_SOCKET": target.sock},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    start = time.monotonic()
    samples: list[tuple[float, float]] = []
    while client.poll() is None:
        now = time.monotonic() - start
        mb = rss_mb(target.pid)
        if mb is not None:
            samples.append((now, mb))
        time.sleep(0.5)
    sent = int((client.stdout.read() if client.stdout else "0").strip() or 0)
    time.sleep(1.5)  # the last datagrams and a commit
    end_mb = rss_mb(target.pid) or samples[-1][1]
    target.stop()
    base = next(mb for t, mb in samples if t >= SETTLE)
    peak = max(mb for t, mb in samples if t >= SETTLE)
    info = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "info", "--json", str(target.out)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    got = json.loads(info.stdout)
    recorded = sum(sum(p["phases"].values()) for p in got["processes"])
    return {
        "sent": sent,
        "recorded": recorded,
        "base": base,
        "growth": end_mb - base,
        "peak": peak - base,
        "rate": sent / seconds,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--rate", type=float, default=10_000.0, help="phases per second")
    ap.add_argument("--no-dashboard", action="store_true", help="measure the recorder only")
    args = ap.parse_args()
    kinds: list[type] = [Recorder]
    if not args.no_dashboard and shutil.which("tmux"):
        kinds.append(Dashboard)
    tmp = Path(tempfile.mkdtemp(prefix="gw-mem-", dir="/tmp"))
    results = []
    try:
        for kind in kinds:
            anchor = run(kind, args.rate / 10, args.seconds, tmp)
            full = run(kind, args.rate, args.seconds, tmp)
            results.append((kind.name, anchor, full))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("the machine may be shared: compare the ratios")
    ok_all = True
    for name, anchor, full in results:
        for label, r in (("anchor", anchor), ("measured", full)):
            print(
                f"{name}, {label}: {r['rate']:,.0f} phases/s sent, {r['recorded']:,} recorded; "
                f"RSS {r['base']:.0f} MB after {SETTLE:g} s, grew {r['growth']:+.1f} MB by the end "
                f"(peak {r['peak']:+.1f} MB)"
            )
        per_phase = full["growth"] * 2**20 / max(1, full["sent"])
        ratio = full["growth"] / anchor["growth"] if abs(anchor["growth"]) >= 0.5 else None
        ok = full["growth"] <= TARGET_MB and full["peak"] <= TARGET_MB
        ok_all &= ok
        ratio_text = (
            f"{ratio:.2f}x the anchor's growth at a tenth of the rate"
            if ratio is not None
            else f"the anchor grew {anchor['growth']:+.1f} MB (too little for a ratio)"
        )
        print(
            f"{'PASS' if ok else 'FAIL'}  {name}: {full['growth']:+.1f} MB over "
            f"{args.seconds:g} s at {full['rate']:,.0f} phases/s (peak {full['peak']:+.1f} MB; "
            f"{per_phase:+.1f} B per phase; target <= {TARGET_MB:g} MB); {ratio_text}"
        )
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
