"""README's first command, read as a new user reads it (issue 37, items 3, 4, 7 and 8), in
the real replay app under Pilot at 80x24, 120x40 and 220x60, on the 2.7B sample.

- ``s`` lands on the largest spike the recording measured best (the step-3 optimizer.step
  allocator peak, 53.61 GiB, not NVML's 56.99 GiB at a step-1 boundary) and says which.
- Marks are readable: ``m`` says what it landed on, the status bar reads the mark nearest
  the cursor, the Peaks tab lists every mark with its text.
- The Peaks tab highlights the phase under the cursor and follows it; at 80 columns it
  keeps step, phase, peak, predicted and unexplained, dropping columns in a stated order.
- One time format on screen; the cursor and the scrubber agree; the arrows mean the same
  in live and replay; every toggle says what it did.
"""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

from gpuwatch.fmt import fmt_clock
from gpuwatch.store.player import open_replay
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.marks import describe
from gpuwatch.tui.replay import replay_app
from gpuwatch.tui.tables import DROP_ORDER, PeaksTable

SPIKE = ROOT / "samples" / "gpt-2.7b-h100-adamw-spike.gpuwatch"
SIZES = [(80, 24), (120, 40), (220, 60)]
GIB = 1 << 30
CLOCK = re.compile(r"^-?\d+:\d\d(?::\d\d)?(?:\.\d+)?$")


@pytest.fixture
def app():
    players = []

    def make() -> GpuwatchApp:
        player = open_replay(SPIKE)
        players.append(player)
        player.loader.load_all()
        return replay_app(player, theme_name="gpuwatch-dark", subtitle=f"replay {SPIKE.name}")

    yield make
    for player in players:
        player.close()


def told(app: GpuwatchApp) -> list[str]:
    return [n.message for n in app._notifications]


def gpu(app: GpuwatchApp):
    return next(p for p in app.dashboard.panels if not p.is_host)


@pytest.mark.parametrize("size", SIZES)
async def test_s_lands_on_the_exact_optimizer_peak_and_says_so(app, size) -> None:
    a = app()
    async with a.run_test(size=size) as pilot:
        await pilot.press("home", "s")
        await pilot.pause()
        span = gpu(a).span_at(a.view.cursor)
        assert span is not None and (span["name"], span["step"]) == ("optimizer.step", 3)
        assert span["peak_alloc"] == pytest.approx(53.61 * GIB, rel=1e-3)
        message = told(a)[-1]
        assert "53.61 GiB" in message and "exact allocator peak" in message
        assert "optimizer.step (step 3)" in message


@pytest.mark.parametrize("size", SIZES)
async def test_marks_are_readable_at_the_cursor_and_listed(app, size) -> None:
    a = app()
    async with a.run_test(size=size) as pilot:
        await pilot.press("home", "m")
        await pilot.pause()
        first = a.session.marks[0]
        assert a.view.cursor == first.t
        assert any(first.text in m for m in told(a)), told(a)
        # The status bar reads it (cut to fit: its start at least).
        said = describe(first)
        assert first.text in said
        at = fmt_clock(first.t - a.session.t_origin)
        assert f"◆ {at} {said[:20]}" in a.dashboard.status_bar.text
        await pilot.press("2")
        await pilot.pause()
        table = a.dashboard.marks_table
        texts = [str(table.get_row_at(i)[3]) for i in range(table.row_count)]
        assert texts == [describe(m) for m in a.session.marks]
        assert table.cursor_row == 0  # the mark at the cursor


@pytest.mark.parametrize("size", SIZES)
async def test_peaks_follow_the_cursor_and_fit_the_width(app, size) -> None:
    a = app()
    async with a.run_test(size=size) as pilot:
        await pilot.press("s", "2")
        await pilot.pause()
        table: PeaksTable = a.dashboard.peaks_table

        def highlighted() -> tuple[str, str]:
            row = table.get_row_at(table.cursor_row)
            return str(row[0]), str(row[1])

        assert highlighted() == ("3", "optimizer.step")
        assert "optimizer.step, step 3" in str(table.detail.render())
        await pilot.press("right_square_bracket")  # to zero_grad, the next boundary
        await pilot.pause()
        span = gpu(a).span_at(a.view.cursor)
        assert highlighted() == (str(span["step"]), span["name"])
        # Step, phase, the exact peak, predicted and unexplained always show; what goes,
        # goes in DROP_ORDER.
        shown = table.shown
        for key in ("step", "phase", "alloc", "predicted", "unexplained"):
            assert key in shown
        dropped = [k for k, _ in PeaksTable.COLUMNS if k not in shown]
        assert set(dropped) == set(DROP_ORDER[: len(dropped)])
        widths = sum(c.get_render_width(table) for c in table.columns.values())
        assert widths <= table.size.width
        if size[0] == 220:
            assert dropped == []


@pytest.mark.parametrize("size", SIZES)
async def test_one_time_format_and_the_scrubber_agrees_with_the_cursor(app, size) -> None:
    a = app()
    async with a.run_test(size=size) as pilot:
        await pilot.press("s", "right")
        await pilot.pause()
        at = fmt_clock(a.view.cursor - a.session.t_origin)
        assert f"cursor {at}" in a.dashboard.status_bar.text
        # The legend's time part (at 80 columns it gives way to the figures).
        parts = [str(part) for part in gpu(a)._legend(gpu(a).moment_at(a.view.cursor))]
        assert f"@ {at}" in parts
        assert f"  {at} / " in a.transport.scrubber.render().plain
        assert a.transport.player.position() == a.view.cursor
        chart = gpu(a).chart
        axis = chart._time_axis(chart.plot_width)
        labels = re.findall(r"┴([^─┴ ]+)", axis)
        assert labels and all(CLOCK.match(label) for label in labels), axis


@pytest.mark.parametrize("size", SIZES)
async def test_toggles_say_what_they_did(app, size) -> None:
    a = app()
    async with a.run_test(size=size) as pilot:
        await pilot.press("y")
        await pilot.pause()
        assert told(a)[-1] == "y axis: fitted to the data"
        await pilot.press("y")
        await pilot.pause()
        assert told(a)[-1] == "y axis: the device's total"
        await pilot.press("f")
        await pilot.pause()
        assert told(a)[-1] == "the window follows the playback position"
