"""Reading a recording of a sweep of short processes: ``info`` and replay (issue 23, item 6).

A sweep of 5,000 short instrumented scripts under one ``record`` gave a file whose
``info`` peaked at ~194 MB (29 KB a process): the loader read every series' chunk index
into arrays of its own, and replay's first frame read a chunk of every process. The
recordings here are written by the real writer from a real Session fed each script's
messages (tests/support/sweep.py: a hello, a mark, 20 phases with peaks, 20 RSS samples,
a bye), then read by fresh interpreters:

- ``gpuwatch info FILE`` and ``gpuwatch info --json FILE``: seconds and peak RSS (VmHWM);
- replay: ``open_replay`` and the real ``replay_app`` headless, until its first frame is
  drawn: seconds from the interpreter's start and from the open, peak RSS, chunks read.

The anchor, measured in the same run: the same on a sweep of 50 processes. Reported per
process: (figure of the sweep - anchor's) / (processes - 50). PASS: ``info`` grows by at
most 20 KB a process (before: 32 KB), and replay's first frame by at most 0.5 ms a process
(5,000: 2.5 s over the anchor's) and reads at most 30 chunks. The first frame still FAILs:
the host's chart draws an RSS line a process, each read from its chunk (see the README).

``--root DIR`` reads with another checkout's gpuwatch (say the one before a change: ``git
archive main | tar -x -C DIR``), on the same files, so before and after are one run.

Run: python benchmarks/bench_sweep_reading.py [--processes 5000] [--root DIR ...]
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
sys.path.insert(0, str(ROOT / "tests" / "support"))

from sweep import write_sweep  # noqa: E402

ANCHOR = 50
INFO_KB = 20.0  # per process
FIRST_MS = 0.5  # per process
FIRST_CHUNKS = 30

COMMAND = r"""
import runpy, sys, time
sys.path.insert(0, {root!r})
sys.argv = ["gpuwatch", *sys.argv[1:]]
start = time.perf_counter()
try:
    runpy.run_module("gpuwatch", run_name="__main__")
except SystemExit:
    pass
seconds = time.perf_counter() - start
mb = next(
    int(line.split()[1]) / 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:")
)
print(f"FIGURES {{seconds}} {{mb}}", file=sys.stderr)
"""

REPLAY = r"""
import time
START = time.perf_counter()
import asyncio, json, os, sys
sys.path.insert(0, {root!r})
from gpuwatch.store.player import open_replay
from gpuwatch.tui.replay import replay_app

def mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

async def main():
    t = time.perf_counter()
    player = open_replay({path!r})
    out = {{"open": time.perf_counter() - t}}
    app = replay_app(player, subtitle="bench")
    async with app.run_test(size=(160, 50)) as pilot:
        while app.dashboard.redraws < 1:
            await pilot.pause()
        await pilot.pause()
        out["first"] = time.perf_counter() - START
        out["first_open"] = time.perf_counter() - t
        out["mb"] = mb()
        out["chunks"] = player.loader.source.decoded
    print("FIGURES", json.dumps(out), flush=True)
    os._exit(0)  # skip teardown: only the figures matter here

asyncio.run(main())
"""


def info(root: Path, path: Path, *flags: str) -> tuple[float, float]:
    """(seconds, peak RSS in MB) of ``gpuwatch info [flags] FILE`` in a fresh interpreter."""
    code = COMMAND.format(root=str(root))
    out = subprocess.run(
        [sys.executable, "-c", code, "info", *flags, str(path)],
        capture_output=True,
        text=True,
        cwd=root,
    )
    for line in out.stderr.splitlines():
        if line.startswith("FIGURES "):
            seconds, mb = line.split()[1:]
            return float(seconds), float(mb)
    raise RuntimeError(f"info {path} failed:\n{out.stderr}")


def replay(root: Path, path: Path) -> dict[str, float]:
    """Replay's open and first frame, from a fresh interpreter."""
    code = REPLAY.format(root=str(root), path=str(path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    for line in out.stdout.splitlines():
        if line.startswith("FIGURES "):
            return json.loads(line.split(" ", 1)[1])
    raise RuntimeError(f"replay {path} failed:\n{out.stderr}")


def measure(root: Path, path: Path) -> dict[str, float]:
    text_s, text_mb = info(root, path)
    json_s, json_mb = info(root, path, "--json")
    r = replay(root, path)
    return {
        "info_s": text_s,
        "info_mb": text_mb,
        "json_s": json_s,
        "json_mb": json_mb,
        "first_s": r["first"],
        "first_open_s": r["first_open"],
        "open_s": r["open"],
        "replay_mb": r["mb"],
        "chunks": r["chunks"],
    }


def report(name: str, big: dict[str, float], small: dict[str, float], n: int) -> bool:
    per = n - ANCHOR

    def kb(key: str) -> float:
        return (big[key] - small[key]) * 1024 / per

    def ms(key: str) -> float:
        return (big[key] - small[key]) * 1000 / per

    print(f"{name}:")
    commands = (("info", "info_s", "info_mb"), ("info --json", "json_s", "json_mb"))
    for label, s_key, mb_key in commands:
        print(
            f"  {label:<12} {big[s_key]:6.2f} s, peak {big[mb_key]:6.1f} MB (anchor "
            f"{small[s_key]:.2f} s, {small[mb_key]:.1f} MB): {kb(mb_key):5.1f} KB and "
            f"{ms(s_key):.2f} ms a process"
        )
    print(
        f"  replay       first frame {big['first_s']:.2f} s from start, {big['first_open_s']:.2f} s"
        f" from the open (open {big['open_s']:.2f} s), peak {big['replay_mb']:.1f} MB, "
        f"{big['chunks']:.0f} chunks read (anchor {small['first_s']:.2f} s, "
        f"{small['replay_mb']:.1f} MB, {small['chunks']:.0f}): {kb('replay_mb'):.1f} KB and "
        f"{ms('first_s'):.2f} ms a process"
    )
    ok_info = max(kb("info_mb"), kb("json_mb")) <= INFO_KB
    ok_first = ms("first_s") <= FIRST_MS and big["chunks"] <= FIRST_CHUNKS
    print(
        f"  {'PASS' if ok_info else 'FAIL'} info <= {INFO_KB:g} KB a process; "
        f"{'PASS' if ok_first else 'FAIL'} first frame <= {FIRST_MS:g} ms a process and "
        f"<= {FIRST_CHUNKS} chunks"
    )
    return ok_info and ok_first


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=5000, help="processes in the sweep")
    ap.add_argument(
        "--root",
        action="append",
        default=[],
        help="another checkout to read with too (repeatable; this one always runs)",
    )
    args = ap.parse_args()
    if args.processes <= ANCHOR:
        print(f"--processes must be above {ANCHOR}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="gw-sweep-", dir="/tmp"))
    try:
        small = write_sweep(tmp / "anchor.gpuwatch", ANCHOR)
        big = write_sweep(tmp / "sweep.gpuwatch", args.processes)
        print(
            f"sweep of {args.processes} processes ({big.stat().st_size / 1e6:.1f} MB), anchor "
            f"of {ANCHOR}; same files, same run"
        )
        ok = True
        for root in [Path(r).resolve() for r in args.root] + [ROOT]:
            name = "this checkout" if root == ROOT else str(root)
            ok &= report(name, measure(root, big), measure(root, small), args.processes) or (
                root != ROOT
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
