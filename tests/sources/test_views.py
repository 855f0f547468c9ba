"""The view socket (issue 51 item 1) with real Unix sockets: a view sees the owner's facts,
a stuck view never holds the owner up (its facts are dropped and it is told), a hostile
owner's lines are refused one by one, and a view nobody can hand over to ends in one line."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest
from conftest import wait_for

from gpuwatch import live_sources, protocol
from gpuwatch.live_sources import LiveSources, SourcesError
from gpuwatch.protocol import Message
from gpuwatch.session import Device, Session
from gpuwatch.sources import views
from gpuwatch.sources.lock_file import LockFile
from gpuwatch.sources.views import Applier, ViewFeed, ViewHub, view_path

GPU = "gpu:0000"


def _hub(session: Session, sock_path: str) -> ViewHub:
    lock = LockFile.take(sock_path)  # as the owner holds it
    hub = ViewHub(session, sock_path, recording=lambda: "/x.gpuwatch", once=lambda: {})
    hub.start()
    hub._test_lock = lock  # type: ignore[attr-defined]
    return hub


def _owner_session() -> Session:
    s = Session()
    s.add_device(Device(GPU, "gpu", index=0, name="Fake", total=80 << 30))
    return s


def test_a_view_sees_what_the_owner_is_given(sock_path: str) -> None:
    owner = _owner_session()
    hub = _hub(owner, sock_path)
    try:
        view = Session()
        feed = ViewFeed(view, sock_path)
        feed.connect()
        ended = threading.Event()
        feed.start(lambda f: ended.set())
        assert feed.owner_pid == os.getpid() and feed.recording == "/x.gpuwatch"
        assert view.t_origin == owner.t_origin
        assert wait_for(lambda: GPU in view.gpu)  # the snapshot: the device
        t = time.monotonic_ns()
        owner.add_gpu_sample(GPU, {"t": t, "used": 5 << 30, "total": 80 << 30})
        owner.ingest(Message("phase", 4242, 0, t, 0, {"event": "begin", "name": "fwd", "id": 1}))
        assert wait_for(lambda: len(view.gpu[GPU]) == 1 and 4242 in view.processes)
        last = view.gpu[GPU].last()
        assert last is not None and last["used"] == 5 << 30
        assert [o.name for o in view.processes[4242].open.values()] == ["fwd"]
        owner.set_sampler_rate(GPU, 9.5)  # no fact of its own: sent when it changes
        assert wait_for(lambda: view.sampler_rate.get(GPU) == 9.5)
        hub.stop()
        assert ended.wait(5) and feed.applier.bye == (True, "/x.gpuwatch")
    finally:
        hub.stop()
        hub._test_lock.release()  # type: ignore[attr-defined]


def test_a_stuck_view_never_holds_the_owner_up(sock_path: str, monkeypatch) -> None:
    monkeypatch.setattr(views, "QUEUE_MAX", 1000)
    owner = _owner_session()
    hub = _hub(owner, sock_path)
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.connect(view_path(sock_path))
        stuck.sendall(b"view\n")  # and never reads
        assert wait_for(lambda: hub.views == 1)
        t = time.monotonic_ns()
        started = time.perf_counter()
        for i in range(50_000):
            owner.add_gpu_sample(GPU, {"t": t + i, "used": i, "total": 1})
        spent = time.perf_counter() - started
        outlet = hub._outlets[0]
        assert outlet.dropped > 0 and len(outlet.queue) <= 1000  # bounded, counted
        # The producer's cost with a stuck view: an append or a count per fact.
        alone = Session()
        alone.add_device(Device(GPU, "gpu", index=0))
        started = time.perf_counter()
        for i in range(50_000):
            alone.add_gpu_sample(GPU, {"t": t + i, "used": i, "total": 1})
        assert spent < 3 * (time.perf_counter() - started) + 0.5
    finally:
        stuck.close()
        hub.stop()
        hub._test_lock.release()  # type: ignore[attr-defined]


def test_a_view_is_told_what_was_dropped(sock_path: str) -> None:
    view = Session()
    applier = Applier(view)
    applier.line(b'[["dropped", 17]]')
    assert applier.dropped == 17
    assert any("dropped 17" in n for n in view.notes)


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b'{"a": 1}',
        b'["device", {"key": "gpu:x", "kind": "evil"}]',
        b'["device", {"key": "' + b"k" * 5000 + b'", "kind": "gpu"}]',
        b'["gpu", "gpu:unknown", {"t": 1}]',
        b'["gpu", "gpu:0000", {"t": 1, "rm -rf": 3}]',
        b'["gpu", "gpu:0000", {"t": "soon"}]',
        b'["procs", "gpu:0000", 5, [[1, 2]]]',
        b'["procs", "gpu:0000", 5, [[-1, 2, 0]]]',
        b'["msg", {"v": 9}, null]',
        b'["mark", 1, 2, "x", "shout", null]',
        b'["info", 5, {"cmdline": [' + b'"a",' * 2000 + b'"b"]}]',
        b'["note"]',
        b"[" * 100_000 + b"]" * 100_000,  # deeper than the parser goes
    ],
)
def test_hostile_lines_are_refused_one_by_one(line: bytes) -> None:
    view = Session()
    view.add_device(Device(GPU, "gpu", index=0))
    applier = Applier(view)
    before = (len(view.devices), len(view.gpu[GPU]), len(view.marks), len(view.processes))
    applier.line(b"[" + line + b"]")  # a line is a batch of items
    assert applier.refused == 1
    after = (len(view.devices), len(view.gpu[GPU]), len(view.marks), len(view.processes))
    assert after == before
    applier.line(b'[["gpu", "gpu:0000", {"t": 1, "used": 2}]]')  # the stream goes on
    assert len(view.gpu[GPU]) == 1 and applier.refused == 1


def test_strings_from_the_owner_are_made_printable() -> None:
    view = Session()
    applier = Applier(view)
    evil = "\x1b]0;owned\x07GPU\x1b[2J"
    device = ["device", {"key": "gpu:e", "kind": "gpu", "name": evil}]
    applier.line(json.dumps([device, ["note", evil]]).encode())
    assert "\x1b" not in view.devices["gpu:e"].name and "\x1b" not in view.notes[-1]
    datagram = protocol.encode("mark", 7, 0, time.monotonic_ns(), 0, {"text": "hi"})
    applier.line(json.dumps([["msg", json.loads(datagram), None]]).encode())
    assert [m.text for m in view.marks] == ["hi"]


def test_a_view_nobody_hands_over_to_ends_in_one_line(sock_path: str, monkeypatch) -> None:
    monkeypatch.setattr(live_sources, "TAKEOVER_LIMIT", 1.0)
    hub = _hub(_owner_session(), sock_path)  # the owner: its lock, its view socket
    viewer = LiveSources(socket=sock_path)
    try:
        viewer.start()
        assert viewer.feed is not None and "view of gpuwatch pid" in viewer.describe()
        # The owner's views go, its lock stays (as a gpuwatch stuck on its way out): the
        # view can neither take the socket over nor view anyone.
        hub.stop()
        assert wait_for(lambda: viewer.view_ended is not None, 20)
        ended = viewer.view_ended
        assert ended is not None and "\n" not in ended
        assert f"pid {os.getpid()}) quit" in ended and "/x.gpuwatch" in ended
        assert viewer.warning() == "VIEW ENDED: " + ended
    finally:
        viewer.stop()
        hub.stop()
        hub._test_lock.release()  # type: ignore[attr-defined]


def test_an_owner_that_serves_no_views_is_still_one_line(sock_path: str) -> None:
    lock = LockFile.take(sock_path)  # an older gpuwatch: the lock, no view socket
    try:
        with pytest.raises(SourcesError) as info:
            LiveSources(socket=sock_path).start()
        assert "already listening" in str(info.value) and "\n" not in str(info.value)
    finally:
        lock.release()
