"""The annotation receiver on real Unix sockets: ownership, permissions, validation."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys

import pytest
from conftest import ROOT, wait_for

from gpuwatch import protocol
from gpuwatch.session import Session
from gpuwatch.sources.annotations import AnnotationReceiver, SocketInUse


@pytest.fixture
def receiver(sock_path: str):
    session = Session()
    rx = AnnotationReceiver(session, sock_path)
    rx.start()
    yield rx
    rx.stop()


def _send(path: str, data: bytes) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(data, path)


def test_socket_is_private(receiver: AnnotationReceiver, sock_dir) -> None:
    mode = os.stat(receiver.path).st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600


def test_default_directory_is_created_0700(tmp_path, monkeypatch) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir()
    monkeypatch.delenv("GPUWATCH_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    rx = AnnotationReceiver(Session())
    rx.bind()
    try:
        assert rx.path == str(runtime / "gpuwatch" / "gpuwatch.sock")
        assert stat.S_IMODE(os.stat(runtime / "gpuwatch").st_mode) == 0o700
    finally:
        rx.stop()


def test_second_receiver_is_refused(receiver: AnnotationReceiver) -> None:
    other = AnnotationReceiver(Session(), receiver.path)
    with pytest.raises(SocketInUse) as info:
        other.bind()
    assert str(os.getpid()) in str(info.value)
    assert receiver.path in str(info.value)


def test_second_gpuwatch_command_exits_2_with_one_line(receiver: AnnotationReceiver) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "--socket", receiver.path],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "already listening" in lines[0]


def test_stale_socket_file_is_replaced(sock_path: str) -> None:
    # A socket file left behind by a process that died without cleaning up.
    code = (
        "import socket, os, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
        f"s.bind({sock_path!r})\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert os.path.exists(sock_path)
    session = Session()
    rx = AnnotationReceiver(session, sock_path)
    rx.start()
    try:
        _send(sock_path, protocol.encode("mark", 77, 0, 1, 0, {"text": "hello"}))
        assert wait_for(lambda: len(session.marks) == 1)
    finally:
        rx.stop()
    assert not os.path.exists(sock_path)


def test_malformed_datagrams_are_counted_and_valid_ones_arrive(
    receiver: AnnotationReceiver,
) -> None:
    session = receiver.session
    bad = [
        b"garbage",
        b'{"v": 99, "kind": "mark", "seq": 0, "pid": 5, "t": 1, "text": "x"}',
        b'{"v": 1, "kind": "mark", "seq": 0, "pid": 5, "t": 1}',
        b'{"v": 1, "kind": "nope", "seq": 0, "pid": 5, "t": 1}',
        b"x" * (protocol.MAX_DATAGRAM + 10),
    ]
    for i, data in enumerate(bad):
        _send(receiver.path, data)
        _send(receiver.path, protocol.encode("mark", 5, i, 10 + i, 0, {"text": f"ok {i}"}))
    assert wait_for(
        lambda: len(session.marks) == len(bad) and sum(session.rejects.values()) == len(bad)
    )
    assert session.rejects == {"json": 1, "version": 1, "field": 1, "kind": 1, "size": 1}
    assert [m.text for m in session.marks] == [f"ok {i}" for i in range(len(bad))]
    assert receiver.rejected == len(bad)
