"""Issue 38, items 2 and 3: every GPU at a glance, and MIG instances as devices.

The overview is the first screen when the device panels do not all fit (8 GPUs, or 2 at
80x24); ``enter`` or ``tab`` opens a GPU's panel and ``g`` (or ``backspace``) comes back.
Its figures are checked against the session's own tables at the moment shown, live and in
a replay.
"""

from __future__ import annotations

from pathlib import Path

import many_gpus
import pytest
from conftest import ROOT, until
from fake_nvml import FakeNvml, mig_instances

from gpuwatch.session import Session
from gpuwatch.sources.gpu import GpuSampler
from gpuwatch.sources.nvml import Nvml
from gpuwatch.store import save_session
from gpuwatch.store.player import open_replay
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.overview import gpu_devices, host_row, top_text
from gpuwatch.tui.replay import replay_app

GIB = 1 << 30
END = many_gpus.END_MS * many_gpus.MS
SIZES = {"80x24": (80, 24), "200x50": (200, 50)}
OLDER = ROOT / "tests" / "data" / "gpt2-small-h100-0b9a063.gpuwatch"


def app_of(session: Session) -> GpuwatchApp:
    return GpuwatchApp(session, clock=lambda: END)


def lines(app: GpuwatchApp) -> list[str]:
    """The overview's lines as the screen shows them (no styles)."""
    return app.dashboard.overview.render_plain()


def expected_row(session: Session, key: str, t: int) -> dict[str, str]:
    """What the overview must say of GPU ``key`` at ``t``, read from the session."""
    row = session.gpu[key].at(t)
    assert row is not None
    out = {"memory": f"{row['used'] / GIB:.1f}/{row['total'] / GIB:.0f}G"}
    if row["util_gpu"] == row["util_gpu"]:  # not NaN: a whole GPU
        out["util"] = f"{row['util_gpu']:.0f}%"
        out["temp"] = f"{row['temp']:.0f}°"
        out["power"] = f"{row['power']:.0f}W"
    snap = session.gpu_procs[key].group_at(t)
    if snap is not None and len(snap["pid"]):
        pid = int(snap["pid"][snap["used"].argmax()])
        out["top"] = f"{pid} {session.proc_info[pid]['name']}"
        proc = session.processes.get(pid)
        if proc is not None:
            out["phase"] = session.phase_at(proc, t) or ""
    return out


def assert_figures(app: GpuwatchApp, session: Session, t: int) -> None:
    shown = lines(app)
    devices = gpu_devices(session)
    assert len(shown) == 1 + len(devices) + 1  # the heading, a row per GPU, the host
    for dev, line in zip(devices, shown[1:], strict=False):
        expected = expected_row(session, dev.key, t)
        for what, text in expected.items():
            if what == "top" and expected.get("phase") and text not in line:
                # Too long for the row (80 columns): the command is cut, never the phase.
                cut = line.rsplit("W ", 1)[-1].rsplit(" · ", 1)[0]
                assert cut.endswith("…") and text.startswith(cut[:-1]), (what, text, line)
                assert cut.split()[0] == text.split()[0], (what, text, line)  # the pid whole
                continue
            assert text in line, (what, text, line)
    host = session.host_table().at(t)
    assert f"CPU {host['cpu']:.0f}%" in shown[-1] and f"load {host['load1']:.2f}" in shown[-1]
    assert f"{host['used'] / GIB:.1f}/{host['total'] / GIB:.0f}G" in shown[-1]
    assert f"swap {host['swap_used'] / GIB:.1f}/{host['swap_total'] / GIB:.0f}G" in shown[-1]


@pytest.mark.parametrize("size", SIZES)
async def test_eight_gpus_open_on_the_overview_with_the_sessions_figures(size: str) -> None:
    session = many_gpus.build(8)
    app = app_of(session)
    async with app.run_test(size=SIZES[size]) as pilot:
        await pilot.pause()
        assert app.dashboard.overview_shown and app.focused is app.dashboard.overview
        assert not app.dashboard.panel_list.display
        assert app.dashboard.overview.region.height == 1 + 8 + 1  # every GPU on the screen at once
        assert_figures(app, session, END)
        shown = app.dashboard.key_bar.shown(SIZES[size][0])
        assert any(k.key == "enter" and k.label == "Open GPU" for k in shown)
        # At a cursor inside a forward, the instrumented GPUs name that phase.
        t = 3300 * many_gpus.MS
        app.view = app.view.with_cursor(t, app.now())
        app.dashboard.redraw()
        await pilot.pause()
        assert_figures(app, session, t)
        assert "7000 python · forward" in lines(app)[1], lines(app)[1]
        assert "7001 jupyter" in lines(app)[2] and "·" not in lines(app)[2].split("W ")[-1]


