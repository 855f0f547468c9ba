"""The cluster view under Pilot, reading a scripted Prometheus on a real socket."""

from __future__ import annotations

import itertools
import json
import re
import shlex
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, screen_text, until, wait_for
from hypothesis import given, settings
from hypothesis import strategies as st
from promstub import GiB, PromStub, Stub, gpu_series, merge, rank_series
from tmuxhelp import Tmux

from gpuwatch.cluster import Auth, PromClient
from gpuwatch.cluster.model import FAMILIES
from gpuwatch.tui.cluster import ClusterApp, GpuBlock, HostScreen

SIZE = (140, 45)
TOKEN = "tok-7d1e0c55aa"
JOB = {"job_id": "torchrun:node-a:29500"}
ON_B1 = {"gpu": "1", "uuid": "GPU-1", "name": "H100", "host": "node-b", "instance": "node-b:9400"}
OTHER = {**ON_B1, "pid": "5151", "user": "bob", "command": "ollama", "instrumented": "0"}
MINE = {**ON_B1, "pid": "202", "user": "alice", "command": "python", "instrumented": "1"}


@pytest.fixture
def served() -> Iterator[tuple[Stub, PromStub]]:
    s = Stub(
        families=merge(
            gpu_series("node-a", 2, used_gib=70),
            gpu_series("node-b", 2, used_gib=10),
            rank_series("node-a", 0, 0, 101, {"forward": 2 * GiB, "backward": 3 * GiB}, **JOB),
            rank_series("node-b", 1, 1, 202, {"forward": 2 * GiB, "backward": 9 * GiB}, **JOB),
            {"gpuwatch_gpu_process_memory_bytes": [(OTHER, 4 * GiB), (MINE, 9 * GiB)]},
        )
    )
    server = PromStub(s)
    yield s, server
    server.close()


async def test_grid_ranks_sort_filter_and_drill_down(served) -> None:
    s, server = served
    app = ClusterApp(PromClient(server.url), [])
    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: app.refreshes >= 1)
        await pilot.pause()
        text = screen_text(app)
        assert "4 GPUs · 2 hosts · 2 ranks" in text
        assert "fullest node-a:1" in text and "worst rank 1 on node-b" in text
        for line in ("node-a", "node-b", "70.0G/80.0G", "forward @10", "50%", "61°C", "301W"):
            assert line in text, text
        # The process gpuwatch does not instrument, on its GPU's row; the rank is not one.
        (b1,) = [line for line in text.splitlines() if "11.0G/80.0G" in line]
        assert "bob ollama 4.0G" in b1 and "alice" not in text, b1
        # One query a refresh for every family, whatever the number of GPUs.
        per_refresh = [r for r in s.requests if r.path == "/api/v1/query"]
        assert len(per_refresh) == app.refreshes
        assert all(name in per_refresh[0].params["query"] for name in FAMILIES)
        # Sort: memory puts the fullest host first.
        await pilot.press("s")
        assert app.sort == "rank"
        await pilot.press("s")
        assert app.sort == "memory"
        assert app._rows[0][0] == "host\x00node-a"
        # Filter.
        await pilot.press("slash", *"node-b", "enter")
        await pilot.pause()
        assert [k for k, _ in app._rows] == ["host\x00node-b", "gpu\x00node-b:1", "gpu\x00node-b:0"]
        await pilot.press("escape")
        await pilot.pause()
        assert len(app._rows) == 6
        # The ranks tab: the ranks model's table.
        await pilot.press("2")
        assert await until(pilot, lambda: "ranks: 2" in screen_text(app))
        text = screen_text(app)
        assert "ranks: 2" in text and "9.0G (rank 1)" in text and "above the" in text, text
        assert "job torchrun:node-a:29500" in text
        await pilot.press("1")
        # Enter on a row: its host's panels, from range queries.
        await pilot.press("end")  # node-b:0, the last row of the memory sort
        assert app._selected_key() == "gpu\x00node-b:0"
        await pilot.press("home")
        assert app._selected_key() == "host\x00node-a"
        app.grid.cursor = [k for k, _ in app._rows].index("gpu\x00node-b:1")
        await pilot.press("enter")
        assert await until(pilot, lambda: isinstance(app.screen, HostScreen))
        screen = app.screen
        assert screen.host == "node-b"
        assert await until(pilot, lambda: len(screen.query(GpuBlock)) == 2)
        ranges = [r.params["query"] for r in s.requests if r.path == "/api/v1/query_range"]
        assert ranges and all('host="node-b"' in q for q in ranges)
        block = screen.query(GpuBlock).first()

        def roles() -> list[str]:
            # The history's answers come in after its queries went out.
            chart = block.chart.fetch(screen.history.start, screen.history.end, 20)
            return [x.role for x in chart.series]

        expected = ["predicted", "nvml", "reserved", "allocated", "peak"]
        assert await until(pilot, lambda: roles() == expected), roles()
        title = "GPU 1 · util 51% · 61°C · 301W · not instrumented: bob ollama 4.0G"
        assert await until(pilot, lambda: title in screen_text(app)), screen_text(app)
        await pilot.press("escape")
        assert await until(pilot, lambda: not isinstance(app.screen, HostScreen))


