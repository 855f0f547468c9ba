"""The training-side client: API behaviour, never raising, never blocking."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, wait_for
from fake_cuda import cuda_in_use

import gpuwatch
from gpuwatch.instrument import _api
from gpuwatch.instrument._client import Client
from gpuwatch.session import Session
from gpuwatch.sources.annotations import AnnotationReceiver


@pytest.fixture
def live(sock_path: str):
    """A receiver, and the process-wide client pointed at it."""
    session = Session()
    rx = AnnotationReceiver(session, sock_path)
    rx.start()
    gpuwatch.configure(socket=sock_path, enabled=True)
    yield session
    gpuwatch.flush()
    rx.stop()


def _phases(session: Session) -> list[tuple[str, int, int]]:
    proc = session.processes[os.getpid()]
    cols = proc.phases.snapshot()
    return [
        (session.names[int(n)], int(d), int(s))
        for n, d, s in zip(cols["name"], cols["depth"], cols["step"], strict=True)
    ]


def test_nested_phases_decorator_and_steps(live: Session) -> None:
    gpuwatch.step(10)

    @gpuwatch.phase("data")
    def load() -> int:
        return 3

    with gpuwatch.phase("forward"), gpuwatch.phase("attention"):
        pass
    assert load() == 3
    with gpuwatch.phase("optimizer.step"):
        pass
    with gpuwatch.phase("zero_grad"):
        pass
    # The zero_grad after the optimizer step is still step 10's; step 11 begins with the
    # next step's first phase (one that ran in step 10 already).
    assert gpuwatch.step() == 10
    gpuwatch.mark("checkpoint saved", "warning")
    with gpuwatch.phase("forward"):
        pass
    assert gpuwatch.step() == 11
    gpuwatch.flush()
    assert wait_for(
        lambda: os.getpid() in live.processes and len(live.processes[os.getpid()].phases) == 6
    )
    assert _phases(live) == [
        ("attention", 1, 10),
        ("forward", 0, 10),
        ("data", 0, 10),
        ("optimizer.step", 0, 10),
        ("zero_grad", 0, 10),
        ("forward", 0, 11),
    ]
    assert wait_for(lambda: live.marks)
    assert (live.marks[0].text, live.marks[0].level, live.marks[0].step) == (
        "checkpoint saved",
        "warning",
        10,
    )


@pytest.mark.parametrize("explicit", [True, False], ids=["step(i)", "no-step-calls"])
@pytest.mark.parametrize("zero_grad", ["end", "start"])
def test_steps_are_the_steps_that_ran(live: Session, explicit: bool, zero_grad: str) -> None:
    # The sample's loop: gpuwatch.step(i) at its top, zero_grad after optimizer.step. Before,
    # each zero_grad (and the last one's step, which never ran) was counted one step on.
    gpuwatch.step(0)
    expected = []
    for i in range(3):
        if explicit:
            gpuwatch.step(i)
        names = ["forward", "backward", "optimizer.step", "zero_grad"]
        if zero_grad == "start":
            names = names[-1:] + names[:-1]
        for name in names:
            with gpuwatch.phase(name):
                pass
            expected.append((name, 0, i))
    gpuwatch.flush()
    assert wait_for(
        lambda: os.getpid() in live.processes and len(live.processes[os.getpid()].phases) == 12
    )
    assert _phases(live) == expected
    hello = live.processes[os.getpid()].hello
    assert hello["argv"] == sys.argv[:64]
    assert "torch" in hello


def test_exceptions_propagate_and_end_the_phase(live: Session) -> None:
    with pytest.raises(KeyError), gpuwatch.phase("forward"):
        raise KeyError("boom")
    gpuwatch.flush()
    assert wait_for(
        lambda: os.getpid() in live.processes and len(live.processes[os.getpid()].phases) == 1
    )
    cols = live.processes[os.getpid()].phases.snapshot()
    assert cols["error"][0] == 1


def test_never_raises_on_bad_input_or_bad_socket(tmp_path) -> None:
    gpuwatch.configure(socket=str(tmp_path / "no" / "such" / "dir" / "x.sock"))
    with gpuwatch.phase(object()):  # type: ignore[arg-type]
        gpuwatch.mark(None, level="nonsense")  # type: ignore[arg-type]
        gpuwatch.step("not a number")  # type: ignore[arg-type]
    gpuwatch.flush()


@pytest.mark.parametrize("cuda", [False, True], ids=["cpu", "cuda-in-use"])
def test_disabled_client_sends_nothing(
    sock_path: str, monkeypatch: pytest.MonkeyPatch, cuda: bool
) -> None:
    # On a machine with a GPU, CUDA is in use in this very process (see fake_cuda): the
    # sender thread's periodic allocator figures must stop too, not only the phases.
    if cuda:
        cuda_in_use(_api._state.memory, monkeypatch)
    _api._state.client._start()  # the sender thread, as earlier tests leave it running
    session = Session()
    rx = AnnotationReceiver(session, sock_path)
    rx.start()
    # Off first: a client turned off and pointed at a dashboard in one call never greets it.
    gpuwatch.configure(socket=sock_path, enabled=False)
    try:
        with gpuwatch.phase("forward"):
            gpuwatch.mark("x")
        gpuwatch.flush()
        time.sleep(0.3)  # six wake-ups of the sender while CUDA is in use
        assert rx.received == 0 and os.getpid() not in session.processes
    finally:
        gpuwatch.configure(enabled=True)
        rx.stop()


def test_queue_is_bounded_and_drops_are_counted(sock_path: str) -> None:
    client = Client(sock_path, queue_max=10, interval=3600)
    for i in range(25):
        client.emit(("mark", i, "x", "info", 0))
    assert len(client.queue) == 10
    assert client.queue_dropped == 15


def test_stalled_dashboard_costs_the_sender_little_and_training_nothing(
    sock_path: str,
) -> None:
    # Bound but never read: the kernel queue fills, sends fail with EAGAIN.
    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stalled.bind(sock_path)
    try:
        client = Client(sock_path, interval=3600, max_wait=0.02)
        for i in range(200):
            client.emit(("mark", i, "x" * 100, "info", 0))
        start = time.monotonic()
        client.flush()
        elapsed = time.monotonic() - start
        assert elapsed < 1.0
        assert client.sent > 0
        assert client.send_dropped > 0
        assert client.sent + client.send_dropped == 201  # + the hello
    finally:
        stalled.close()


def test_drops_are_reported_to_a_dashboard_that_appears_later(sock_path: str) -> None:
    client = Client(sock_path, interval=3600)
    client.emit(("mark", time.monotonic_ns(), "lost", "info", 0))
    client.flush()  # nobody listening: dropped
    assert client.dropped == 1
    session = Session()
    rx = AnnotationReceiver(session, sock_path)
    rx.start()
    try:
        client.emit(("mark", time.monotonic_ns(), "kept", "info", 0))
        client.flush()
        assert wait_for(lambda: session.marks)
        proc = session.processes[client.pid]
        assert proc.dropped == 1
        assert [m.text for m in session.marks] == ["kept"]
    finally:
        rx.stop()


def test_dashboard_restart_gets_a_new_hello(sock_path: str) -> None:
    client = Client(sock_path, interval=3600)
    for round_ in range(2):
        session = Session()
        rx = AnnotationReceiver(session, sock_path)
        rx.start()
        try:
            client.emit(("mark", time.monotonic_ns(), f"round {round_}", "info", 0))
            client.flush()
            assert wait_for(lambda s=session: s.marks)
            assert session.processes[client.pid].hello.get("argv") is not None
        finally:
            rx.stop()


def test_forked_child_gets_a_fresh_client(live: Session) -> None:
    code = (
        "import os, gpuwatch, time\n"
        "with gpuwatch.phase('parent'): pass\n"
        "gpuwatch.flush()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    with gpuwatch.phase('child'): pass\n"
        "    gpuwatch.flush()\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print(pid)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPUWATCH_SOCKET": _api._state.client.path}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    child = int(out.strip())
    assert wait_for(lambda: child in live.processes and len(live.processes[child].phases) == 1)
    assert live.names[int(live.processes[child].phases.snapshot()["name"][0])] == "child"
    assert live.processes[child].hello  # the child greeted on its own


_BURST = """\
import os, sys, time
from gpuwatch.instrument._client import Client
path, go, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = Client(path, interval=3600, max_wait=10.0)
open(f"{go}.{os.getpid()}", "w").close()  # at the start line
while not os.path.exists(go):
    time.sleep(0.001)