async def test_two_gpus_at_80x24_open_on_the_overview_and_fit_at_200x50() -> None:
    session = many_gpus.build(2)
    app = app_of(session)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.dashboard.overview_shown
        assert_figures(app, session, END)
    app = app_of(many_gpus.build(2))
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        dash = app.dashboard
        assert not dash.overview_shown and dash.panel_list.display  # both panels fit
        assert len(app.dashboard.panels) == 3


async def test_one_gpu_at_80x24_keeps_its_panel() -> None:
    app = app_of(many_gpus.build(1))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert not app.dashboard.overview_shown and app.dashboard.panel_list.display


@pytest.mark.parametrize("size", SIZES)
async def test_enter_opens_a_gpus_panel_and_g_comes_back(size: str) -> None:
    session = many_gpus.build(8)
    app = app_of(session)
    keys = [d.key for d in gpu_devices(session)]
    async with app.run_test(size=SIZES[size]) as pilot:
        await pilot.pause()
        await pilot.press("down", "down", "enter")
        await pilot.pause()
        assert not app.dashboard.overview_shown and app.dashboard.panel_list.display
        assert app.dashboard.focused_panel().key == keys[2]
        assert app.dashboard.focused_panel().region.height > 0  # in view
        await pilot.press("g")
        await pilot.pause()
        assert app.dashboard.overview_shown and app.focused is app.dashboard.overview
        assert app.dashboard.overview.selected_key == keys[2]  # back on the GPU it came from
        await pilot.press("up", "tab")  # tab opens too
        await pilot.pause()
        assert not app.dashboard.overview_shown and app.dashboard.focused_panel().key == keys[1]
        # In a panel, tab steps through the panels as before, in their order (the GPUs
        # an instrumented process trains on first: 0, 2, 4, 6, then 1, 3, 5, 7).
        order = [p.key for p in app.dashboard.panels]
        assert order[:4] == keys[::2]
        await pilot.press("tab")
        await pilot.pause()
        assert app.dashboard.focused_panel().key == order[order.index(keys[1]) + 1] == keys[3]
        await pilot.press("g", "end", "3", "1")  # another tab and back: still the overview
        await pilot.pause()
        assert app.dashboard.overview_shown and app.focused is app.dashboard.overview


async def test_the_overview_takes_back_a_focus_lost_while_it_shows() -> None:
    """The keys were lost once in tmux: the overview showed, its selection on GPU 0, and
    down, down, enter went to no widget (the focus was on none: a panel blurred as its list
    hid, or the tab strip's from before any device came). Each frame gives it back."""
    app = app_of(many_gpus.build(8))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.focused is app.dashboard.overview
        app.screen.set_focus(None)
        app.dashboard.redraw()
        assert await until(pilot, lambda: app.focused is app.dashboard.overview)
        await pilot.press("down")
        assert app.dashboard.overview.selected == 1


async def test_the_overview_selection_stops_at_the_ends() -> None:
    app = app_of(many_gpus.build(8))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("up")
        assert app.dashboard.overview.selected == 0
        await pilot.press(*["down"] * 12)
        assert app.dashboard.overview.selected == 7
        assert lines(app)[8].startswith("▸ 7")


async def test_the_overview_follows_the_cursor_in_a_replay(tmp_path: Path) -> None:
    path = save_session(many_gpus.build(8), tmp_path / "eight.gpuwatch")
    player = open_replay(path)
    try:
        app = replay_app(player, subtitle="replay eight")
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            assert app.dashboard.overview_shown
            await pilot.press("home", "right", "right", "right")
            await pilot.pause()
            cursor = app.view.cursor
            assert cursor is not None and app.dashboard.overview.at == cursor
            assert_figures(app, player.session, cursor)
            before = lines(app)
            await pilot.press(*["right"] * 20)
            await pilot.pause()
            assert app.dashboard.overview.at == app.view.cursor != cursor
            assert_figures(app, player.session, app.view.cursor)
            assert lines(app) != before  # used memory rises through the recording
            # Replay binds o to OOMs: g (and backspace) come back from a panel there too.
            await pilot.press("enter")
            await pilot.pause()
            assert not app.dashboard.overview_shown
            await pilot.press("backspace")
            await pilot.pause()
            assert app.dashboard.overview_shown
            await pilot.press("enter", "g")
            await pilot.pause()
            assert app.dashboard.overview_shown
    finally:
        player.close()


