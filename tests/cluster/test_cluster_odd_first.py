"""Issue 51, item 11: the cluster view at 80x24, under Pilot over a scripted Prometheus on a
real socket. Nine hosts of 4 GPUs; the last by name (``z-node``) stops exporting and its
GPUs go stale: they come first in the default (host) order, on the first screen, and the
summary names the host. On main they sorted below the fold and the summary said only
"4 stale"."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import screen_text, until
from promstub import PromStub, Stub, gpu_series, merge

from gpuwatch.cluster import PromClient
from gpuwatch.tui.cluster import ClusterApp

HOSTS = [f"{c}-node" for c in "abcdefgh"] + ["z-node"]


@pytest.fixture
def served() -> Iterator[tuple[Stub, PromStub]]:
    s = Stub(families=merge(*(gpu_series(h, 4, used_gib=10 + i) for i, h in enumerate(HOSTS))))
    server = PromStub(s)
    yield s, server
    server.close()


async def test_stale_gpus_are_on_the_first_screen_and_named(served) -> None:
    s, server = served
    app = ClusterApp(PromClient(server.url), [])
    async with app.run_test(size=(80, 24)) as pilot:
        assert await until(pilot, lambda: app.refreshes >= 1)
        assert app.sort == "host"
        s.families = merge(*(gpu_series(h, 4, used_gib=10 + i) for i, h in enumerate(HOSTS[:-1])))
        app.refresh_cluster()
        assert await until(pilot, lambda: "4 stale" in screen_text(app), timeout=15)
        await pilot.pause()
        text = screen_text(app)
        assert "4 stale on z-node" in text, text
        rows = [line for line in text.splitlines() if "stale" in line and "G/80.0G" in line]
        assert len(rows) == 4, text  # every stale GPU, without a scroll
        lines = text.splitlines()
        z = next(i for i, x in enumerate(lines) if "z-node" in x and "GPUs" in x)
        a = next(i for i, x in enumerate(lines) if "a-node" in x and "GPUs" in x)
        assert z < a, text  # the host with GPUs not ok leads
