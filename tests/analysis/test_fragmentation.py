"""Fragmentation figures: from the one allocator read at each boundary, over the real
socket into the session, the recording, the breakdown bar and the retry marks."""

from __future__ import annotations

import json
import os
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import synthetic
from conftest import wait_for
from phasecheck import receiver
from textual.app import App, ComposeResult

import gpuwatch
from gpuwatch import protocol
from gpuwatch.analysis.breakdown import Breakdown
from gpuwatch.instrument import _api
from gpuwatch.instrument._torchmem import TorchMemory
from gpuwatch.session import MISSING_INT, Session
from gpuwatch.store import load
from gpuwatch.store.writer import save_session
from gpuwatch.tui.breakdown import PATTERN, BreakdownBar

GIB = 2**30
PID = os.getpid()


class _FakeCuda:
    """The parts of torch.cuda a boundary reads, with a scripted allocator."""

    def __init__(self) -> None:
        self.allocated = self.split = self.retries = self.ooms = 0
        self.reads = 0

    def current_device(self) -> int:
        return 0

    def memory_stats_as_nested_dict(self, idx: int) -> dict:
        self.reads += 1
        a = self.allocated
        return {
            "allocated_bytes": {"all": {"current": a, "peak": a}},
            "reserved_bytes": {"all": {"current": a + 2 * GIB, "peak": a + 2 * GIB}},
            "inactive_split_bytes": {"all": {"current": self.split}},
            "num_alloc_retries": self.retries,
            "num_ooms": self.ooms,
        }

    def reset_peak_memory_stats(self, idx: int) -> None:
        pass


@pytest.fixture
def cuda(sock_path: str, monkeypatch) -> Iterator[tuple[Session, _FakeCuda]]:
    gen = receiver(sock_path)
    session = next(gen)
    gpuwatch.configure(socket=sock_path, enabled=True)
    fake = _FakeCuda()
    memory = TorchMemory()
    memory.active, memory._torch = True, types.SimpleNamespace(cuda=fake)
    memory.on_retry = _api._retry_mark
    monkeypatch.setattr(_api._state, "memory", memory)
    _api._state.stack().clear()
    yield session, fake
    gpuwatch.flush()
    gen.close()


def test_one_read_per_boundary_carries_the_fragmentation_figures(cuda) -> None:
    session, fake = cuda
    fake.allocated, fake.split = 5 * GIB, GIB // 4
    with gpuwatch.phase("forward"):
        fake.allocated, fake.split, fake.retries = 7 * GIB, GIB // 2, 2
    assert fake.reads == 2  # one read of the allocator's stats per boundary, no more
    with gpuwatch.phase("backward"):
        pass  # no new retries: no second mark
    gpuwatch.flush()
    assert wait_for(lambda: PID in session.processes and len(session.processes[PID].phases) == 2)
    cols = session.processes[PID].torch.snapshot()
    assert cols["inactive_split"].tolist()[:2] == [GIB // 4, GIB // 2]
    assert cols["alloc_retries"].tolist()[:2] == [0, 2]
    assert cols["alloc_ooms"].tolist()[:2] == [0, 0]
    assert wait_for(lambda: len(session.marks) == 1)
    (mark,) = session.marks
    assert mark.level == "warning"
    assert mark.text.startswith("allocator retried cudaMalloc 2x (2 in all)")


def test_the_encoder_writes_them_and_the_receiver_keeps_them() -> None:
    fig = (0, 5, 7, 9, 11, 3, 4, 1)
    data = protocol.encode_phase(1, 2, 3, 0, "end", "forward", 5, None, 0, 1, fig)
    body = protocol.decode(data).body
    assert (body["inactive_split"], body["alloc_retries"], body["alloc_ooms"]) == (3, 4, 1)
    old = protocol.encode_phase(1, 2, 3, 0, "end", "forward", 5, None, 0, 1, fig[:5])
    assert "inactive_split" not in json.loads(old)  # an older sender's five figures
    bad = json.loads(data) | {"alloc_retries": -1}
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(json.dumps(bad).encode())


def test_recordings_keep_them_and_older_ones_read_as_unknown(tmp_path: Path) -> None:
    session = synthetic.build(steps=2)
    t = synthetic.end_time() + 1
    body = {"dev": 0, "allocated": GIB, "reserved": 2 * GIB, "inactive_split": 123}
    body |= {"alloc_retries": 4, "alloc_ooms": 1}
    session.ingest(protocol.Message("memory", synthetic.PID, 10**9, t, body=body))
    loaded = load(save_session(session, tmp_path / "frag.gpuwatch"))
    last = loaded.processes[synthetic.PID].torch.last()
    assert (last["inactive_split"], last["alloc_retries"], last["alloc_ooms"]) == (123, 4, 1)
    # A real H100 recording made before the allocator's counters were recorded.
    old = load(Path(__file__).parents[2] / "tests" / "data" / "gpt2-small-h100-0b9a063.gpuwatch")
    (proc,) = old.processes.values()
    assert set(proc.torch.snapshot()["inactive_split"].tolist()) == {MISSING_INT}


class _BarApp(App):
    def __init__(self, data: Breakdown) -> None:
        super().__init__()
        self.data = data

    def compose(self) -> ComposeResult:
        yield BreakdownBar(id="bar")

    def on_mount(self) -> None:
        self.query_one(BreakdownBar).show(self.data)


async def test_the_bar_draws_fragmentation_unclaimed_and_an_over_prediction() -> None:
    data = Breakdown(
        total=100 * GIB,
        used=60 * GIB,
        unclaimed=10 * GIB,
        reserved=50 * GIB,
        allocated=40 * GIB,
        cache=10 * GIB,
        fragmented=4 * GIB,
        predicted={"weights": 30 * GIB, "activations": 20 * GIB},
        unexplained=-10 * GIB,
    )
    app = _BarApp(data)
    async with app.run_test(size=(100, 4)) as pilot:
        await pilot.pause()
        bar, labels = app.query_one(BreakdownBar).render().plain.split("\n")
    # One cell per GiB: unclaimed 10, fragmented 4, cache 6, weights 30 (never scaled),
    # activations cut at what is allocated (10 of 20): the bar ends at the used memory,
    # and the 10 GiB the prediction has beyond it are named, not drawn.
    assert len(bar) == 100
    assert bar[:10] == PATTERN["unclaimed"] * 10
    assert bar[10:14] == PATTERN["fragmented"] * 4
    assert bar[14:20] == " " * 6
    assert bar[20:60] == " " * 40
    assert bar[60:] == "░" * 40
    assert "weights 30.0G" in labels and "act 10.0G" in labels
    assert "over-predicted 10.0G" in labels and "fragmented 4.0G" in labels
