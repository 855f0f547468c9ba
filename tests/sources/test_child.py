"""The child-process helper (gpuwatch.sources.child): start, frames, lifeline, reap.

Real processes on real pipes; the relay is the bare child under test where one is needed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from gpuwatch.sources import child
from gpuwatch.sources.child import FRAME, READY, Child


def test_a_bare_child_runs_without_site_or_the_training_side_client() -> None:
    # The relay must start as fast as an interpreter can and run nothing of the user's: the
    # boot gives it the package's modules without site and without gpuwatch's __init__.
    spec = {"module": "gpuwatch.sources.relay", "bare": True, "package": child._PACKAGE}
    boot = child._BOOT.rsplit("sys.exit(", 1)[0] + (
        "importlib.import_module(spec['module'])\n"
        "print(json.dumps([sorted(m for m in sys.modules if m.startswith('gpuwatch')),"
        " 'site' in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", boot, json.dumps(spec)],
        capture_output=True,
        text=True,
        check=True,
    )
    modules, site = json.loads(out.stdout)
    assert not site
    assert "gpuwatch.instrument" not in modules and "gpuwatch.protocol" not in modules
    assert set(modules) == {
        "gpuwatch",
        "gpuwatch.sources",
        "gpuwatch.sources.child",
        "gpuwatch.sources.datagrams",
        "gpuwatch.sources.relay",
    }


def _relay(tmp_path_factory: pytest.TempPathFactory) -> tuple[Child, socket.socket, str]:
    from gpuwatch.sources.datagrams import available

    if not available():
        pytest.skip("no recvmmsg here: no relay")
    path = str(tmp_path_factory.mktemp("gw") / "s")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    sock.bind(path)
    fd = sock.fileno()
    relay = Child.start("gpuwatch.sources.relay", [str(fd), "100"], bare=True, pass_fds=[fd])
    assert relay is not None
    assert relay.wait_ready(30)
    return relay, sock, path


def test_drain_delivers_what_the_child_holds_then_it_exits(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    relay, sock, path = _relay(tmp_path_factory)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as out:
            for i in range(5):
                out.sendto(b"d%d" % i + b"x" * 200, path)  # longer than the 100 kept
        relay.close_lifeline(drain=True)
        frames: list[tuple[int, bytes]] = []
        assert relay.read(lambda tag, data: frames.append((tag, data)), limit=100, size=4096)
        assert relay.reap(10)  # it exited on its own
    finally:
        relay.reap(0)
        relay.close_frames()
        sock.close()
    assert [data[:2] for _, data in frames] == [b"d0", b"d1", b"d2", b"d3", b"d4"]
    assert {len(data) for _, data in frames} == {100}  # cut to what is kept: seen as too long
    assert {tag for tag, _ in frames} == {os.getpid()}  # the kernel's word for the sender


def test_a_closed_lifeline_ends_the_child_at_once(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    relay, sock, _ = _relay(tmp_path_factory)
    try:
        start = time.monotonic()
        relay.close_lifeline(drain=False)
        assert relay.reap(5)
        assert time.monotonic() - start < 2  # no drain's wait for a quiet socket
    finally:
        relay.close_frames()
        sock.close()


def test_a_late_child_is_killed_and_a_frame_not_ours_stops_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A child that ignores its lifeline and writes a frame longer than any of ours.
    rogue = (
        "import os, struct, time\n"
        f"os.write(1, {READY!r})\n"
        "os.write(1, struct.pack('<Ii', 5, 1) + b'hello' + struct.pack('<Ii', 1 << 30, 0))\n"
        "time.sleep(60)\n"
    )
    monkeypatch.setattr(child, "_BOOT", rogue)
    late = Child.start("gpuwatch.sources.relay")
    assert late is not None
    try:
        assert late.wait_ready(30)
        frames: list[tuple[int, bytes]] = []
        assert not late.read(lambda tag, data: frames.append((tag, data)), 1 << 16, 4096)
        assert frames == [(1, b"hello")]
        late.close_lifeline(drain=True)
        assert not late.reap(0.5)  # it had to be killed
        assert late.proc.returncode is not None
    finally:
        late.reap(0)
        late.close_frames()


def test_a_child_that_dies_before_ready_is_not_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(child, "_BOOT", "import sys; sys.exit(3)")
    dead = Child.start("gpuwatch.sources.relay")
    assert dead is not None
    try:
        assert not dead.wait_ready(30)
        assert dead.reap(10) and dead.proc.returncode == 3
    finally:
        dead.close_frames()


def test_frame_is_the_documented_header() -> None:
    assert FRAME.size == 8 and bytes(8) == READY
    assert (
        child.frame(-1, b"ab")
        == (2).to_bytes(4, "little") + (-1).to_bytes(4, "little", signed=True) + b"ab"
    )


def test_a_frame_longer_than_a_read_arrives_whole_and_the_limit_costs_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The sampler's limit is 64 MiB: a buffer that size made up front cost gpuwatch as
    # much memory for nothing. The buffer grows only for a frame that needs it.
    import tracemalloc

    writer = (
        "import os, struct\n"
        f"os.write(1, {READY!r})\n"
        "for n in (10, 300_000, 20):\n"
        "    os.write(1, struct.pack('<Ii', n, n) + bytes([n % 251]) * n)\n"
    )
    monkeypatch.setattr(child, "_BOOT", writer)
    big = Child.start("gpuwatch.sources.relay")
    assert big is not None
    frames: list[tuple[int, bytes]] = []
    tracemalloc.start()
    try:
        assert big.wait_ready(30)
        assert big.read(lambda tag, data: frames.append((tag, data)), 64 << 20, 4096)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        big.reap(10)
        big.close_frames()
    assert [(tag, len(data), data[:1]) for tag, data in frames] == [
        (10, 10, b"\x0a"),
        (300_000, 300_000, bytes([300_000 % 251])),
        (20, 20, b"\x14"),
    ]
    assert peak < 2 * 300_000 + (1 << 20), peak  # the frames' own size, not the limit's
