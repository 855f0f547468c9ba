"""A launcher with two workers (as torchrun starts them), for the Processes tests' trees
and signals, and a liveness check that counts a zombie as gone."""

from __future__ import annotations

LAUNCHER = """
import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(2)]
print(" ".join(str(k.pid) for k in kids), flush=True)
try:
    time.sleep(600)
finally:
    for k in kids:
        k.kill()
"""
"""Run with ``python -c``: prints its two workers' pids on one line, then sleeps."""


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