async def test_80x24_keeps_state_phase_and_used_and_the_summary_whole(served) -> None:
    # Sixteen GPUs at 80x24: every row shows its used/total, phase and state (the state
    # column was past the edge), the summary its worst rank, interval and sort; a
    # 128-character phase name leaves the ranks table narrower than the screen.
    s, server = served
    job = {"job_id": "slurm:912345678.0"}
    s.families = merge(
        *(gpu_series(f"gpu-node-{i:02d}", 4, used_gib=60 + i) for i in range(4)),
        *(
            rank_series(f"gpu-node-{i:02d}", g, 4 * i + g, 100 + 4 * i + g, peaks, **job)
            for i in range(4)
            for g in range(4)
            for peaks in [{"backward": (3 + (i == 2 and g == 1) * 2) * GiB, "p" * 128: GiB}]
        ),
    )
    app = ClusterApp(PromClient(server.url), [])
    async with app.run_test(size=(80, 24)) as pilot:
        assert await until(pilot, lambda: app.refreshes >= 1)

        def drawn() -> bool:
            # The refresh's figures are in the widgets; the screen shows them once drawn.
            lines = screen_text(app).splitlines()
            summary = " ".join(lines[:2])
            rows = [ln for ln in lines[2:] if "G/80.0G" in ln]
            return (
                all(w in summary for w in ("16 GPUs", "worst rank 9", "every 1 s", "sort host"))
                and len(rows) >= 10
                and all(re.search(r"  ok\b", r) and "forward @10" in r for r in rows)
            )

        assert await until(pilot, drawn), screen_text(app)
        text = screen_text(app)
        lines = text.splitlines()
        assert all(len(line) <= 80 for line in lines)
        summary = " ".join(lines[:2])
        for part in ("16 GPUs", "worst rank 9 on gpu-node-02 (slurm:912345678.0)", "every 1 s"):
            assert part in summary, summary
        assert "sort host" in summary, summary
        rows = [line for line in lines[2:] if "G/80.0G" in line]
        assert len(rows) >= 10, text
        for row in rows:
            assert re.search(r"  ok\b", row) and "forward @10" in row, text
        head = next(line for line in lines if "used/total" in line)
        assert "state" in head and "phase @step" in head and "memory" not in head, head
        # Wider, the dropped columns come back.
        await pilot.resize_terminal(200, 50)

        def head() -> str:
            return next(line for line in screen_text(app).splitlines() if "used/total" in line)

        assert await until(
            pilot, lambda: all(w in head() for w in ("memory", "util", "peak/pred"))
        ), head()
        await pilot.resize_terminal(80, 24)
        assert await until(pilot, lambda: "memory" not in head()), head()
        await pilot.press("2")
        # The tab's title line and its table (a long phase name cut short) come drawn.
        assert await until(
            pilot, lambda: all(w in screen_text(app) for w in ("ranks: 16", "ppppppp…"))
        ), screen_text(app)
        text = screen_text(app)
        assert "ranks: 16" in text and "ppppppp…" in text, text
        table = [line for line in text.splitlines() if "gpu-node-0" in line]
        assert table and all(len(line.rstrip()) <= 80 for line in text.splitlines()), text
        assert app.ranks_view.size.width <= 80


