"""The dashboard's own CPU on 8 fake GPUs at the default 10 Hz, showing the overview (issue 38).

The live dashboard (NVML faked through gpuwatch's NVML module, everything else real: the
host sampler, the annotation socket, the GPU sampling process) follows the newest data
for ``--seconds`` at 80x24 and at 200x50, where 8 GPUs do not fit as panels and the first
screen is the overview. Measured: the CPU share of one core of the gpuwatch process (the
dashboard, its host sampler and receiver; the GPU sampling process is reported beside it),
and of the same process with the same sources and no dashboard; the dashboard's own CPU is
the difference.

Anchor, in the same run: the same dashboard from the tree before the overview (a commit,
default ``dbe6553``, checked out with ``git worktree add`` in a temporary directory and
removed afterwards), which at these sizes steps through the 8 panels (80x24) or scrolls
them (200x50). The two trees run alternately, ``--rounds`` times each; the medians are
compared. Targets: the dashboard's own CPU at most 2% of a core; the gpuwatch process at
most 1.2x the anchor's.

Run: python benchmarks/bench_overview.py [--seconds 15] [--rounds 2] [--anchor dbe6553]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = {"gpus": 8, "trace": "training"}
SIZES = ((80, 24), (200, 50))

CHILD = """
import asyncio, json, os, resource, sys, tempfile, time
from gpuwatch.live_sources import LiveSources
from gpuwatch.tui.app import GpuwatchApp
seconds, width, height = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
alone = width == 0  # the sources without the dashboard
d = tempfile.mkdtemp(); os.chmod(d, 0o700)
src = LiveSources(socket=d + '/gw.sock', interval=0.1); src.start()
deadline = time.monotonic() + 20
while len(src.session.gpu) < 8 and time.monotonic() < deadline: time.sleep(0.05)
assert len(src.session.gpu) == 8, src.session.notes
app = GpuwatchApp(src.session)
helper = src.gpu.child.pid if getattr(src.gpu, 'child', None) is not None else None
def own():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
def other():
    if helper is None: return 0.0
    f = open(f'/proc/{helper}/stat').read().rsplit(')', 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf('SC_CLK_TCK')
async def main():
    async with app.run_test(size=(width, height)) as pilot:
        await pilot.pause(2)
        c0, h0, w0 = own(), other(), time.monotonic()
        await asyncio.sleep(seconds)
        c1, h1, w1 = own(), other(), time.monotonic()
        shown = getattr(app, 'overview_shown', None)
        print(json.dumps({'own': (c1 - c0) / (w1 - w0), 'sampler': (h1 - h0) / (w1 - w0),
                          'overview': shown, 'redraws': app.redraws}))
if alone:
    time.sleep(2); c0, h0, w0 = own(), other(), time.monotonic(); time.sleep(seconds)
    c1, h1, w1 = own(), other(), time.monotonic()
    print(json.dumps({'own': (c1 - c0) / (w1 - w0), 'sampler': (h1 - h0) / (w1 - w0)}))
else:
    asyncio.run(main())
src.stop()
"""


def measure(tree: Path, seconds: float, size: tuple[int, int]) -> dict:
    """One run of the dashboard from ``tree``: its CPU shares of one core."""
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "GPUWATCH_NVML_BACKEND": "tests.fake_nvml",
        "GPUWATCH_FAKE_NVML": json.dumps(SPEC),
    }
    env.pop("GPUWATCH_DISABLE", None)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(seconds), str(size[0]), str(size[1])],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=seconds + 120,
    )
    if out.returncode != 0:
        raise SystemExit(f"the dashboard from {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds measured per run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each tree, alternated")
    parser.add_argument("--anchor", default="dbe6553", help="the commit before the overview")
    args = parser.parse_args()
    if args.seconds <= 0 or args.rounds < 1:
        print("bench_overview: --seconds must be > 0 and --rounds >= 1", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="gpuwatch-anchor-"))
    anchor = tmp / "tree"
    made = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(anchor), args.anchor],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        print(f"bench_overview: cannot check out {args.anchor}: {made.stderr.strip()}")
        return 2
    failed = False
    try:
        print(
            f"Dashboard on 8 fake GPUs at 10 Hz, following live, {args.seconds:.0f} s a run, "
            f"{args.rounds} runs a tree (machine shared: compare the ratio, not the figures)"
        )
        alone = statistics.median(
            measure(ROOT, args.seconds, (0, 0))["own"] for _ in range(args.rounds)
        )
        print(f"  the sources without a dashboard: {alone * 100:.2f}% of a core")
        for size in SIZES:
            runs: dict[str, list[dict]] = {"anchor": [], "overview": []}
            for _ in range(args.rounds):
                runs["anchor"].append(measure(anchor, args.seconds, size))
                runs["overview"].append(measure(ROOT, args.seconds, size))
            own = {k: statistics.median(r["own"] for r in v) for k, v in runs.items()}
            sampler = {k: statistics.median(r["sampler"] for r in v) for k, v in runs.items()}
            shown = runs["overview"][0]["overview"]
            ratio = own["overview"] / own["anchor"] if own["anchor"] > 0 else float("inf")
            dashboard = own["overview"] - alone
            ok_abs = dashboard <= 0.02
            ok_ratio = ratio <= 1.2
            failed |= not (ok_abs and ok_ratio)
            print(f"  {size[0]}x{size[1]} (overview shown: {shown})")
            for k in ("anchor", "overview"):
                each = ", ".join(f"{r['own'] * 100:.2f}" for r in runs[k])
                print(
                    f"    {k:9s} ({args.anchor if k == 'anchor' else 'this tree'}): gpuwatch "
                    f"{own[k] * 100:.2f}% of a core (runs: {each}); GPU sampling process "
                    f"{sampler[k] * 100:.2f}%"
                )
            print(
                f"    the dashboard's own (the process less the sources alone): "
                f"{dashboard * 100:.2f}% (anchor's: {(own['anchor'] - alone) * 100:.2f}%)"
            )
            print(
                f"    target <= 2% of a core: {'PASS' if ok_abs else 'FAIL'} "
                f"({dashboard * 100:.2f}%); target <= 1.2x the anchor: "
                f"{'PASS' if ok_ratio else 'FAIL'} (ratio {ratio:.2f})"
            )
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(anchor)],
            capture_output=True,
        )
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True)
        tmp.rmdir() if tmp.exists() and not any(tmp.iterdir()) else None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