async def test_an_older_recording_has_no_host_cpu_and_no_mig() -> None:
    # A recording made before issue 38: its host rows lack cpu, load and swap.
    player = open_replay(OLDER)
    try:
        session = player.session
        assert all(d.mig is None for d in session.devices.values())
        host = host_row(session, session.time_range()[1])
        assert host is not None and host.used is not None
        assert host.cpu is None and host.load1 is None and host.swap_total is None
        app = replay_app(player, subtitle="replay spike")
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.press("g")
            await pilot.pause()
            assert app.dashboard.overview_shown  # asked for: one GPU shows a row too
            assert "CPU –" in lines(app)[-1]
    finally:
        player.close()


async def test_mig_instances_are_rows_with_their_own_memory() -> None:
    session = many_gpus.build(8, mig=True)
    app = app_of(session)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        shown = lines(app)
        assert len(shown) == 1 + 8 + 3 + 1
        # Right after GPU 1, its three instances, each with its own memory.
        for slot in range(3):
            line = shown[3 + slot]
            assert line.split()[0] == f"1.{slot}" and "MIG 2g.20gb" in line, line
        assert_figures(app, session, END)
        await pilot.press("down", "down", "down", "enter")  # the second instance
        await pilot.pause()
        panel = app.dashboard.focused_panel()
        assert panel.device.mig == (gpu_devices(session)[1].key, 1)
        row = session.gpu[panel.key].at(END)
        assert f"{row['used'] / GIB:.2f} GiB / {row['total'] / GIB:.2f} GiB" in panel.header.text
        assert panel.border_title.startswith("GPU 1.1 · ")


def test_mig_instances_are_sampled_with_their_own_memory() -> None:
    fake = FakeNvml(2)
    instances = mig_instances(fake.gpus[1], 3)
    session = Session()
    sampler = GpuSampler(session, nvml=Nvml(fake))
    assert sampler.open()
    sampler.sample_once()
    migs = [d for d in session.devices.values() if d.mig is not None]
    assert [d.uuid for d in migs] == [i.uuid for i in instances]
    parent = next(d for d in session.devices.values() if d.index == 1 and d.mig is None)
    for dev, instance in zip(migs, instances, strict=True):
        assert dev.mig == (parent.key, instances.index(instance))
        row = session.gpu[dev.key].last()
        assert row["used"] == instance.used and row["total"] == instance.total == dev.total
    # The GPU's own used memory is the instances' sum; utilisation is the GPU's only.
    assert session.gpu[parent.key].last()["used"] == sum(i.used for i in instances)
    assert all(
        session.gpu[d.key].last()["util_gpu"] != session.gpu[d.key].last()["util_gpu"] for d in migs
    )


def test_mig_devices_are_recorded_and_replayed(tmp_path: Path) -> None:
    session = many_gpus.build(2, mig=True)
    path = save_session(session, tmp_path / "mig.gpuwatch")
    player = open_replay(path)
    try:
        loaded = player.session
        for key, dev in session.devices.items():
            assert loaded.devices[key].mig == dev.mig
        assert [d.key for d in gpu_devices(loaded)] == [d.key for d in gpu_devices(session)]
    finally:
        player.close()


def test_a_hostile_mig_parent_reads_as_a_whole_gpu() -> None:
    session = many_gpus.build(1)
    dev = gpu_devices(session)[0]
    for extra in (
        {"mig_parent": 3, "mig_slot": 0},
        {"mig_parent": "x", "mig_slot": "0"},
        {"mig_parent": "x", "mig_slot": 10**9},
        {"mig_parent": "x", "mig_slot": True},
    ):
        dev.extra = extra
        assert dev.mig is None


def test_a_long_row_cuts_the_command_and_keeps_the_phase() -> None:
    assert top_text("7000 python", "backward", 22) == "7000 python · backward"
    assert top_text("7000 python", "backward", 21) == "7000 pyth… · backward"
    assert top_text("7001 jupyter", None, 8) == "7001 ju…"
    assert top_text("7000 python", "optimizer.step", 14) == "optimizer.step"