async def test_refreshes_slower_than_the_interval_go_on(served) -> None:
    # Each refresh takes longer than the 1 s interval (its query answered after 1.2 s):
    # the next comes at once. The timer it set was of 0 s, which Textual never
    # fires: the view stopped refreshing after the first slow answer.
    s, server = served
    app = ClusterApp(PromClient(server.url), [])
    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: app.refreshes >= 1)
        s.delay = 1.2
        app.refresh_cluster()
        assert await until(pilot, lambda: app.refreshes >= 4, timeout=30), app.refreshes
        assert all(q > app.interval for q, _ in list(app.latencies)[2:])


async def test_a_refresh_due_as_the_view_closes_asks_nothing(served) -> None:
    # A refresh timer can fire while the view closes, its screens already gone: reading
    # the screen there raised ScreenStackError and the view ended with an error (seen
    # once in a full suite run).
    s, server = served
    app = ClusterApp(PromClient(server.url), [])
    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: app.refreshes >= 1)
    assert app.screen_stack == []
    asked = len(s.requests)
    app._start()  # what the timer's callback does
    assert len(s.requests) == asked


async def test_slow_families_are_asked_every_nth_refresh_and_for_a_new_gpu(
    served, monkeypatch
) -> None:
    from gpuwatch.cluster import SLOW
    from gpuwatch.tui.cluster import app as app_module

    monkeypatch.setattr(app_module, "SLOW_EVERY", 3)
    s, server = served
    for rank, host in ((0, "node-a"), (1, "node-b")):
        info = {"pid": str(101 + 101 * rank), "rank": str(rank), "host": host}
        s.families.setdefault("gpuwatch_rank_info", []).append(({**info, **JOB}, 1))
    app = ClusterApp(PromClient(server.url), [])
    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: app.refreshes >= 4, timeout=20)
        asked = [r.params["query"] for r in s.requests if r.path == "/api/v1/query"]
        slow = [all(f in q for f in SLOW) for q in asked[:4]]
        none = [not any(f in q for f in SLOW) for q in asked[:4]]
        assert slow == [True, False, False, True] and none == [False, True, True, False]
        # A new host: its totals asked at the next refresh, not the third.
        s.families = merge(s.families, gpu_series("node-c", 1, used_gib=5))
        assert await until(pilot, lambda: "node-c:0" in app.cluster.gpus, timeout=10)
        n = app.refreshes
        assert await until(pilot, lambda: app.refreshes >= n + 1, timeout=10)
        assert app.cluster.gpus["node-c:0"].total == 80 * GiB
        await pilot.pause()
        assert "5.0G/80.0G" in screen_text(app)


