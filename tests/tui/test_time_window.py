"""The time window as one value: each change builds a new one, and the app redraws once."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, replace

import pytest
import synthetic
from conftest import until

from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.time_window import MIN_SPAN, SECOND, TimeWindow

END = synthetic.end_time()


def test_a_change_builds_a_new_window_and_leaves_the_old_one() -> None:
    live = TimeWindow(span=10 * SECOND, first=0)
    now = 100 * SECOND
    paused = live.paused(now)
    assert live.following and paused.window(now) == live.window(now) == (90 * SECOND, now)
    with pytest.raises(FrozenInstanceError):
        live.cursor = 5  # type: ignore[misc]
    # Zoomed in around a cursor: centred on it, paused, the old window untouched.
    cursor = live.with_cursor(50 * SECOND, now)
    zoomed = cursor.zoomed(0.5, now)
    assert zoomed.window(now) == (47_500_000_000, 52_500_000_000)
    assert cursor.span == 10 * SECOND and cursor.end == now
    # Panned back past the session's start: it stops there.
    assert live.panned(-20.0, now).window(now) == (0, 10 * SECOND)
    # Zoomed out past the limit, in past the floor.
    assert live.zoomed(1e-12, now).span == MIN_SPAN
    # The cursor stepped off the left edge: the window scrolls to keep it.
    moved = paused.cursor_moved(-1, 10, now)
    assert moved.cursor == now - SECOND and moved.end == now
    far = replace(moved, cursor=80 * SECOND).cursor_moved(-1, 10, now)
    assert far.cursor == 79 * SECOND and far.window(now)[0] <= 79 * SECOND
    assert paused.followed() == live and live.toggled(now) == paused


async def test_one_change_of_several_fields_is_one_redraw() -> None:
    app = GpuwatchApp(synthetic.build(), clock=lambda: END)
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.pause()
        before = app.dashboard.redraws
        app.view = replace(app.view, span=5 * SECOND, end=END - SECOND, cursor=END - 2 * SECOND)
        assert app.dashboard.redraws == before + 1
        panel = app.dashboard.panels[0]
        assert panel.chart.window == (END - 6 * SECOND, END - SECOND)
        assert panel.chart.cursor == END - 2 * SECOND
        # A key builds the next window: one redraw, the chart on the new span.
        await pilot.press("minus")
        assert app.dashboard.redraws == before + 2 and app.view.span == 10 * SECOND
        # The frame timer keeps the session's start in the window without redrawing it.
        assert await until(pilot, lambda: app.view.first == app.session.time_range()[0])
        assert app.dashboard.redraws == before + 2
