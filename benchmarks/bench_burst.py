"""A burst of events into the live dashboard: does the receiver keep up?

A script sends ``--rate`` events a second (phase begin/end pairs through the real client)
for ``--seconds`` into a gpuwatch process, which is either

- the anchor: headless, as ``gpuwatch record`` runs (sources + recorder, no dashboard), or
- the live dashboard (the real app, headless terminal 200x60) with 8 fake GPUs sampled
  at 100 Hz and the recorder on, as ``gpuwatch`` runs.

Each run prints what the script sent, what the session received, and what was lost on
the way: dropped by the client (its queue, or a receiver whose socket queue stayed full
past the client's wait budget), lost in transit (sequence gaps) and rejected; and how
long after the sender's end the session still received (a backlog it worked through).
Target: no event dropped or lost at 20k events/s with the dashboard open.

Run: python benchmarks/bench_burst.py [--rate 20000] [--seconds 30]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SENDER = """
import json, sys, time
import gpuwatch
from gpuwatch.instrument import _api

rate, seconds = float(sys.argv[1]), float(sys.argv[2])
time.sleep(1.0)  # let the receiver greet us and the dashboard settle
pairs, start = 0, time.monotonic()
while True:
    elapsed = time.monotonic() - start
    if elapsed >= seconds:
        break
    due = int(elapsed * rate / 2)  # a pair is two events
    while pairs < due:
        with gpuwatch.phase("step"):
            pass
        pairs += 1
    time.sleep(0.0005)
time.sleep(0.5)
gpuwatch.flush()
client = _api._state.client
print(json.dumps({"pairs": pairs, "dropped": client.dropped, "sent": client.sent,
                  "seconds": time.monotonic() - start}))
"""

HOST = """
import asyncio, json, os, subprocess, sys, tempfile, time
from gpuwatch.live_sources import LiveSources

mode, rate, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
d = tempfile.mkdtemp(prefix="gw-", dir="/tmp"); os.chmod(d, 0o700)
src = LiveSources(socket=d + "/gw.sock", interval=0.01)
src.record_to(d + "/burst.gpuwatch")
src.start()
if mode == "dashboard":
    deadline = time.monotonic() + 10
    while len(src.session.gpu) < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
env = {**os.environ, "GPUWATCH_SOCKET": src.socket_path}
sender = subprocess.Popen([sys.executable, "-c", sys.argv[4], rate, str(seconds)],
                          env=env, stdout=subprocess.PIPE, text=True)

def mine():
    procs = [p for p in src.session.processes.values() if p.pid == sender.pid]
    return procs[0] if procs else None

def finish():
    out = json.loads(sender.communicate(timeout=seconds + 60)[0])
    # The receiver may still work through a backlog when the sender ends: wait for every
    # pair, or for a second without one more (what is missing then is lost).
    end = time.monotonic()
    count, moved = -1, end
    while time.monotonic() - end < 30:
        proc = mine()
        n = len(proc.phases) if proc else 0
        if n >= out["pairs"]:
            break
        if n != count:
            count, moved = n, time.monotonic()
        elif time.monotonic() - moved > 1.0:
            break
        time.sleep(0.05)
    out["drain"] = time.monotonic() - end
    proc = mine()
    out.update(
        received=len(proc.phases) if proc else 0,
        reported_dropped=proc.dropped if proc else None,
        gaps=proc.gaps if proc else None,
        rejected=sum(src.session.rejects.values()),
        gpus=len(src.session.gpu),
    )
    return out

if mode == "dashboard":
    from gpuwatch.tui.app import GpuwatchApp

    app = GpuwatchApp(src.session, subtitle=src.describe)

    async def main():
        async with app.run_test(size=(200, 60)) as pilot:
            result = await asyncio.get_running_loop().run_in_executor(None, finish)
            await pilot.pause()
            return result

    result = asyncio.run(main())
else:
    result = finish()
src.stop()
print(json.dumps(result))
"""


def run(mode: str, rate: int, seconds: float) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "GPUWATCH_NVML_BACKEND": "tests.fake_nvml",
        "GPUWATCH_FAKE_NVML": json.dumps({"gpus": 8 if mode == "dashboard" else 0}),
        "XDG_DATA_HOME": tempfile.mkdtemp(),
    }
    out = subprocess.run(
        [sys.executable, "-c", HOST, mode, str(rate), str(seconds), SENDER],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=seconds + 180,
    )
    if out.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=20_000, help="events per second (default 20000)")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of the burst")
    args = ap.parse_args()
    print(f"{args.rate} events/s for {args.seconds:.0f} s (phase begin/end pairs)")
    results = {}
    for mode in ("headless", "dashboard"):
        r = run(mode, args.rate, args.seconds)
        results[mode] = r
        events = 2 * r["pairs"]
        lost = r["dropped"] + (r["gaps"] or 0) + r["rejected"]
        print(
            f"  {mode:9}: sent {events} events ({events / r['seconds']:.0f}/s), received "
            f"{2 * r['received']}, dropped {r['dropped']} "
            f"({100 * r['dropped'] / max(events, 1):.2f}%), "
            f"lost in transit {r['gaps']}, rejected {r['rejected']}, lost in all {lost}; "
            f"the last received {r['drain']:.2f} s after the sender's end"
        )
    anchor = results["headless"]
    dash = results["dashboard"]
    ok = dash["dropped"] == 0 and not dash["gaps"] and dash["received"] == dash["pairs"]
    ratio = (2 * dash["received"]) / max(2 * anchor["received"], 1)
    print(f"dashboard received {ratio:.3f}x what the headless anchor received")
    print(
        f"target: 0 dropped at {args.rate} events/s with the dashboard open: "
        f"{'PASS' if ok else 'FAIL'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