async def test_only_the_rows_in_view_are_formatted_again(monkeypatch) -> None:
    from gpuwatch.tui.cluster import grid as grid_module

    hosts = [f"node-{i:02d}" for i in range(16)]
    s = Stub(families=merge(*(gpu_series(h, 8, used_gib=10) for h in hosts)))
    server = PromStub(s)
    formatted: list[str] = []
    real = grid_module.cell_columns

    def counted(g, now):
        formatted.append(g.key)
        return real(g, now)

    monkeypatch.setattr(grid_module, "cell_columns", counted)
    app = ClusterApp(PromClient(server.url), [])
    try:
        async with app.run_test(size=SIZE) as pilot:
            assert await until(pilot, lambda: app.refreshes >= 1)
            await pilot.pause()
            assert len(set(formatted)) == 128  # the first layout: every row
            shown = app.grid.shown()
            assert shown is not None and len(shown) < 100
            # Every GPU's figures move: only the rows in view (and a margin) are formatted.
            s.families = merge(*(gpu_series(h, 8, used_gib=20) for h in hosts))
            formatted.clear()
            n = app.refreshes
            assert await until(pilot, lambda: app.refreshes > n)
            await pilot.pause()
            assert formatted and len(formatted) <= len(shown), len(formatted)
            assert "20.0G/80.0G" in screen_text(app) and "10.0G/80.0G" not in screen_text(app)
            # Scrolled to the end: the rows that come into view show their figures now.
            await pilot.press("end")
            await pilot.pause()
            text = screen_text(app)
            assert "node-15" in text and "27.0G/80.0G" in text, text
            assert "10.0G/80.0G" not in text and "17.0G/80.0G" not in text, text
    finally:
        server.close()


async def test_row_figures_are_asked_near_the_view_and_at_once_for_rows_scrolled_to() -> None:
    def families() -> dict[str, list]:
        out = merge(*(gpu_series(f"node-{i:02d}", 8, used_gib=10) for i in range(16)))
        out["gpuwatch_gpu_utilization_ratio"] = [  # 10% on node-00 ... 25% on node-15
            (m, 0.10 + int(m["host"][5:]) / 100) for m, _ in out["gpuwatch_gpu_utilization_ratio"]
        ]
        return out

    s = Stub(families=families(), scrape_interval="30s")  # no timed refresh during the test
    server = PromStub(s)

    def asked() -> list[str]:
        """The targets of each query of the row figures so far (all: none named)."""
        out = []
        for r in s.requests:
            query = r.params.get("query", "")
            if "gpuwatch_gpu_utilization_ratio" in query:
                m = re.search(r'instance=~"([^"]*)"', query)
                out.append(m.group(1).replace("\\\\", "") if m else "all")
        return out

    app = ClusterApp(PromClient(server.url), [])
    try:
        async with app.run_test(size=SIZE) as pilot:
            assert await until(pilot, lambda: app.refreshes >= 1)
            assert asked() == ["all"]  # the grid not laid out yet: every target
            await pilot.pause()
            app.refresh_cluster()
            assert await until(pilot, lambda: app.refreshes >= 2)
            await pilot.pause()
            near = asked()[-1].split("|")
            assert "node-00:9400" in near and "node-15:9400" not in near, near
            assert 2 <= len(near) < 16, near
            text = screen_text(app)
            assert "node-00  8 GPUs" in text and "10%" in text and "node-15  8 GPUs" not in text
            assert app.cluster.gpus["node-15:0"].util is None
            # The end of the grid, whose row figures the last refresh did not ask: asked at
            # once (the next timed refresh is 30 s away), shown when the answer is in.
            n = app.refreshes
            await pilot.press("end")
            assert await until(pilot, lambda: "25%" in screen_text(app), timeout=5)
            assert app.refreshes == n + 1
            assert "node-15:9400" in asked()[-1].split("|"), asked()
            # Scrolling within what was asked asks nothing more.
            await pilot.press("up")
            await pilot.pause(0.3)
            assert app.refreshes == n + 1
    finally:
        server.close()


async def test_the_drill_down_asks_only_the_new_steps(served) -> None:
    s, server = served
    app = ClusterApp(PromClient(server.url), [])
    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: app.refreshes >= 1)
        app.open_host("node-b")
        assert await until(pilot, lambda: isinstance(app.screen, HostScreen))
        screen = app.screen
        assert await until(pilot, lambda: screen.version >= 3, timeout=20)
        spans = [
            float(r.params["end"]) - float(r.params["start"])
            for r in s.requests
            if r.path == "/api/v1/query_range"
        ]
        # The first load asks the window (300 s, every line in one query); the later ones
        # only what is new.
        assert spans[0] == 300 and max(spans[1:]) <= 10, spans
        assert screen.history is not None and screen.history.end - screen.history.start == 300e9
        await pilot.press("plus")  # a longer window: asked whole
        assert await until(pilot, lambda: screen.history.end - screen.history.start == 900e9)


