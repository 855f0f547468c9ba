"""procstat's Reader against real processes: figures read again through a file kept open,
an ended process told apart (a zombie included), and its file closed."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest
from conftest import wait_for

from gpuwatch.sources import procstat

pytestmark = pytest.mark.skipif(not os.path.isfile("/proc/self/stat"), reason="Linux /proc")

# Prints its pid, then on each line it reads allocates 64 MiB and touches it, then says so.
GROWER = r"""
import sys
held = []
print("ready", flush=True)
for line in sys.stdin:
    held.append(bytearray(64 << 20))
    print("grown", flush=True)
"""


def _spawn() -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", GROWER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    return child


def test_a_kept_file_reads_the_figures_of_now() -> None:
    child = _spawn()
    reader = procstat.Reader()
    try:
        first = reader.read(child.pid)
        assert first is not None and len(reader) == 1
        proc = psutil.Process(child.pid)
        assert first.ppid == os.getpid()
        assert abs(first.rss - proc.memory_info().rss) < 1 << 20
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline() == "grown\n"
        again = reader.read(child.pid)
        assert len(reader) == 1  # the same file, read again in place
        assert again is not None and again.rss >= first.rss + (60 << 20)
        times = proc.cpu_times()
        assert abs(again.cpu - (times.user + times.system)) <= 0.02
    finally:
        child.kill()
        child.wait()
        reader.close()
    assert len(reader) == 0


def test_an_ended_process_reads_none_and_its_file_is_closed() -> None:
    child = _spawn()
    reader = procstat.Reader()
    assert reader.read(child.pid) is not None
    child.kill()
    # Not reaped yet: a zombie has ended too.
    assert wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE)
    assert reader.read(child.pid) is None
    assert len(reader) == 0
    child.wait()
    assert reader.read(child.pid) is None and len(reader) == 0


def test_keep_closes_the_files_of_the_others() -> None:
    reader = procstat.Reader()
    a, b = _spawn(), _spawn()
    try:
        assert reader.read(a.pid) is not None and reader.read(b.pid) is not None
        before = len(os.listdir("/proc/self/fd"))
        reader.keep({b.pid})
        assert len(reader) == 1
        assert len(os.listdir("/proc/self/fd")) == before - 1
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
        reader.close()


def test_past_its_limit_a_reader_still_reads_keeping_no_file() -> None:
    reader = procstat.Reader()
    reader.limit = 1
    a, b = _spawn(), _spawn()
    try:
        assert reader.read(a.pid) is not None
        st = reader.read(b.pid)
        assert st is not None and st.ppid == os.getpid()
        assert len(reader) == 1
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
        reader.close()


def test_a_command_name_with_spaces_and_parentheses_parses() -> None:
    line = b"123 (a) b) (c) S 7 1 1 0 -1 0 0 0 0 0 250 50 0 0 20 0 1 0 99 0 300 0\n"
    st = procstat._parse(line)
    assert st == procstat.Stat(cpu=300 / procstat._TICKS, rss=300 * procstat._PAGE, ppid=7)
    assert procstat._parse(line.replace(b" S 7 ", b" Z 7 ")) is None  # a zombie
    assert procstat._parse(b"123 (x) S 7") is None  # cut short
