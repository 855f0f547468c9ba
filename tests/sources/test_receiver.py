"""The annotation receiver on real Unix sockets: ownership, permissions, validation."""

from __future__ import annotations

import json
import os
import pty
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import ROOT, wait_for

from gpuwatch import protocol
from gpuwatch.session import Session
from gpuwatch.sources.annotations import (
    AnnotationReceiver,
    SocketDirUnsafe,
    SocketInUse,
    SocketPathTaken,
)


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
    # On a terminal (a pty), as a person starts it: without one the dashboard refuses first.
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "gpuwatch", "--no-record", "--socket", receiver.path],
            stdin=follower,
            stdout=follower,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env=env,
        )
    finally:
        os.close(follower)
        os.close(leader)
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
        now = time.monotonic_ns()
        _send(sock_path, protocol.encode("mark", 77, 0, now, 0, {"text": "hello"}))
        assert wait_for(lambda: len(session.marks) == 1)
    finally:
        rx.stop()
    assert not os.path.exists(sock_path)


def test_malformed_datagrams_are_counted_and_valid_ones_arrive(
    receiver: AnnotationReceiver,
) -> None:
    session = receiver.session
    t = time.monotonic_ns()
    bad = [
        b"garbage",
        b'{"v": 99, "kind": "mark", "seq": 0, "pid": 5, "t": %d, "text": "x"}' % t,
        b'{"v": 1, "kind": "mark", "seq": 0, "pid": 5, "t": %d}' % t,
        b'{"v": 1, "kind": "nope", "seq": 0, "pid": 5, "t": %d}' % t,
        b"x" * (protocol.MAX_DATAGRAM + 10),
    ]
    for i, data in enumerate(bad):
        _send(receiver.path, data)
        now = time.monotonic_ns()
        _send(receiver.path, protocol.encode("mark", 5, i, now, 0, {"text": f"ok {i}"}))
    assert wait_for(
        lambda: len(session.marks) == len(bad) and sum(session.rejects.values()) == len(bad)
    )
    assert session.rejects == {"json": 1, "version": 1, "field": 1, "kind": 1, "size": 1}
    assert [m.text for m in session.marks] == [f"ok {i}" for i in range(len(bad))]
    assert receiver.rejected == len(bad)


# ---------------------------------------------------------------------- the path is not ours