async def test_the_grid_is_not_laid_out_under_a_host_s_panels(served) -> None:
    s, server = served
    app = ClusterApp(PromClient(server.url), [])
    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: app.refreshes >= 1)
        await pilot.pause()
        assert "70.0G/80.0G" in screen_text(app)
        app.open_host("node-a")
        assert await until(pilot, lambda: isinstance(app.screen, HostScreen))
        rows = app._rows
        # node-a's first GPU fills up while its panels cover the grid, and node-b's.
        used = s.families["gpuwatch_gpu_memory_used_bytes"]
        used[0] = (used[0][0], 75 * GiB)
        used[2] = (used[2][0], 33 * GiB)
        n, asked = app.refreshes, len(s.requests)
        assert await until(pilot, lambda: app.refreshes >= n + 2)
        assert app.cluster.gpus["node-a:0"].used == 75 * GiB  # folded in ...
        assert app._rows is rows  # ... but the hidden grid was not laid out again
        # Under the panels only node-a's figures are asked (its panels' titles show them).
        under = [r.params["query"] for r in s.requests[asked:] if r.path == "/api/v1/query"]
        assert under and all('host="node-a"' in q for q in under), under
        assert all("gpuwatch_process_" not in q and "total" not in q for q in under)
        assert app.cluster.gpus["node-b:0"].used == 10 * GiB
        await pilot.press("escape")
        await pilot.pause()
        # Back on the grid: drawn at once from the cluster as it is, not a refresh later,
        # and every host asked again at once.
        assert not isinstance(app.screen, HostScreen)
        assert app._rows is not rows
        assert "75.0G/80.0G" in screen_text(app)
        assert await until(pilot, lambda: "33.0G/80.0G" in screen_text(app), timeout=0.9)


async def test_prometheus_gone_keeps_the_figures_marked_stale(served) -> None:
    _s, server = served
    app = ClusterApp(PromClient(server.url, timeout=0.5), [])
    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: app.refreshes >= 1)
        server.close()
        app.refresh_cluster()
        assert await until(pilot, lambda: app.cluster.error is not None, timeout=15)
        await pilot.pause()
        text = screen_text(app)
        assert "! " in text and "unreachable" in text, text
        assert "70.0G/80.0G" in text and "stale" in text
        assert "Traceback" not in text


async def test_the_token_never_reaches_the_screen(served) -> None:
    s, server = served
    s.token = TOKEN

    def echo(path: str, params: dict[str, str]) -> tuple[int, bytes]:
        header = s.requests[-1].headers.get("Authorization", "")
        body = {"status": "error", "errorType": "bad_data", "error": f"no: {header}"}
        return 400, json.dumps(body).encode()

    s.raw = echo
    app = ClusterApp(PromClient(server.url, Auth(token=TOKEN)), [])
    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: app.cluster.error is not None)
        await pilot.pause()
        assert s.requests[0].headers["Authorization"] == f"Bearer {TOKEN}"
        text = screen_text(app)
        assert "bad_data: no: Bearer ***" in text and TOKEN not in text, text


async def test_hostile_labels_show_as_typed(served) -> None:
    s, server = served
    s.families = gpu_series("[red]evil[/red]\x1b[2J", 1)
    app = ClusterApp(PromClient(server.url), [])
    async with app.run_test(size=SIZE) as pilot:
        assert await until(pilot, lambda: "[red]evil[/red]\\x1b[2J" in screen_text(app))
        assert "\x1b" not in screen_text(app)


