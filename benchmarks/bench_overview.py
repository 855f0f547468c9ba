"""The dashboard's own CPU on 8 fake GPUs at the default 10 Hz, showing the overview (issue 38).

The live dashboard (NVML faked through gpuwatch's NVML module, everything else real: the
host sampler, the annotation socket, the GPU sampling process) follows the newest data
for ``--seconds`` at 80x24 and at 200x50, where 8 GPUs do not fit as panels and the first
screen is the overview. Measured: the CPU share of one core of the gpuwatch process (the
dashboard, its host sampler and receiver; the GPU sampling process is reported beside it),
and of the same process with the same sources and no dashboard; the dashboard's own CPU is
the difference.

Anchors, in the same run: the same dashboard from other commits, each checked out with
``git worktree add`` in a temporary directory and removed afterwards. The first
(``--anchor``, default ``dbe6553``) is the tree before the overview, which at these sizes
steps through the 8 panels (80x24) or scrolls them (200x50); ``--also`` adds more (an
earlier state of this work, to see what a change bought). Each round measures the sources
alone, then every tree at each size in turn, so that a machine whose load drifts weighs on
all alike; the medians of ``--rounds`` rounds are compared. Targets: the dashboard's own
CPU at most 2% of a core; the gpuwatch process at most 1.2x the first anchor's.

Run: python benchmarks/bench_overview.py [--seconds 15] [--rounds 2] [--anchor dbe6553]
     [--also a331cf5 ...]
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
                          'overview': shown, 'redraws': app.dashboard.redraws}))
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
    lines = out.stdout.strip().splitlines()
    if not lines or not lines[-1].startswith("{"):
        raise SystemExit(f"the dashboard from {tree} failed:\n{out.stderr[-3000:]}")
    if out.returncode != 0:  # measured, then failed on closing: the figures stand
        said = out.stderr.strip().splitlines()
        print(f"  (the dashboard from {tree} failed on closing: {said[-1] if said else '?'})")
    return json.loads(lines[-1])


def checkout(commit: str, into: Path) -> Path | None:
    """A worktree of ``commit`` under ``into``; None (and a line said) if it cannot be made."""
    tree = into / commit
    made = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        print(f"bench_overview: cannot check out {commit}: {made.stderr.strip()}", file=sys.stderr)
        return None
    return tree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds measured per run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each tree, alternated")
    parser.add_argument("--anchor", default="dbe6553", help="the commit before the overview")
    parser.add_argument(
        "--also", action="append", default=[], metavar="COMMIT", help="another tree to compare"
    )
    args = parser.parse_args()
    if args.seconds <= 0 or args.rounds < 1:
        print("bench_overview: --seconds must be > 0 and --rounds >= 1", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="gpuwatch-anchor-"))
    trees: dict[str, Path] = {}
    failed = False
    try:
        for commit in [args.anchor, *args.also]:
            tree = checkout(commit, tmp)
            if tree is None:
                return 2
            trees[commit] = tree
        trees["this tree"] = ROOT
        print(
            f"Dashboard on 8 fake GPUs at 10 Hz, following live, {args.seconds:.0f} s a run, "
            f"{args.rounds} runs a tree (machine shared: compare the ratio, not the figures)"
        )
        alone_runs: list[float] = []
        runs = {size: {name: [] for name in trees} for size in SIZES}
        for _ in range(args.rounds):
            alone_runs.append(measure(ROOT, args.seconds, (0, 0))["own"])
            for size in SIZES:
                for name, tree in trees.items():
                    runs[size][name].append(measure(tree, args.seconds, size))
        alone = statistics.median(alone_runs)
        print(f"  the sources without a dashboard: {alone * 100:.2f}% of a core")
        for size in SIZES:
            own = {k: statistics.median(r["own"] for r in v) for k, v in runs[size].items()}
            sampler = {k: statistics.median(r["sampler"] for r in v) for k, v in runs[size].items()}
            shown = runs[size]["this tree"][0]["overview"]
            print(f"  {size[0]}x{size[1]} (overview shown: {shown})")
            for k in trees:
                each = ", ".join(f"{r['own'] * 100:.2f}" for r in runs[size][k])
                print(
                    f"    {k:9s}: gpuwatch {own[k] * 100:.2f}% of a core (runs: {each}), "
                    f"its dashboard {(own[k] - alone) * 100:.2f}%; GPU sampling process "
                    f"{sampler[k] * 100:.2f}%"
                )
            dashboard = own["this tree"] - alone
            ratios = {
                k: own["this tree"] / own[k] if own[k] > 0 else float("inf")
                for k in trees
                if k != "this tree"
            }
            ok_abs = dashboard <= 0.02
            ok_ratio = ratios[args.anchor] <= 1.2
            failed |= not (ok_abs and ok_ratio)
            print(
                f"    the dashboard's own (the process less the sources alone): "
                f"{dashboard * 100:.2f}%; the process against "
                + ", ".join(f"{k}: x{v:.2f}" for k, v in ratios.items())
            )
            print(
                f"    target <= 2% of a core: {'PASS' if ok_abs else 'FAIL'} "
                f"({dashboard * 100:.2f}%); target <= 1.2x {args.anchor}: "
                f"{'PASS' if ok_ratio else 'FAIL'} (ratio {ratios[args.anchor]:.2f})"
            )
    finally:
        for tree in trees.values():
            if tree != ROOT:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                    capture_output=True,
                )
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True)
        tmp.rmdir() if tmp.exists() and not any(tmp.iterdir()) else None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