def _gpuwatch(*args: str, env: dict | None = None, cwd: Path | None = None):
    return subprocess.run(
        [sys.executable, "-m", "gpuwatch", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        cwd=cwd,
    )


@pytest.mark.parametrize("via", ["option", "environment"])
def test_a_file_at_the_socket_path_is_refused_and_left_alone(tmp_path: Path, via: str) -> None:
    train = tmp_path / "train.py"
    train.write_text("print('the user's training script')\n")
    if via == "option":
        args, env = ["--socket", str(train)], {}
    else:
        args, env = [], {"GPUWATCH_SOCKET": str(train)}
    out = tmp_path / "r.gpuwatch"
    result = _gpuwatch("record", "--out", str(out), "--duration", "1", *args, env=env)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "not a socket" in result.stderr
    assert train.read_text() == "print('the user's training script')\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]  # no lock, no recording


def test_a_lock_file_name_taken_by_a_user_file_is_left_alone(sock_path: str) -> None:
    lock = Path(sock_path + ".lock")
    lock.write_text("my notes, not a pid\n")
    with pytest.raises(SocketPathTaken):
        AnnotationReceiver(Session(), sock_path).bind()
    assert lock.read_text() == "my notes, not a pid\n"
    assert not os.path.exists(sock_path)


def test_a_link_at_the_lock_file_is_not_followed(sock_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("keep me")
    os.symlink(target, sock_dir / "gw.sock.lock")
    with pytest.raises(SocketPathTaken):
        AnnotationReceiver(Session(), str(sock_dir / "gw.sock")).bind()
    assert target.read_text() == "keep me"


def test_a_socket_another_program_listens_on_is_not_replaced(sock_path: str) -> None:
    other = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    other.bind(sock_path)
    try:
        with pytest.raises(SocketInUse) as info:
            AnnotationReceiver(Session(), sock_path).bind()
        assert "another program" in str(info.value)
        other.settimeout(1)
        _send(sock_path, b"still yours")
        assert other.recv(100) == b"still yours"  # its socket file is still bound there
    finally:
        other.close()


def _runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    runtime = tmp_path / "run"
    runtime.mkdir()
    monkeypatch.delenv("GPUWATCH_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    return runtime


@pytest.mark.parametrize("target_mode", [0o1777, 0o755])
def test_a_link_planted_as_the_default_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target_mode: int
) -> None:
    runtime = _runtime(tmp_path, monkeypatch)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, target_mode)  # a shared sticky directory, or another user's home
    os.symlink(shared, runtime / "gpuwatch")
    with pytest.raises(SocketDirUnsafe) as info:
        AnnotationReceiver(Session()).bind()
    assert "symbolic link" in str(info.value)
    assert stat.S_IMODE(os.stat(shared).st_mode) == target_mode  # sticky bit kept
    assert list(shared.iterdir()) == []


def test_a_default_directory_open_to_others_is_refused_not_chmodded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = _runtime(tmp_path, monkeypatch)
    (runtime / "gpuwatch").mkdir()
    os.chmod(runtime / "gpuwatch", 0o755)
    with pytest.raises(SocketDirUnsafe) as info:
        AnnotationReceiver(Session()).bind()
    assert "0755" in str(info.value)
    assert stat.S_IMODE(os.stat(runtime / "gpuwatch").st_mode) == 0o755


def test_an_explicit_socket_directory_keeps_its_mode(tmp_path: Path) -> None:
    mine = Path(tempfile.mkdtemp(prefix="gw-", dir="/tmp"))
    try:
        os.chmod(mine, 0o755)
        rx = AnnotationReceiver(Session(), str(mine / "x.sock"))
        rx.bind()
        rx.stop()
        assert stat.S_IMODE(os.stat(mine).st_mode) == 0o755
    finally:
        shutil.rmtree(mine, ignore_errors=True)


def test_stop_removes_only_its_own_socket(sock_path: str) -> None:
    rx = AnnotationReceiver(Session(), sock_path)
    rx.bind()
    os.unlink(sock_path)
    Path(sock_path).write_text("a file that replaced it")
    rx.stop()
    assert Path(sock_path).read_text() == "a file that replaced it"


# ---------------------------------------------------------------------- identity


_CLAIM = """
import json, os, socket, sys, time
path, claim = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
t = time.monotonic_ns()
for seq, (kind, body) in enumerate([
    ("hello", {"argv": ["made-up", "argv"], "devices": []}),
    ("mark", {"text": "spoken for pid %d" % claim}),
]):
    msg = {"v": 1, "kind": kind, "seq": seq, "pid": claim, "t": t + seq, **body}
    s.sendto(json.dumps(msg).encode(), path)
print(os.getpid())
"""


@pytest.mark.parametrize("claim", [1, 424242])
def test_the_kernel_names_the_sender_not_the_datagram(
    receiver: AnnotationReceiver, claim: int
) -> None:
    # pid 1 is init: a receiver that believed the datagram would sample init's RSS under a
    # made-up command line. The claim is kept only as the pid "in its container".
    out = subprocess.run(
        [sys.executable, "-c", _CLAIM, receiver.path, str(claim)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    real = int(out.stdout)
    session = receiver.session
    assert wait_for(lambda: len(session.marks) == 1)
    assert claim not in session.processes
    assert list(session.processes) == [real]
    proc = session.processes[real]
    assert proc.container_pid == claim
    assert session.marks[0].pid == real


def test_the_sender_s_own_pid_is_not_a_container_pid(receiver: AnnotationReceiver) -> None:
    now = time.monotonic_ns()
    _send(receiver.path, protocol.encode("mark", os.getpid(), 0, now, 0, {"text": "me"}))
    assert wait_for(lambda: len(receiver.session.marks) == 1)
    assert receiver.session.processes[os.getpid()].container_pid is None


def test_hostile_datagrams_interleaved_with_valid_ones(receiver: AnnotationReceiver) -> None:
    # Valid JSON with values out of every range, between valid events that must all arrive.
    now = time.monotonic_ns()
    me = os.getpid()
    hostile = [
        {"kind": "mark", "text": "far future", "t": 2**63 - 1},
        {"kind": "mark", "text": "boot", "t": 0},
        {"kind": "memory", "allocated": 2**63, "reserved": 1},
        {"kind": "phase", "event": "begin", "name": "x", "id": 2**64},
        {"kind": "bye", "exit_code": 2**63},
        {"kind": "hello", "devices": [{"index": i, "uuid": f"fake-{i}"} for i in range(63)]},
        {"kind": "facts", "facts": {"x": 2**70}},
    ]
    for i, fields in enumerate(hostile):
        msg = {"v": 1, "seq": 2 * i, "pid": me, "t": now, **fields}
        _send(receiver.path, json.dumps(msg).encode())
        _send(receiver.path, protocol.encode("mark", me, 2 * i + 1, now, 0, {"text": f"ok {i}"}))
    session = receiver.session
    assert wait_for(lambda: len(session.marks) == len(hostile))
    assert wait_for(lambda: sum(session.rejects.values()) == len(hostile))
    assert [m.text for m in session.marks] == [f"ok {i}" for i in range(len(hostile))]
    assert session.rejects == {"time": 2, "range": 5}
    assert not [d for d in session.devices.values() if d.kind == "gpu"]
    lo, hi = session.time_range()
    assert hi - lo < 60 * 10**9


# ---------------------------------------------------------------------- bursts and the relay


def test_a_burst_is_held_while_the_session_is_busy(receiver: AnnotationReceiver) -> None:
    # The dashboard's threads are busy (here: the session's lock is held throughout) while
    # a script sends 5000 events: the relay keeps the socket's small queue empty, so none
    # is dropped, and all arrive late. The sender may wait 10 s in all for room: on a
    # loaded machine the relay process is not scheduled at once (with 50 ms, 2350 of 5000
    # were dropped at load 4), while without a relay the socket's queue (a few hundred
    # datagrams) stays full behind the held lock and the wait runs out whatever the
    # machine. How fast the relay drains is bench_burst.py's figure, not this test's.
    from gpuwatch.instrument._client import Client

    session = receiver.session
    client = Client(receiver.path, interval=3600, max_wait=10.0)
    with session._lock:
        now = time.monotonic_ns()
        for i in range(5000):
            client.emit(("mark", now, f"m{i}", "info", 0))
        client.flush()
        assert client.dropped == 0
        assert len(session.marks) == 0  # nothing got in while the session was busy
    assert wait_for(lambda: len(session.marks) == 5000, timeout=120)
    assert [m.text for m in session.marks[:3]] == ["m0", "m1", "m2"]


def test_the_relay_goes_when_the_receiver_stops(sock_path: str) -> None:
    rx = AnnotationReceiver(Session(), sock_path)
    rx.start()
    relay = rx._relay
    if relay is None:
        pytest.skip("no recvmmsg here: the receiver reads in a thread")
    assert relay.proc.poll() is None
    rx.stop()
    assert relay.proc.poll() is not None


def test_the_relay_goes_when_gpuwatch_is_killed(sock_path: str) -> None:
    code = (
        "import sys, time\n"
        "from gpuwatch.session import Session\n"
        "from gpuwatch.sources.annotations import AnnotationReceiver\n"
        f"rx = AnnotationReceiver(Session(), {sock_path!r}); rx.start()\n"
        "print(rx._relay.pid if rx._relay else 0, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    relay = int(proc.stdout.readline())
    if relay == 0:
        proc.kill()
        pytest.skip("no recvmmsg here: the receiver reads in a thread")
    proc.kill()  # SIGKILL: no stop(), no cleanup
    proc.wait()

    def gone() -> bool:
        try:
            os.kill(relay, 0)
        except ProcessLookupError:
            return True
        # A zombie of ours is gone too (it is its parent's, which died: init reaps it).
        with open(f"/proc/{relay}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        return False

    assert wait_for(gone, timeout=10)


def test_relayed_frames_split_across_reads_arrive_whole(sock_path: str) -> None:
    # The pipe gives frames in pieces: a read may end inside a header or a datagram, and
    # what is left must join the next read in the buffer made once for all of them.
    import threading

    from gpuwatch.sources.child import FRAME, Child

    session = Session()
    rx = AnnotationReceiver(session, sock_path)
    r, w = os.pipe()
    life_r, life_w = os.pipe()
    # A process that waits on its lifeline, standing in for the relay: this test writes.
    idle = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=life_r)
    os.close(life_r)
    rx._relay = Child(idle, r, life_w)
    now = time.monotonic_ns()
    frames = b"".join(
        FRAME.pack(len(d), os.getpid()) + d
        for d in (
            protocol.encode("mark", os.getpid(), i, now, 0, {"text": f"m{i}" + "x" * (i % 97)})
            for i in range(3000)
        )
    )
    reader = threading.Thread(target=rx._run_relayed, daemon=True)
    reader.start()
    try:
        for at in range(0, len(frames), 7919):  # a prime: every cut lands somewhere new
            os.write(w, frames[at : at + 7919])
            if at % 3 == 0:
                time.sleep(0.0005)
        assert wait_for(lambda: len(session.marks) == 3000, timeout=30)
        assert [m.text[:5] for m in session.marks[:3]] == ["m0", "m1x", "m2xx"]
        assert rx.rejected == 0
        # A frame no datagram can be (longer than the buffer) ends reading, with a note.
        os.write(w, FRAME.pack(1 << 30, os.getpid()) + b"x" * (1 << 16))
        reader.join(timeout=30)
        assert not reader.is_alive()
        assert any("damaged frame" in n for n in session.notes)
    finally:
        os.close(w)
        assert rx._relay.reap(5)
        rx._relay.close_frames()


def test_a_trickled_backlog_costs_the_relay_about_its_size(sock_path: str) -> None:
    # While gpuwatch reads nothing, the relay holds what comes. Held one object per read,
    # a trickle (a datagram per read) cost it 3.6 times its bytes: RELAY_BACKLOG bounded
    # what it counted, not what it took. Everything still comes out whole and in order.
    import select

    from gpuwatch.sources.child import FRAME, Child
    from gpuwatch.sources.datagrams import available

    if not available():
        pytest.skip("no recvmmsg here: the receiver reads in a thread")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    sock.bind(sock_path)
    fd = sock.fileno()
    relay = Child.start(
        "gpuwatch.sources.relay", [str(fd), str(protocol.MAX_DATAGRAM + 1)], bare=True,
        pass_fds=[fd],
    )  # fmt: skip
    assert relay is not None
    data_r = relay.frames
    assert data_r is not None

    def rss() -> int:
        with open(f"/proc/{relay.pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    try:
        assert relay.wait_ready(30)
        before = rss()
        n = 15_000
        datagram = protocol.encode("mark", os.getpid(), 0, 1, 0, {"text": "m"})
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as out:
            out.connect(sock_path)
            for _ in range(n):
                while True:
                    try:
                        out.send(datagram)
                        break
                    except OSError:  # the queue is full: the relay has not run yet
                        time.sleep(0.001)
                time.sleep(0.0001)  # a trickle: the relay takes them one or two at a time
        # Taken from the socket (our copy of it is never read here), into the relay.
        assert wait_for(lambda: not select.select([sock], [], [], 0)[0], timeout=30)
        framed = n * (FRAME.size + len(datagram))
        grown = rss() - before
        assert grown < 2 * framed + (1 << 20), (grown, framed)
        got = bytearray()
        while len(got) < framed:
            chunk = os.read(data_r, 1 << 20)
            assert chunk
            got += chunk
        frame = FRAME.pack(len(datagram), os.getpid()) + datagram
        assert bytes(got) == frame * n
    finally:
        relay.close_lifeline(drain=False)
        assert relay.reap(10)
        relay.close_frames()
        sock.close()


@pytest.mark.parametrize("way", ["thread, batched", "thread, one by one"])
def test_without_the_relay_a_thread_receives(
    sock_path: str, way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuwatch.sources import annotations

    if way == "thread, one by one":
        monkeypatch.setattr(annotations, "batch_receiver", lambda sock, size: None)
    session = Session()
    rx = AnnotationReceiver(session, sock_path)
    rx.start(relay=False)
    try:
        assert rx._relay is None
        now = time.monotonic_ns()
        for i in range(50):
            _send(sock_path, protocol.encode("mark", os.getpid(), i, now, 0, {"text": f"{i}"}))
        assert wait_for(lambda: len(session.marks) == 50)
        assert session.processes[os.getpid()].container_pid is None  # the kernel's pid
    finally:
        rx.stop()


def test_the_recording_is_named_in_the_lock_file_and_nothing_else_is_made(
    tmp_path: Path,
) -> None:
    # A second gpuwatch learns from the first one's lock file which recording grows; no
    # other file is made (or replaced, or removed) beside the socket.
    from gpuwatch.live_sources import LiveSources
    from gpuwatch.sources.annotations import lock_owner

    mine = Path(tempfile.mkdtemp(prefix="gw-", dir="/tmp"))
    try:
        sock = str(mine / "run")
        (mine / "run.recording").write_text("the user's notes")
        sources = LiveSources(socket=sock, interval=0.1)
        sources.record_to(tmp_path / "r.gpuwatch")
        sources.start()
        try:
            assert lock_owner(sock) == (os.getpid(), str((tmp_path / "r.gpuwatch").resolve()))
        finally:
            sources.stop()
        assert (mine / "run.recording").read_text() == "the user's notes"
        assert sorted(p.name for p in mine.iterdir()) == ["run.lock", "run.recording"]
    finally:
        shutil.rmtree(mine, ignore_errors=True)


# ---------------------------------------------------------------------- counted once, at stop


def test_a_rejected_datagram_is_counted_as_rejected_not_also_lost(
    receiver: AnnotationReceiver,
) -> None:
    # Its sequence number was used up by a datagram that arrived: no gap.
    me, now = os.getpid(), time.monotonic_ns()
    _send(receiver.path, protocol.encode("mark", me, 0, now, 0, {"text": "first"}))
    bad = {"v": 1, "kind": "mark", "seq": 1, "pid": me, "t": now, "text": "x", "level": "loud"}
    _send(receiver.path, json.dumps(bad).encode())
    _send(receiver.path, b"not json at all")  # no sequence number to account for
    _send(receiver.path, protocol.encode("mark", me, 2, now, 0, {"text": "last"}))
    session = receiver.session
    assert wait_for(lambda: len(session.marks) == 2 and sum(session.rejects.values()) == 2)
    proc = session.processes[me]
    assert (proc.gaps, proc.last_seq) == (0, 2)
    assert proc.rejected == 2  # the kernel names the sender of both
    assert session.rejects == {"field": 1, "json": 1}


@pytest.mark.parametrize("way", ["batched", "one by one"])
def test_datagrams_still_queued_at_stop_are_recorded(
    sock_path: str, way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Bound, never read until stop (a reader that had fallen behind): stop takes them.
    from gpuwatch.sources import annotations

    if way == "one by one":  # where the system has no recvmmsg
        monkeypatch.setattr(annotations, "batch_receiver", lambda sock, size: None)
    session = Session()
    rx = AnnotationReceiver(session, sock_path)
    rx.bind()
    now = time.monotonic_ns()
    for i in range(5):
        _send(sock_path, protocol.encode("mark", os.getpid(), i, now, 0, {"text": f"m{i}"}))
    rx.stop()
    assert [m.text for m in session.marks] == [f"m{i}" for i in range(5)]
    assert rx.cut_short is None
    assert not os.path.exists(sock_path)


def test_what_cannot_be_recorded_in_time_at_stop_is_counted_as_lost(
    sock_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The session stays busy past the drain's time limit: the relay's backlog is counted
    # for its sender, once, and stop says so in one line.
    import threading

    from gpuwatch.sources import relay

    session = Session()
    rx = AnnotationReceiver(session, sock_path)
    rx.start()
    if rx._relay is None:
        rx.stop()
        pytest.skip("no recvmmsg here: the receiver reads in a thread")
    # This process's side only: the relay's own limit stays 5 s.
    monkeypatch.setattr(relay, "DRAIN_LIMIT", 0.3)
    me, now, n = os.getpid(), time.monotonic_ns(), 3000
    busy, release = threading.Event(), threading.Event()

    def hold() -> None:
        with session._lock:
            busy.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        busy.wait(10)
        for i in range(n):
            _send(sock_path, protocol.encode("mark", me, i, now, 0, {"text": f"m{i}"}))
        threading.Timer(1.0, release.set).start()  # after the drain's time is up
        rx.stop()
    finally:
        release.set()
        holder.join()
    proc = session.processes[me]
    assert len(session.marks) + proc.gaps == n
    assert proc.gaps > 0
    assert rx.cut_short is not None and "counted as lost" in rx.cut_short
    assert "\n" not in rx.cut_short
    assert rx.cut_short in session.notes


def test_a_listening_receiver_reads_before_it_starts(sock_path: str) -> None:
    # The socket file exists from the bind on, and a sender connects at once: while
    # gpuwatch still opens its recording and serves its views, the relay already empties
    # the socket's small queue (else the sender drops all its burst), and start records it.
    from gpuwatch.sources.datagrams import available

    if not available():
        pytest.skip("no recvmmsg here: the receiver reads in a thread, from start")
    session = Session()
    rx = AnnotationReceiver(session, sock_path)
    rx.listen()
    try:
        me, now, n = os.getpid(), time.monotonic_ns(), 500  # many times the socket's queue
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.settimeout(10)  # nobody reading: the queue stays full and this times out
            for i in range(n):
                s.sendto(protocol.encode("mark", me, i, now, 0, {"text": f"m{i}"}), sock_path)
        assert not session.marks  # held by the relay until start reads its pipe
        rx.start()
        assert wait_for(lambda: len(session.marks) == n, timeout=30), len(session.marks)
    finally:
        rx.stop()
    assert [m.text for m in session.marks] == [f"m{i}" for i in range(n)]