def quit_seconds(stub: Stub, url: str, folder: Path, delay: float) -> float:
    """The real CLI in tmux: seconds from ``q`` to the end of the process, pressed while
    a refresh to a Prometheus that answers after ``delay`` seconds is in flight."""
    stamp = folder / f"ended-{delay}"
    env = {"PYTHONPATH": str(ROOT), "GPUWATCH_PROMETHEUS_TOKEN": ""}
    command = (
        f"{shlex.quote(sys.executable)} -m gpuwatch cluster --prometheus {url} "
        f"--timeout 10; date +%s.%N > {shlex.quote(str(stamp))}"
    )
    tmux = Tmux(command, env)
    try:
        assert tmux.wait_for_text("4 GPUs · 2 hosts", timeout=60), tmux.screen()
        stub.delay = delay
        asked = len(stub.requests)
        tmux.keys("r")
        assert wait_for(lambda: len(stub.requests) > asked, timeout=10)  # a query in flight
        pressed = time.time()
        tmux.keys("q")
        assert wait_for(stamp.exists, timeout=20), tmux.screen()
        assert tmux.wait_for_text("EXIT=0", timeout=5), tmux.screen()
        assert "Traceback" not in tmux.screen()
        return float(stamp.read_text()) - pressed
    finally:
        tmux.close()
        stub.delay = 0.0


@pytest.mark.tmux
def test_quitting_never_waits_for_a_slow_prometheus(served, tmp_path: Path) -> None:
    # q while a query to a Prometheus that takes 8 s to answer is in flight (its timeout is
    # 10 s) ends the process about as fast as q on a healthy one, measured in the same run
    # (the machine is shared: 1.1-2.1 s both under a load of 15 on 2 cores). It waited for
    # the answer (an executor's thread is joined when
    # the interpreter exits): 4.9 s at the default timeout, 9.7 s with --timeout 8.
    s, server = served
    healthy = quit_seconds(s, server.url, tmp_path, 0.0)
    slow = quit_seconds(s, server.url, tmp_path, 8.0)
    print(f"q: {healthy:.2f} s healthy, {slow:.2f} s with a query in flight")
    assert slow < healthy + 1.5 and slow < 5.0, (healthy, slow)


def test_a_cancelled_wait_leaves_the_call_behind() -> None:
    # The helper under it: a call that hangs is left on a daemon thread.
    from gpuwatch.cluster.background import Cancelled, call, each

    cancel = []
    began = time.monotonic()
    with pytest.raises(Cancelled):
        threading.Timer(0.2, lambda: cancel.append(1)).start()
        call(lambda: time.sleep(30), lambda: bool(cancel))
    assert time.monotonic() - began < 1.0
    assert each(lambda x: x * 2, [1, 2, 3, 4, 5], 2) == [2, 4, 6, 8, 10]
    with pytest.raises(ValueError):
        each(lambda x: int(x), ["1", "x"], 2)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_row_s_joined_runs_are_its_columns_cell_by_cell(data) -> None:
    # Neighbouring runs of one style are joined (fewer segments to paint): every cell's
    # character and style are still those of its column, padded or cut to its width.
    from gpuwatch.cluster.text import HEAD
    from gpuwatch.fmt import ellipsis
    from gpuwatch.tui.cluster.grid import STYLES, _Cells, _fit

    n = len(HEAD)
    cols = data.draw(st.lists(st.text("ab ", max_size=8), min_size=n, max_size=n))
    styles = data.draw(st.lists(st.sampled_from(sorted(STYLES)), min_size=n, max_size=n))
    keep = sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1)))
    widths = data.draw(st.lists(st.integers(1, 9), min_size=len(keep), max_size=len(keep)))
    runs = _fit(_Cells(None, cols, tuple(map(len, cols)), tuple(styles)), keep, widths)
    want = [(" ", None)]
    for i, (k, w) in enumerate(zip(keep, widths, strict=True)):
        if i:
            want += [(" ", None)] * 2
        want += [(ch, STYLES[styles[k]]) for ch in ellipsis(cols[k], w).ljust(w)]
    assert [(ch, style) for text, style in runs for ch in text] == want
    assert all(a[1] is not b[1] for a, b in itertools.pairwise(runs))  # neighbours differ
