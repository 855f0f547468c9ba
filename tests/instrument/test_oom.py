"""OOM forensics: injected OutOfMemoryErrors on the CPU, the observer path, snapshots."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import wait_for  # noqa: E402
from fake_cuda import FakeCuda  # noqa: E402
from phasecheck import receiver  # noqa: E402
from torch import nn  # noqa: E402

import gpuwatch  # noqa: E402
from gpuwatch.instrument import _api, _auto, _oom, _watch  # noqa: E402
from gpuwatch.instrument._torchmem import TorchMemory  # noqa: E402
from gpuwatch.session import Session  # noqa: E402

PID = os.getpid()
GIB, MIB = 1024**3, 1024**2
MESSAGE = (
    "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 1 has a total capacity of 79.15 GiB "
    "of which 3.50 MiB is free. Including non-PyTorch memory, this process has 79.14 GiB "
    "memory in use. Of the allocated memory 78.25 GiB is allocated by PyTorch, and 512.00 MiB "
    "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
    "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)
PARSED = {
    "requested": 20 * MIB,
    "total": int(79.15 * GIB),
    "free": int(3.5 * MIB),
    "allocated": int(78.25 * GIB),
    "reserved": int(78.25 * GIB) + 512 * MIB,
    "dev": 1,
}


@pytest.fixture
def live(sock_path: str) -> Iterator[Session]:
    gen = receiver(sock_path)
    session = next(gen)
    gpuwatch.configure(socket=sock_path, enabled=True)
    st = _api._state
    st.set_step(7)  # also forgets an advance a previous test left pending
    st.client.facts = None
    st.stack().clear()
    saved = (_oom._O.modes, _oom._O.pending, dict(_oom._O.snapshots), _oom._O.high)
    _oom._O.pending = None
    yield session
    gpuwatch.flush()
    gen.close()
    _oom._O.modes, _oom._O.pending, _oom._O.snapshots, _oom._O.high = saved


def _ooms(session: Session, n: int = 1) -> list[dict]:
    gpuwatch.flush()
    wait_for(lambda: len([o for o in session.ooms if o.pid == PID]) >= n)
    return [o.body for o in session.ooms if o.pid == PID]


def test_parse_message() -> None:
    assert _oom.parse_message(MESSAGE) == PARSED
    # Older torch spelled "capacty"; "0 bytes" is how format_size writes nothing.
    old = "Tried to allocate 2.00 GiB (GPU 0; 7.79 GiB total capacty; 0 bytes free"
    assert _oom.parse_message(old)["requested"] == 2 * GIB
    assert _oom.parse_message("something else entirely") == {}
    assert _oom.snapshot_modes({"GPUWATCH_SNAPSHOT": "oom|spike"}) == {"oom", "spike"}
    assert _oom.snapshot_modes({"GPUWATCH_SNAPSHOT": "Spike, nonsense"}) == {"spike"}
    assert _oom.snapshot_modes({}) == frozenset()


def test_oom_in_a_manual_phase(live: Session) -> None:
    with (
        pytest.raises(torch.OutOfMemoryError),
        gpuwatch.phase("train_step"),
        gpuwatch.phase("optimizer.step"),
    ):
        raise torch.OutOfMemoryError(MESSAGE)
    (body,) = _ooms(live)
    assert body == {
        **PARSED,
        "phase": "optimizer.step",  # the innermost phase; the outer one did not repeat it
        "step": 7,
        "message": MESSAGE,
    }
    proc = live.processes[PID]
    assert wait_for(lambda: len(proc.phases) == 2)
    assert list(proc.phases.snapshot()["error"]) == [1, 1]
    assert gpuwatch.step() == 7  # a failed step does not advance the counter


def test_oom_in_an_automatic_forward(live: Session) -> None:
    class Huge(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise torch.OutOfMemoryError(MESSAGE)

    assert _auto.install(discover=True)
    try:
        with pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate 20\.00 MiB"):
            Huge()(torch.zeros(1, 2))
        (body,) = _ooms(live)
        assert (body["phase"], body["step"], body["requested"]) == ("forward", 7, 20 * MIB)
        # Caught by the script, training goes on: the next forward is a phase again.
        model = nn.Linear(2, 2)
        model(torch.zeros(1, 2))
        gpuwatch.flush()
        proc = live.processes[PID]
        assert wait_for(lambda: len(proc.phases) == 2)
        assert list(proc.phases.snapshot()["error"]) == [1, 0]
    finally:
        _auto.uninstall()
        _watch._primary = None


def test_observer_report_is_not_repeated(live: Session) -> None:
    # What the CUDA allocator does: the observer first, then the error through the phases.
    with pytest.raises(torch.OutOfMemoryError), gpuwatch.phase("backward"):
        _oom._observer(0, 3 * GIB, 80 * GIB, 100 * MIB)
        raise torch.OutOfMemoryError(MESSAGE)
    # A second error that no observer saw is reported from its phase.
    with pytest.raises(torch.OutOfMemoryError), gpuwatch.phase("forward"):
        raise torch.OutOfMemoryError(MESSAGE)
    first, second = _ooms(live, 2)
    assert first == {
        "dev": 0,
        "requested": 3 * GIB,
        "total": 80 * GIB,
        "free": 100 * MIB,
        "phase": "backward",
        "step": 7,
        "message": MESSAGE,  # the error's (first) line, added when it left the phase
    }
    assert (second["phase"], second["requested"]) == ("forward", 20 * MIB)


def test_an_observed_oom_is_timed_inside_the_phase_it_broke(live: Session) -> None:
    """Sent when the error leaves the phase (it adds torch's text then), the event keeps
    the observer's time: at the OOM on the time axis, the broken phase still runs."""
    with pytest.raises(torch.OutOfMemoryError), gpuwatch.phase("forward"):
        _oom._observer(0, 3 * GIB, 80 * GIB, 100 * MIB)
        time.sleep(0.05)  # the allocator unwinding, the error built and raised
        raise torch.OutOfMemoryError(MESSAGE)
    _ooms(live)
    [oom] = [o for o in live.ooms if o.pid == PID]
    [proc] = [p for p in live.processes.values() if p.pid == PID]
    cols = proc.phases.snapshot()
    t0, t1 = int(cols["t0"][-1]), int(cols["t1"][-1])
    assert t0 <= oom.t < t1 - 40 * 10**6, (t0, oom.t, t1)


def test_an_observed_oom_the_script_catches_is_still_reported(live: Session) -> None:
    # The script catches the error inside the phase (skips the batch, say): no phase sees
    # it, so the observer's event goes out from the sender thread, without text.
    with gpuwatch.phase("forward"):
        _oom._observer(0, 5 * GIB, 80 * GIB, 0)
        try:
            raise torch.OutOfMemoryError(MESSAGE)
        except torch.OutOfMemoryError:
            pass
    assert _oom._O.pending is not None
    (body,) = _ooms(live)
    assert (body["phase"], body["requested"], body["message"]) == ("forward", 5 * GIB, None)
    assert _oom._O.pending is None


@pytest.fixture
def oom_snapshots(tmp_path: Path, monkeypatch) -> Path:
    """GPUWATCH_SNAPSHOT=oom into tmp_path (the fixture ``live`` restores the state)."""
    monkeypatch.setenv("GPUWATCH_SNAPSHOT_DIR", str(tmp_path))
    _oom._O.modes = frozenset({"oom"})
    _oom._O.snapshots = {"oom": 0, "spike": 0}
    return tmp_path


def _oom_in_forward(session: Session) -> dict:
    with pytest.raises(torch.OutOfMemoryError), gpuwatch.phase("forward"):
        raise torch.OutOfMemoryError(MESSAGE)
    (body,) = _ooms(session)
    return body


def test_snapshot_named_in_the_oom_event(live: Session, oom_snapshots: Path, monkeypatch) -> None:
    written: list[str] = []

    def fake_dump(path: str) -> None:  # the real one needs a CUDA allocator
        Path(path).write_bytes(b"snapshot")
        written.append(path)

    monkeypatch.setattr(_oom, "dump_snapshot", fake_dump)
    body = _oom_in_forward(live)
    assert body["snapshot"] == written[0]
    assert Path(written[0]).parent == oom_snapshots and f"-{PID}-step7-" in written[0]


def test_no_snapshot_without_cuda(live: Session, oom_snapshots: Path) -> None:
    assert _oom_in_forward(live)["snapshot"] is None
    assert list(oom_snapshots.iterdir()) == []


def test_spike_rule(live: Session, tmp_path: Path, monkeypatch) -> None:
    written: list[str] = []
    monkeypatch.setattr(_oom, "dump_snapshot", lambda path: written.append(path))
    monkeypatch.setenv("GPUWATCH_SNAPSHOT_DIR", str(tmp_path))
    _oom._O.modes = frozenset({"spike"})
    _oom._O.snapshots = {"oom": 0, "spike": 0}
    _oom._O.high = 0
    cuda = FakeCuda()
    memory = TorchMemory()
    memory.active, memory._torch = True, types.SimpleNamespace(cuda=cuda)
    memory.on_peak = _oom._on_peak
    monkeypatch.setattr(_api._state, "memory", memory)
    st = _api._state

    def boundary(step: int, peak: int) -> None:
        st.set_step(step)
        with gpuwatch.phase("backward"):
            cuda.peak = peak  # reached inside the phase: its end boundary reports it

    boundary(0, 1 * GIB)
    boundary(1, 3 * GIB)  # step 1: optimizer state appears; warm-up, no snapshot
    boundary(2, 3 * GIB + 200 * MIB)  # +6.5%: a new high, not a spike
    assert written == []
    boundary(3, 4 * GIB)  # ++23%: a spike
    assert len(written) == 1
    boundary(4, 4 * GIB + 100 * MIB)  # above the old high, not 10% above the new one
    assert len(written) == 1 and memory.watermark == 4 * GIB + 100 * MIB
    for i in range(5, 9):
        boundary(i, (i - 1) * GIB)  # a spike every step, but only MAX_SNAPSHOTS files
    assert len(written) == _oom.MAX_SNAPSHOTS and memory.on_peak is None
    gpuwatch.flush()
    assert wait_for(lambda: len([m for m in live.marks if m.pid == PID]) >= 3)
    mark = next(m for m in live.marks if m.pid == PID)
    assert mark.level == "warning" and mark.step == 3
    assert mark.text.endswith(f": {written[0]}") and "4.00 GiB in backward" in mark.text


@pytest.mark.gpu
def test_real_cuda_oom(live: Session, sock_path: str, sub_env: dict, tmp_path: Path) -> None:
    """On a GPU: the allocator's observer reports a real OOM, with a snapshot file."""
    code = (
        "import torch, gpuwatch\n"
        "x = torch.ones(1, device='cuda')\n"
        "try:\n"
        "    with gpuwatch.phase('forward'):\n"
        "        torch.empty(1 << 50, dtype=torch.uint8, device='cuda')\n"
        "except torch.OutOfMemoryError:\n"
        "    print('caught')\n"
    )
    env = {**sub_env, "GPUWATCH_SNAPSHOT": "oom", "GPUWATCH_SNAPSHOT_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "caught" in out.stdout, out.stderr
    assert wait_for(lambda: len(live.ooms) == 1)
    body = live.ooms[0].body
    assert body["requested"] == 1 << 50 and body["phase"] == "forward"
    assert body["total"] > 0 and body["free"] is not None and body["allocated"] >= 0
    assert body["snapshot"] and Path(body["snapshot"]).stat().st_size > 0
