"""A theme switch recolours the line-drawn widgets that keep their styles: the Processes
tab and the GPU overview (one style cache, :class:`gpuwatch.tui._strips.StyleCache`,
cleared when the CSS changes).

Textual applies a theme's CSS after ``app.theme`` names it (``call_next``), and the screen
draws on its own task: a line drawn in between read the old CSS under the new theme's
name. The tests draw one line there, as the screen can, and then check that once the CSS
is applied every line is drawn in the new theme's colours."""

from __future__ import annotations

import many_gpus
import pytest
import synthetic
from conftest import until
from test_process_snapshots import session as processes_session

from gpuwatch.tui._strips import CachedStrips
from gpuwatch.tui.app import GpuwatchApp

THEMES = [("gpuwatch-dark", "gpuwatch-light"), ("gpuwatch-light", "gpuwatch-contrast")]


def backgrounds(widget: CachedStrips, y: int) -> set[object]:
    return {seg.style.bgcolor for seg in widget.render_line(y) if seg.style is not None}


async def switch(app: GpuwatchApp, pilot: object, widget: CachedStrips, theme: str) -> None:
    """Name ``theme`` and draw a line before its CSS is applied, then let it apply."""
    style = widget.rich_style
    app.theme = theme
    widget.render_line(0)  # the screen's frame, between the two
    # Every theme here has its own background: the CSS has applied once it shows.
    assert await until(pilot, lambda: widget.rich_style != style)


@pytest.mark.parametrize(("first", "then"), THEMES)
async def test_a_theme_switch_recolours_the_processes_tab(first: str, then: str) -> None:
    app = GpuwatchApp(processes_session(), theme_name=first, clock=synthetic.end_time)
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.press("3")
        table = app.dashboard.process_table
        assert await until(pilot, lambda: table.row_count >= 3)
        before = [backgrounds(table, y) for y in range(4)]
        await switch(app, pilot, table, then)
        header = table.get_component_rich_style("process-table--header").bgcolor
        odd = table.get_component_rich_style("process-table--odd").bgcolor
        after = [backgrounds(table, y) for y in range(4)]
        assert after[0] == {header}, (first, then)
        # Rows 0 and 2 are the plain or the cursor's colour, row 1 the odd rows'.
        assert after[2] == {odd}
        assert all(a != b for a, b in zip(after, before, strict=True))


@pytest.mark.parametrize(("first", "then"), THEMES)
async def test_a_theme_switch_recolours_the_overview(first: str, then: str) -> None:
    app = GpuwatchApp(
        many_gpus.build(8), theme_name=first, clock=lambda: many_gpus.END_MS * many_gpus.MS
    )
    async with app.run_test(size=(80, 24)) as pilot:
        assert await until(pilot, lambda: app.dashboard.overview_shown)
        overview = app.dashboard.overview
        before = backgrounds(overview, 0)
        await switch(app, pilot, overview, then)
        head = overview.get_component_rich_style("gpu-overview--head").bgcolor
        assert backgrounds(overview, 0) == {head} != before
