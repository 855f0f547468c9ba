"""Merged replay at scale: several long recordings opened as one session.

``gpuwatch replay A B ...`` (and ``info`` / ``export`` of several files) validates every
file (each chunk inflated once, nothing kept), opens each windowed (views read what they
show from the files) and merges them on one clock. Each measurement runs in a fresh
interpreter, as the command line does: open and merge (``load_many``), then the replay
dashboard headless to its first frame and ten seeks to random times; its peak RSS is its
own.

Cases, with the recordings of benchmarks/longrun.py (8 GPUs x 10 Hz, 8 processes; the
other files are copies, so origins are the file names and the clocks coincide):

- anchor, in the same run: one 24 h recording;
- 4 hosts x 8 GPUs x 24 h merged: target (issue 16) peak RSS at most 2 GB (before: two
  such files took 10.6 s and 2.1 GB);
- 2 hosts x 8 GPUs x 7 days merged: the long case, same target.

The machine this runs on may be shared: compare the ratios to the anchor.

Run: python benchmarks/bench_merge.py [--day FILE] [--week FILE] [--hosts 4] [--no-week]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

TARGET_MB = 2048

CHILD = r"""
import asyncio, json, os, random, sys, time
from gpuwatch.store.multi import load_many
from gpuwatch.store.player import Player
from gpuwatch.tui.replay import replay_app

def peak_mb():
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec, so a child would report
    # the RSS of the benchmark process it was forked from.
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024


async def main():
    t = time.perf_counter()
    opened = load_many(sys.argv[1:])
    opened.close()  # as the command line does: the session reads through its own
    out = {"load": time.perf_counter() - t}
    s = opened.session
    player = Player(s, playing=False)
    app = replay_app(player, subtitle="bench")
    t = time.perf_counter()
    async with app.run_test(size=(200, 60)) as pilot:
        while app.dashboard.redraws < 1:
            await pilot.pause()
        await pilot.pause()
        out["first"] = time.perf_counter() - t
        first, last = player.bounds()
        rng = random.Random(1)
        worst = 0.0
        for _ in range(10):
            target = rng.randrange(first, last)
            t = time.perf_counter()
            player.seek(target)
            app.view.span = 300 * 10**9
            app.view.jump(target, last)
            app.dashboard.redraw()
            await pilot.pause()
            worst = max(worst, time.perf_counter() - t)
        out["seek_max"] = worst
    out.update(
        rss_mb=peak_mb(),
        devices=len(s.devices),
        processes=len(s.processes),
        samples=sum(len(t) for t in s.gpu.values()),
    )
    print(json.dumps(out), flush=True)
    os._exit(0)

asyncio.run(main())
"""


def measure(paths: list[Path]) -> dict[str, float]:
    """Open (and merge) ``paths`` in a fresh interpreter; its figures."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, *map(str, paths)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def copies(first: Path, n: int, tmp: Path, stem: str) -> list[Path]:
    paths = [first]
    for i in range(1, n):
        paths.append(tmp / f"{stem}{i}.gpuwatch")
        shutil.copyfile(first, paths[-1])
    return paths


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--day", metavar="FILE", help="a 24 h recording (else generated)")
    ap.add_argument("--week", metavar="FILE", help="a 7-day recording (else generated)")
    ap.add_argument("--hosts", type=int, default=4, help="hosts of the 24 h case")
    ap.add_argument("--no-week", action="store_true", help="skip the 7-day case")
    args = ap.parse_args()
    from longrun import write_recording

    tmp = Path(tempfile.mkdtemp(prefix="gw-merge-"))
    try:
        day = Path(args.day) if args.day else tmp / "day0.gpuwatch"
        if not args.day:
            print("generating 24 h x 8 GPUs x 10 Hz ...", flush=True)
            write_recording(day, 24)
        cases = [("anchor: one 24 h recording", [day])]
        cases.append((f"{args.hosts} hosts x 24 h merged", copies(day, args.hosts, tmp, "day")))
        if not args.no_week:
            week = Path(args.week) if args.week else tmp / "week0.gpuwatch"
            if not args.week:
                print("generating 7 days x 8 GPUs x 10 Hz (a few minutes) ...", flush=True)
                t = time.perf_counter()
                write_recording(week, 168)
                print(f"  {time.perf_counter() - t:.0f} s", flush=True)
            cases.append(("2 hosts x 7 days merged", copies(week, 2, tmp, "week")))
        results = [
            (name, sum(p.stat().st_size for p in paths), measure(paths)) for name, paths in cases
        ]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    anchor = results[0][2]
    ok_all = True
    print("the machine may be shared: compare the ratios to the anchor")
    for i, (name, size, r) in enumerate(results):
        text = (
            f"{name}: {r['devices']} devices, {r['processes']} processes, "
            f"{r['samples']:,} NVML samples, {size / 1e9:.1f} GB; "
            f"open, validate and merge {r['load']:.1f} s, first frame {r['first']:.2f} s, "
            f"worst seek {r['seek_max'] * 1000:.0f} ms painted, peak RSS {r['rss_mb']:.0f} MB"
        )
        if i == 0:
            print(text)
            continue
        ok = r["rss_mb"] <= TARGET_MB
        ok_all &= ok
        print(
            f"{'PASS' if ok else 'FAIL'}  {text} (target <= {TARGET_MB} MB); "
            f"{r['rss_mb'] / anchor['rss_mb']:.2f}x the anchor's memory, "
            f"{r['load'] / anchor['load']:.2f}x its opening time"
        )
    return 0 if ok_all else 1


if __name__ == "__main__":
    raise SystemExit(main())
