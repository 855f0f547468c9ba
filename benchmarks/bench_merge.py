"""Merged replay at scale: loading several day-long recordings as one session.

``gpuwatch replay A B`` (and ``info`` / ``export`` of several files) loads every file whole
and merges them on one clock. The anchor is loading one file whole, measured in the same
run: merging N files should cost about N anchors in time and memory (the merge shifts the
loaded tables in place; it does not copy them). Each measurement runs in a fresh
interpreter, so its peak RSS is its own.

The recording is the one of ``bench_recording.py`` (24 h x 8 GPUs x 10 Hz, 8 processes),
generated unless ``--file`` names one; the other files are copies of it (the same host:
origins are the file names, the clocks coincide).

Run: python benchmarks/bench_merge.py [--hours 24] [--file FILE] [--files 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = """
import json, resource, sys, time
from gpuwatch.store.multi import load_many
t = time.perf_counter()
opened = load_many(sys.argv[1:])
wall = time.perf_counter() - t
s = opened.session
print(json.dumps({
    "seconds": wall,
    "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3,
    "devices": len(s.devices),
    "processes": len(s.processes),
    "samples": sum(len(t) for t in s.gpu.values()),
}))
"""


def measure(paths: list[Path]) -> dict[str, float]:
    """Load (and merge) ``paths`` in a fresh interpreter; its time and peak RSS."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, *map(str, paths)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--file", metavar="FILE", help="use this recording (bench_recording --keep)")
    ap.add_argument("--files", type=int, default=2, help="how many files to merge")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gw-merge-"))
    try:
        if args.file:
            first = Path(args.file)
        else:
            from bench_recording import generate

            from gpuwatch.store import save_session

            first = tmp / "node0.gpuwatch"
            print(f"generating {args.hours:g} h x 8 GPUs x 10 Hz ...", flush=True)
            save_session(generate(args.hours), first)
        paths = [first]
        for i in range(1, args.files):
            paths.append(tmp / f"node{i}.gpuwatch")
            shutil.copyfile(first, paths[-1])
        one = measure(paths[:1])
        many = measure(paths)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = args.files
    print(
        f"anchor, one file loaded whole: {one['seconds']:.2f} s, peak RSS {one['rss_mb']:.0f} MB"
        f" ({one['samples']:,} NVML samples)"
    )
    print(
        f"{n} files merged: {many['seconds']:.2f} s, peak RSS {many['rss_mb']:.0f} MB, "
        f"{many['devices']} devices, {many['processes']} processes"
    )
    time_ratio = many["seconds"] / one["seconds"]
    rss_ratio = many["rss_mb"] / one["rss_mb"]
    print(f"ratio to {n} x the anchor: time {time_ratio / n:.2f}, memory {rss_ratio / n:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
