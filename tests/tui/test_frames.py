"""Issue 38: an idle dashboard wakes only when a frame is due.

Following live, the frame key changes when the clock enters the next step (a chart column,
at least ``FOLLOW_FRAME_NS``): the app looks for a frame then, not 20 times a second in
between (those looks were most of an idle dashboard's CPU). What no key follows is still
seen: data a paused view held back shows when its interval is over, with nothing else to
wake the app, and a resize redraws at once.
"""

from __future__ import annotations

import time

import many_gpus
import synthetic
from textual.content import Content
from textual.strip import Strip

from gpuwatch.session import gpu_key
from gpuwatch.tui.app import FOLLOW_FRAME_NS, GpuwatchApp

SIZE = (140, 45)
END = synthetic.end_time()
KEY = gpu_key(synthetic.UUID)
GIB = synthetic.GIB


def counting(app: GpuwatchApp) -> list[float]:
    """The times the app looks for a frame (its ``_tick``, however it is called)."""
    looks: list[float] = []
    tick = app._tick

    def counted() -> None:
        looks.append(time.monotonic())
        tick()

    app._tick = counted  # type: ignore[method-assign]
    return looks


async def test_following_live_the_app_wakes_per_frame_not_twenty_times_a_second() -> None:
    start = time.monotonic_ns()
    app = GpuwatchApp(synthetic.build(), clock=lambda: END + time.monotonic_ns() - start)
    looks = counting(app)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.5)
        assert app.view.following
        looks.clear()
        redraws = app.redraws
        t0 = time.monotonic()
        await pilot.pause(2.0)
        took = time.monotonic() - t0
        frames = app.redraws - redraws
        # The clock moves: frames keep coming, one a step (a step is at least
        # FOLLOW_FRAME_NS, and the loaded machine may stretch the pause).
        assert frames >= 2, frames
        assert frames <= took / (FOLLOW_FRAME_NS / 1e9) + 1
        # Each frame is one look, plus at most one between (looks are at least every
        # FOLLOW_FRAME_NS); at 20 a second this was 40.
        assert len(looks) <= 2 * frames + 2, (len(looks), frames)


async def test_held_back_data_in_a_paused_view_shows_when_its_interval_is_over() -> None:
    app = GpuwatchApp(synthetic.build(), clock=lambda: END)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f")  # paused
        await pilot.pause(FOLLOW_FRAME_NS / 1e9 + 0.1)
        chart = next(p for p in app.panels if p.key == KEY).chart
        builds = chart.build_count
        app.session.add_gpu_sample(KEY, {"t": END, "used": 70 * GIB, "total": 80 * GIB})
        await pilot.pause(0.1)
        assert chart.build_count == builds + 1  # at once
        shown = time.monotonic()
        app.session.add_gpu_sample(KEY, {"t": END, "used": 60 * GIB, "total": 80 * GIB})
        await pilot.pause(0.05)
        if time.monotonic() - shown < FOLLOW_FRAME_NS / 2e9:  # (a loaded machine's pause)
            assert chart.build_count == builds + 1  # held back: one frame per interval
        # Nothing more comes; the held-back sample is drawn when the interval is over.
        await pilot.pause(FOLLOW_FRAME_NS / 1e9 + 0.3)
        assert chart.build_count == builds + 2


async def test_a_resize_is_drawn_at_once() -> None:
    # Two GPUs fit as panels at 200x50; at 80x24 the overview takes their place.
    app = GpuwatchApp(many_gpus.build(2), clock=lambda: many_gpus.END_MS * many_gpus.MS)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause(FOLLOW_FRAME_NS / 1e9)
        assert not app.overview_shown
        redraws = app.redraws
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.2)  # less than the time between looks of an idle app
        assert app.overview_shown
        assert app.redraws > redraws


async def test_the_overview_lines_are_what_content_renders() -> None:
    # A frame draws the overview's lines from runs with styles resolved once per theme and
    # focus; each must be the strip a Content of the same runs renders: the selected row,
    # a MIG instance's dim figures, every theme, with and without focus.
    session = many_gpus.build(2, mig=True)
    app = GpuwatchApp(session, clock=lambda: many_gpus.END_MS * many_gpus.MS)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause(FOLLOW_FRAME_NS / 1e9)
        overview = app.overview
        assert app.overview_shown and any(r.util is None for r in overview.rows)
        for theme in ("gpuwatch-dark", "gpuwatch-light", "gpuwatch-contrast"):
            for focused in (True, False):
                app.theme = theme
                if focused:
                    overview.focus()
                else:
                    app.set_focus(None)
                await pilot.press("down")
                await pilot.pause()
                width = overview.size.width
                base, pad = overview.visual_style, overview.rich_style
                drawn = overview.build_strips(overview.size)
                lines = overview._lines(width, app.theme_variables)
                assert len(drawn) == len(lines) == len(overview.rows) + 2
                for strip, (runs, style) in zip(drawn, lines, strict=True):
                    parts = [(t, s) if s is not None else t for t, s in runs]
                    content = Content.assemble(*parts).stylize(style)
                    want = Strip(content.render_segments(base)).adjust_cell_length(width, pad)
                    assert list(strip) == list(want), (theme, focused)
