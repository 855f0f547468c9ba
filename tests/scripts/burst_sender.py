"""A sender for the counting tests: marks at a steady rate, then what its client counted.

Usage: ``burst_sender.py REPORT RATE SECONDS``. Creates ``REPORT.started`` once its first
mark is queued (so a test can pause gpuwatch while the burst runs), sends RATE marks a
second for SECONDS, exits, and writes REPORT (JSON) after its client's goodbye: its pid,
the marks it made, and the client's own counts.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time

import gpuwatch
from gpuwatch.instrument import _api

report, rate, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
client = _api._state.client
made = 0


def _report() -> None:
    counts = {
        "pid": os.getpid(),
        "marks": made,
        "sent": client.sent,
        "dropped": client.dropped,
        "queue_dropped": client.queue_dropped,
        "send_dropped": client.send_dropped,
    }
    with open(report + ".tmp", "w") as f:
        json.dump(counts, f)
    os.replace(report + ".tmp", report)


# Registered before the client's own (at its first event): runs after its goodbye.
atexit.register(_report)
gpuwatch.mark("m0")
made = 1
open(report + ".started", "w").close()
start = time.monotonic()
while (now := time.monotonic()) < start + seconds:
    due = min(int((now - start) * rate), int(rate * seconds))
    while made <= due:
        gpuwatch.mark(f"m{made}")
        made += 1
    time.sleep(0.001)
