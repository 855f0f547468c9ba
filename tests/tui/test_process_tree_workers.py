"""A DataLoader's workers in the Processes tab's tree: a real torch DataLoader with two
worker processes on the CPU, its trainer listed on a fake GPU; the workers use no GPU and
send nothing, and show under the trainer all the same (issue 38: "a DataLoader's
workers")."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import pytest
from conftest import until, wait_for

from gpuwatch.analysis import processes as pr
from gpuwatch.session import Session
from gpuwatch.sources import children
from gpuwatch.sources.gpu import GpuSampler
from gpuwatch.sources.host import HostSampler
from gpuwatch.sources.nvml import Nvml
from gpuwatch.tui.app import GpuwatchApp
from tests.fake_nvml import FakeNvml, GiB

pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not psutil.LINUX, reason="a process's children are read from Linux's /proc"
)

TRAINER = r"""
import os, time
import torch
from torch.utils.data import DataLoader, Dataset

class Numbers(Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        return torch.full((4,), float(i))

loader = DataLoader(Numbers(), batch_size=8, num_workers=2, persistent_workers=True)
batches = iter(loader)
next(batches)  # the workers run from here on
print("ready", flush=True)
time.sleep(600)
"""


@contextmanager
def trainer() -> Iterator[tuple[int, list[int]]]:
    proc = subprocess.Popen([sys.executable, "-c", TRAINER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        workers = sorted(c.pid for c in psutil.Process(proc.pid).children())
        assert len(workers) == 2
        yield proc.pid, workers
    finally:
        for c in psutil.Process(proc.pid).children(recursive=True):
            c.kill()
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("where", ["on a GPU", "instrumented on the CPU"])
async def test_a_dataloaders_workers_show_under_their_trainer(monkeypatch, where: str) -> None:
    monkeypatch.setattr(children, "EVERY", 0.2)
    with trainer() as (pid, workers):
        s = Session()
        fake = FakeNvml(1)
        if where == "on a GPU":
            fake.set_process(0, pid, 2 * GiB, sm=40)
        else:  # an instrumented process (its hello) the host sampler follows
            from gpuwatch.protocol import Message

            s.ingest(Message(kind="hello", pid=pid, seq=0, t=1, body={"argv": ["train.py"]}))
        sampler = GpuSampler(s, nvml=Nvml(fake), process_interval=0.2)
        host = HostSampler(s)
        assert sampler.start()
        host.start()
        try:
            assert wait_for(lambda: s.proc_info.get(pid, {}).get("children") == workers, timeout=20)
            assert all(s.proc_info[w]["ppid"] == pid for w in workers)
            listed = pr.rows(s)
            assert pid in {r.pid for r in listed}
            assert not {r.pid for r in listed} & set(workers)  # not rows of their own
            tree = [(r.pid, r.depth, r.listed) for r in pr.tree(s, listed)]
            i = next(k for k, (p, _, listed_) in enumerate(tree) if p == pid and listed_)
            depth = tree[i][1]
            assert sorted(tree[i + 1 : i + 3]) == [(w, depth + 1, False) for w in workers]

            app = GpuwatchApp(s)
            async with app.run_test(size=(120, 30)) as pilot:
                await pilot.press("3", "t")

                def workers_under_it() -> bool:
                    # The tables refresh a few times a second; the tree comes with one.
                    shown = app.dashboard.process_table.shown
                    j = next((k for k, r in enumerate(shown) if r.pid == pid), None)
                    return j is not None and sorted(r.pid for r in shown[j + 1 : j + 3]) == workers

                assert await until(pilot, workers_under_it), app.dashboard.process_table.shown
                shown = app.dashboard.process_table.shown
                j = next(k for k, r in enumerate(shown) if r.pid == pid)
                cells = [app.dashboard.process_table.get_row_at(k) for k in (j + 1, j + 2)]
                assert all("─ " in c[10] for c in cells), cells  # drawn as branches
        finally:
            host.stop()
            sampler.stop()


def test_a_worker_that_ended_leaves_the_tree(monkeypatch) -> None:
    monkeypatch.setattr(children, "EVERY", 0.2)
    with trainer() as (pid, workers):
        s = Session()
        fake = FakeNvml(1)
        fake.set_process(0, pid, 2 * GiB)
        sampler = GpuSampler(s, nvml=Nvml(fake), process_interval=0.2)
        assert sampler.start()
        try:
            assert wait_for(lambda: s.proc_info.get(pid, {}).get("children") == workers, 20)
            psutil.Process(workers[0]).kill()  # the DataLoader's parent reaps it
            # torch's loader may start no new worker until asked: the one left is listed.
            assert wait_for(
                lambda: workers[0] not in s.proc_info[pid].get("children", []), timeout=20
            )
            tree = pr.tree(s, pr.rows(s))
            assert workers[0] not in {r.pid for r in tree}
        finally:
            sampler.stop()
