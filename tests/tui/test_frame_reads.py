"""Issue 38: a frame reads and draws only what is shown, and what comes into view is
drawn at once.

With the Processes tab open, the frames still come (the status bar, the key bar), but the
overview and the panels under the Timelines tab are not read nor drawn (8 GPUs' rows each
frame were most of the dashboard's own CPU with the tab open); back on Timelines, by key
or by a click on the tab's title, they show the newest data at once. The Ranks tab, hidden,
makes its tables for the status bar's fault count but draws them only when it shows.
Panels scrolled out of the list are updated when they scroll into it. The overview's rows
read each GPU's figures, not the explanations of its phases (the panels' header and bar).
"""

from __future__ import annotations

import many_gpus
import pytest
import rank_session as rs
from conftest import until

from gpuwatch.analysis import moment
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.frame_clock import FOLLOW_FRAME_NS
from gpuwatch.tui.overview import GpuOverview, gpu_devices

GIB = 1 << 30
END = many_gpus.END_MS * many_gpus.MS
FRAME_S = FOLLOW_FRAME_NS / 1e9


def reads(overview: GpuOverview) -> list[object]:
    """The moments the overview is asked to read (its ``update_view``)."""
    seen: list[object] = []
    update = overview.update_view

    def counted(at: int, version: object) -> None:
        seen.append(at)
        update(at, version)

    overview.update_view = counted  # type: ignore[method-assign]
    return seen


def used_shown(app: GpuwatchApp) -> str:
    """GPU 0's used/total as the overview shows it."""
    return app.dashboard.overview.render_plain()[1]


async def check_hidden_then_shown(click: bool) -> None:
    session = many_gpus.build(8)
    app = GpuwatchApp(session, clock=lambda: END)
    async with app.run_test(size=(80, 24)) as pilot:
        assert await until(pilot, lambda: app.dashboard.overview_shown)  # the layout chose it
        await pilot.press("f")  # paused: a frame only when data comes
        await pilot.press("3")
        await pilot.pause(FRAME_S + 0.1)
        seen = reads(app.dashboard.overview)
        before = used_shown(app)
        frames = app.dashboard.redraws
        key = gpu_devices(session)[0].key
        session.add_gpu_sample(key, {"t": END, "used": 79 * GIB, "total": 80 * GIB})
        assert await until(pilot, lambda: app.dashboard.redraws > frames)  # the frame came (status
        await pilot.pause(0.1)  # bar, key bar) ...
        assert seen == []  # ... without reading the hidden overview
        assert used_shown(app) == before
        if click:
            await pilot.click("#--content-tab-timelines")
        else:
            await pilot.press("1")
        # Paused, and no more data: no frame would come on its own.
        assert await until(pilot, lambda: "79.0/80G" in used_shown(app)), used_shown(app)
        assert app.dashboard.tabs.active == "timelines"
        assert seen


async def test_the_overview_is_not_read_under_another_tab_and_shows_by_key() -> None:
    await check_hidden_then_shown(click=False)


async def test_the_overview_shows_at_once_when_its_tab_title_is_clicked() -> None:
    await check_hidden_then_shown(click=True)


async def test_the_hidden_ranks_tab_counts_faults_and_draws_when_shown() -> None:
    session = rs.build()
    app = GpuwatchApp(session, clock=lambda: session.time_range()[1])
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.pause(0.3)
        view = app.dashboard.ranks_view
        drawn: list[int] = []
        update = view.body.update
        view.body.update = lambda *a, **k: (drawn.append(1), update(*a, **k))[1]  # type: ignore[method-assign]
        view._at = -1e9  # the hidden tab's next refresh is due
        app.dashboard._tables_version = -1
        app.dashboard._refresh_tables()
        assert view.tables and "! 2 rank faults" in app.dashboard.status_bar.text
        assert drawn == []  # hidden: the tables are made, not drawn
        await pilot.press("5")
        assert await until(pilot, lambda: bool(drawn))
        assert str(view.body.render()).splitlines()[0].startswith("ranks: 4")


async def test_panels_out_of_view_are_drawn_when_scrolled_into_it() -> None:
    """Panels scrolled out of the list (a run on the CPU keeps every GPU's below the
    host's; here, the panels chosen over the overview) are not updated by a frame, and
    are at once when the list scrolls to them."""
    session = many_gpus.build(8)
    app = GpuwatchApp(session, clock=lambda: END)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause(0.3)
        keys = [d.key for d in gpu_devices(session)]
        app.dashboard.open_panel(keys[0])
        await pilot.press("f")  # paused: a frame only when data comes
        by_key = app.dashboard.panel_list.by_key
        first, last = by_key[keys[0]], by_key[keys[-1]]
        assert await until(pilot, lambda: first.region.overlaps(app.dashboard.panel_list.region))
        await pilot.pause(FRAME_S + 0.2)
        assert not app.dashboard.overview_shown
        assert not last.region.overlaps(app.dashboard.panel_list.region)  # below the fold
        session.add_gpu_sample(keys[-1], {"t": END, "used": 79 * GIB, "total": 80 * GIB})
        # The frame came ...
        assert await until(pilot, lambda: first.chart.data_version == session.version)
        assert last.chart.data_version != session.version  # ... and left it alone
        app.dashboard.panel_list.scroll_end(animate=False)
        assert await until(pilot, lambda: last.chart.data_version == session.version)
        assert last.region.overlaps(app.dashboard.panel_list.region)
        assert "79.0" in str(last.header.render()), str(last.header.render())


async def test_the_overview_reads_figures_not_explanations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    explained: list[str] = []
    explain = moment._explain

    def counted(session, key, readings):  # type: ignore[no-untyped-def]
        explained.append(key)
        return explain(session, key, readings)

    monkeypatch.setattr(moment, "_explain", counted)
    session = many_gpus.build(8)
    app = GpuwatchApp(session, clock=lambda: END)
    async with app.run_test(size=(80, 24)) as pilot:
        assert await until(pilot, lambda: app.dashboard.overview_shown)  # the layout chose it
        frames = app.dashboard.redraws
        app.dashboard.redraw()
        assert await until(pilot, lambda: app.dashboard.redraws > frames)
        assert explained == []
        rows = app.dashboard.overview.rows
        assert len(rows) == 8 and all(r.used for r in rows)
        # A panel's header still explains its phase.
        await pilot.press("enter")
        assert await until(pilot, lambda: bool(explained))


async def test_the_overview_reads_its_rows_in_one_read_under_the_session_lock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 53: the overview draws frozen rows taken in one read (``Session.read``), with
    the lock held: a receiver's message comes wholly before or after a frame's rows."""
    from gpuwatch.tui import overview as overview_mod

    session = many_gpus.build(8)
    held: list[bool] = []
    real_row = overview_mod.gpu_row

    def row(*args: object, **kwargs: object) -> object:
        # Another thread cannot take the lock while this frame's read holds it.
        import threading

        got: list[bool] = []
        t = threading.Thread(target=lambda: got.append(session._lock.acquire(blocking=False)))
        t.start()
        t.join()
        if got[0]:
            session._lock.release()
        held.append(not got[0])
        return real_row(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(overview_mod, "gpu_row", row)
    app = GpuwatchApp(session, clock=lambda: END)
    async with app.run_test(size=(80, 24)) as pilot:
        assert await until(pilot, lambda: len(held) >= 8)
        assert all(held), held
        rows = app.dashboard.overview.rows
        assert len(rows) == 8 and all(type(r).__dataclass_params__.frozen for r in rows)