for i in range(n):
    client.emit(("mark", time.monotonic_ns(), f"burst {i}", "info", 0))
client.flush()
print(client.sent, client.dropped)
"""


def test_ranks_bursting_at_once_lose_nothing_to_a_live_dashboard(
    sock_path: str, sub_env: dict[str, str], tmp_path
) -> None:
    # The ranks of a DDP job run in lockstep, so their senders flush at the same moments.
    # The dashboard's queue holds few datagrams (net.unix.max_dgram_qlen: 10 unless the
    # host raised it), so they meet it full and race for every slot it frees: a sender
    # that gives up after losing a race or two drops events a live dashboard would take.
    session = Session()
    rx = AnnotationReceiver(session, sock_path)
    rx.start()
    go, n, ranks = tmp_path / "go", 300, 8
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _BURST, sock_path, str(go), str(n)],
            env=sub_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(ranks)
    ]
    try:
        ready = [Path(f"{go}.{p.pid}") for p in procs]
        assert wait_for(lambda: all(r.exists() for r in ready), timeout=60)  # every rank
        go.touch()
        outs = [p.communicate(timeout=60) for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        assert [o.split() for o, _ in outs] == [[str(n + 1), "0"]] * ranks  # + the hello
        pids = [p.pid for p in procs]
        assert wait_for(lambda: len(session.marks) == n * ranks), len(session.marks)
        assert all(
            (session.processes[pid].dropped, session.processes[pid].gaps) == (0, 0) for pid in pids
        )
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        rx.stop()


def test_drops_reach_the_dashboard_without_a_later_event_or_a_bye(sock_path: str) -> None:
    # The dashboard's reader is stuck (the session busy): the sender drops the end of a
    # burst, and no event follows. Once the dashboard reads again the client's count must
    # reach it anyway (the bye, which carries it too, may never come: a killed process).
    import threading

    session = Session()
    rx = AnnotationReceiver(session, sock_path)
    rx.start(relay=False)  # a thread reads: it stops while the session is busy
    busy, release = threading.Event(), threading.Event()

    def hold() -> None:
        with session._lock:
            busy.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        busy.wait(10)
        client = Client(sock_path, interval=3600, max_wait=0.02)
        now = time.monotonic_ns()
        for i in range(500):
            client.emit(("mark", now, f"m{i}", "info", 0))
        client.flush()
        assert client.send_dropped > 0
    finally:
        release.set()
        holder.join()
    try:
        client.flush()  # nothing queued: the sender thread's next wake-up
        told = lambda: getattr(session.processes.get(client.pid), "dropped", -1)  # noqa: E731
        assert wait_for(lambda: told() == client.dropped), (told(), client.dropped)
        proc = session.processes[client.pid]
        assert len(session.marks) + proc.dropped == 500
        assert proc.gaps == 0  # drops used up no sequence number
    finally:
        rx.stop()


def test_the_phase_event_fields_agree_in_the_queue_the_client_and_the_protocol(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The phase tuple is written three times (PhaseEvent, the literals ``_api._begin`` and
    # ``_end`` queue, encode_phase's arguments): each is positional, so a field added to
    # one only must fail here.
    import inspect

    from gpuwatch import protocol
    from gpuwatch.instrument._client import PhaseEvent

    queued: list[tuple] = []
    monkeypatch.setattr(_api._state.client, "emit", queued.append)
    monkeypatch.setattr(_api._state, "enabled", True)
    _api._state.stack().clear()
    with gpuwatch.phase("outer"), pytest.raises(KeyError), gpuwatch.phase("inner"):
        raise KeyError("x")
    assert [len(q) for q in queued] == [len(PhaseEvent._fields)] * 4
    outer, inner, inner_end, outer_end = (PhaseEvent(*q) for q in queued)
    assert {e.kind for e in (outer, inner, inner_end, outer_end)} == {"phase"}
    assert [e.event for e in (outer, inner, inner_end, outer_end)] == [
        "begin",
        "begin",
        "end",
        "end",
    ]
    assert (inner.name, inner_end.name, outer_end.name) == ("inner", "inner", "outer")
    assert inner.sid == inner_end.sid != outer.sid == outer_end.sid
    assert (inner.parent, inner_end.parent, outer.parent) == (outer.sid, outer.sid, None)
    assert (outer.depth, inner.depth, inner_end.depth, outer_end.depth) == (0, 1, 1, 0)
    assert (inner_end.error, outer_end.error, inner.error) == ("KeyError", None, None)
    assert outer.t <= inner.t <= inner_end.t <= outer_end.t
    assert inner.step == _api._state.step and inner.fig is None  # no CUDA here
    emit = list(PhaseEvent._fields)[1:]
    encode = list(inspect.signature(protocol.encode_phase).parameters)
    assert encode[:4] == ["pid", "seq", "t", "dropped"]
    assert [{"figures": "fig"}.get(p, p) for p in encode[4:]] == emit[1:]
    # And by value, as the sender passes a queued event on (``_send_item``).
    t = time.monotonic_ns()
    ev = PhaseEvent("phase", t, "end", "forward", 7, 3, 2, 5, (0, 100, 200, 300, 400), "E")
    msg = protocol.decode(protocol.encode_phase(1, 0, ev.t, 0, *ev[2:]), now=t)
    body = msg.body
    assert (msg.kind, msg.t, body["event"], body["name"], body["id"]) == (
        "phase",
        t,
        "end",
        "forward",
        7,
    )
    assert (body["parent"], body["depth"], body["step"], body["error"]) == (3, 2, 5, "E")
    assert (body["dev"], body["allocated"], body["peak_reserved"]) == (0, 100, 400)
