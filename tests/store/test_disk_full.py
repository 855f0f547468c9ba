"""A recording whose disk fills: the command runs on to its own end, untouched.

``gpuwatch record --out FILE -- COMMAND`` writes FILE on a small tmpfs while COMMAND sends
more than fits. The recording must stop with one line that names the cause, the command
must finish every iteration and exit with its own status (which becomes gpuwatch's), and
the partial file must open.

The tmpfs is mounted in a private mount namespace (``unshare --user --map-root-user
--mount``), which works as root and, where the kernel allows user namespaces, as anyone;
the test is skipped, with the reason, where neither works.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, record_cmd, run_gpuwatch

CHILD = """
import sys, time
import gpuwatch

# A few marks first, and time for the recorder's commit (1 s) before the flood: what was
# committed before the disk filled must open. (Sent in the same breath as the flood, on a
# busy machine, they once all waited for one commit that did not fit.)
with gpuwatch.phase("warm-up"):
    for _ in range(5):
        gpuwatch.mark("before the flood")
time.sleep(2.5)
done = 0
for i in range(60):  # ~6 s, ~1.2 MB of marks: more than the disk holds
    with gpuwatch.phase("forward"):
        for _ in range(20):
            gpuwatch.mark("x" * 1000)
    time.sleep(0.1)
    done += 1
open(sys.argv[1], "w").write(str(done))
sys.exit(3)
"""


def _namespace_works(tmp: Path) -> str | None:
    """None when a tmpfs can be mounted in a private namespace here, else why not."""
    if shutil.which("unshare") is None:
        return "unshare is not installed"
    probe = tmp / "probe"
    probe.mkdir()
    result = subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--mount",
            "sh",
            "-c",
            f"mount -t tmpfs -o size=64k tmpfs {shlex.quote(str(probe))}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if result.returncode != 0:
        return f"cannot mount a tmpfs in a private namespace: {result.stderr.strip()}"
    return None


def test_disk_full_stops_the_recording_not_the_command(tmp_path: Path, sock_path: str) -> None:
    why = _namespace_works(tmp_path)
    if why is not None:
        pytest.skip(why)
    disk = tmp_path / "disk"
    disk.mkdir()
    saved = tmp_path / "saved"
    saved.mkdir()
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    finished = tmp_path / "finished"
    status = tmp_path / "status"
    out = disk / "run.gpuwatch"
    gpuwatch = [
        *record_cmd(str(out), sock_path),
        "--",
        sys.executable,
        str(child),
        str(finished),
    ]
    # Inside the namespace: mount, record, keep gpuwatch's status and a copy of what the
    # full disk holds (the tmpfs goes with the namespace).
    script = (
        f"mount -t tmpfs -o size=512k tmpfs {shlex.quote(str(disk))} || exit 99; "
        f"{shlex.join(gpuwatch)}; echo $? > {shlex.quote(str(status))}; "
        f"cp -a {shlex.quote(str(disk))}/. {shlex.quote(str(saved))}/"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GPUWATCH_SOCKET", None)
    result = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=ROOT,
    )
    assert status.exists(), result.stderr
    assert int(status.read_text()) == 3, result.stderr  # the command's own status
    assert finished.read_text() == "60"  # every iteration ran: nothing interrupted it
    stopped = [line for line in result.stderr.splitlines() if "recording stopped" in line]
    assert len(stopped) == 1, result.stderr
    assert "disk full" in stopped[0]
    assert "Traceback" not in result.stderr
    assert "cannot rollback" not in result.stderr
    assert "exited with status 3" in result.stderr
    # What was committed before the disk filled opens, marked as interrupted.
    info = run_gpuwatch("info", "--json", str(saved / "run.gpuwatch"))
    assert info.returncode == 0, info.stderr
    assert '"complete": false' in info.stdout
    assert '"marks": 0' not in info.stdout
