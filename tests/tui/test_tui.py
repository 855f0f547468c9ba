"""The dashboard under Pilot: every key and mouse action, the chart cache, themes."""

from __future__ import annotations

import time

import numpy as np
import pytest
import synthetic
from conftest import until
from textual import events
from textual.command import CommandList
from textual.widgets import Markdown

from gpuwatch.session import HOST, gpu_key
from gpuwatch.session.navigate import boundaries
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.chart import AXIS_WIDTH, TimelineChart
from gpuwatch.tui.frame_clock import FOLLOW_FRAME_NS
from gpuwatch.tui.help import HelpScreen
from gpuwatch.tui.processes import ProcessTable
from gpuwatch.tui.tables import PeaksTable

SIZE = (140, 45)
END = synthetic.end_time()
KEY = gpu_key(synthetic.UUID)


def make_app(**kwargs) -> GpuwatchApp:
    session = synthetic.build()
    return GpuwatchApp(session, clock=lambda: END, **kwargs)


def gpu_panel(app: GpuwatchApp):
    return next(p for p in app.dashboard.panels if p.key == KEY)


async def test_panels_for_every_device_and_lines() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert [p.key for p in app.dashboard.panels] == [KEY, HOST]
        panel = gpu_panel(app)
        roles = [s.role for s in panel.chart.last_frame.series]
        # The exact peaks drawn last: where lines share a cell, theirs is the colour shown.
        assert roles == ["predicted", "nvml", "reserved", "allocated", "peak"]
        # The breakdown bar names every part of nvidia-smi's figure.
        bar = panel.bar.render().plain
        # No NVML process list here: what torch does not reserve is unclaimed, not free.
        for label in ("unclaimed", "cache", "weights", "optim", "unexplained", "free"):
            assert label in bar
        assert "predicted" in str(panel.legend.render())
        # GPU y axis: the device total is the ceiling by default.
        assert panel.chart.last_frame.ymax == 80 * synthetic.GIB
        assert "GPU 0" in panel.border_title and "H100" in panel.border_title
        header = str(panel.header.render())
        assert "80.00 GiB" in header and "10 Hz" in header and "97%" in header
        # One band row for the one process, on the GPU panel, none on the host panel.
        assert [r.label for r in panel.band.rows] == ["pid 4242"]
        host = next(p for p in app.dashboard.panels if p.key == HOST)
        assert host.band.rows == []


async def test_follow_toggle_with_f_and_space() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        assert app.view.following
        await pilot.press("f")
        assert not app.view.following
        await pilot.press("space")
        assert app.view.following


async def test_zoom_keys() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        span = app.view.span
        await pilot.press("plus")
        assert app.view.span == span // 2
        await pilot.press("equals_sign")
        assert app.view.span == span // 4
        await pilot.press("minus")
        assert app.view.span == span // 2


async def test_cursor_keys_move_by_columns() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("plus", "plus", "plus")  # 7.5 s window: the data fills it
        await pilot.press("left")
        assert app.view.cursor is not None and not app.view.following
        start = app.view.cursor
        width = gpu_panel(app).chart.plot_width
        col = app.view.span // width
        await pilot.press("left")
        assert app.view.cursor == start - col
        # ctrl: a tenth of the window in whole columns, as in replay (issue 37, item 8).
        far = round(width / 10)
        await pilot.press("ctrl+left")
        assert app.view.cursor == start - (1 + far) * col
        await pilot.press("ctrl+right", "right")
        assert app.view.cursor == start
        legend = str(gpu_panel(app).legend.render())
        assert "nvidia-smi" in legend and "GiB" in legend
        await pilot.press("escape")
        assert app.view.cursor is None


async def test_pan_keys() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("plus", "plus", "plus", "plus")  # 3.75 s window on a 6 s session
        await pilot.press("f")
        end = app.view.end
        await pilot.press("shift+left")
        assert app.view.end == end - app.view.span // 4
        await pilot.press("less_than_sign")
        assert app.view.end == end - app.view.span // 2
        await pilot.press("greater_than_sign", "shift+right")
        assert app.view.end == end


async def test_jump_to_phase_boundaries() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        times = boundaries(app.session, KEY)
        await pilot.press("home")
        await pilot.press("right_square_bracket")
        first = app.view.cursor
        assert first in times.tolist()
        await pilot.press("right_square_bracket")
        second = app.view.cursor
        assert second == times[np.searchsorted(times, first, "right")]
        await pilot.press("left_square_bracket")
        assert app.view.cursor == first


async def test_jump_to_marks_and_ooms() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        mark_t = app.session.marks[0].t
        oom_t = app.session.ooms[0].t
        await pilot.press("home", "m")
        assert app.view.cursor == mark_t
        await pilot.press("m")
        assert app.view.cursor == oom_t
        await pilot.press("M")
        assert app.view.cursor == mark_t


async def test_jump_to_largest_spike() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        # The largest spike is the highest exact phase peak where the script reported
        # them (issue 37, item 4): the cursor in the middle of that phase.
        proc = app.session.processes[synthetic.PID]
        cols = proc.phases.snapshot()
        i = int(np.argmax(cols["peak_alloc"]))
        expected = (int(cols["t0"][i]) + int(cols["t1"][i])) // 2
        await pilot.press("s")
        assert app.view.cursor == expected
        assert any("exact allocator peak" in n.message for n in app._notifications)
        window = app.view.window(END)
        assert window[0] <= expected <= window[1]


async def test_home_and_end() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("plus", "plus", "plus", "plus", "home")
        assert app.view.window(END)[0] == app.session.time_range()[0]
        await pilot.press("end")
        assert app.view.following


async def test_fit_toggle_rescales_gpu_axis() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        panel = gpu_panel(app)
        assert panel.chart.last_frame.ymax == 80 * synthetic.GIB
        await pilot.press("y")
        await pilot.pause()
        assert panel.chart.last_frame.ymax < 80 * synthetic.GIB


async def test_tabs_peaks_and_processes() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await pilot.pause()
        assert app.dashboard.tabs.active == "peaks"
        table = app.query_one(PeaksTable)
        assert table.row_count == 6 * 5  # 6 steps x 5 phases
        first = table.get_row_at(0)
        assert first[0] == "5"  # the newest step first
        opt_rows = [
            table.get_row_at(i)
            for i in range(table.row_count)
            if str(table.get_row_at(i)[1]) == "optimizer.step"
        ]
        # The exact peak includes the 10 ms spike that NVML's 100 ms polls never saw.
        peak_alloc = str(opt_rows[0][5])
        nvml_max = str(opt_rows[0][7])
        assert peak_alloc == "50.00 GiB"
        assert nvml_max != peak_alloc
        predicted = {
            str(table.get_row_at(i)[1]): str(table.get_row_at(i)[8]) for i in range(table.row_count)
        }
        assert predicted.pop("data") == "n/a"  # the predictor has no model of data loading
        assert "n/a" not in predicted.values()
        await pilot.press("3")
        await pilot.pause()
        assert app.dashboard.tabs.active == "processes"
        procs = app.query_one(ProcessTable)
        assert procs.row_count >= 1
        await pilot.press("1")
        assert app.dashboard.tabs.active == "timelines"


async def test_help_screen_opens_and_closes() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.pause(0.2)  # timers keep running under the modal
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_the_help_says_what_an_oom_marker_answers() -> None:
    # The ✖ says what would have fitted (analysis/oom_answer.py); the help says where.
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        text = app.screen.query_one(Markdown).source
    assert "Each ✖ also says what would have fitted" in text
    for where in ("estimate --from", "status line", "Peaks tab's marks", "`o`'s notice"):
        assert where in text, where


async def test_q_quits() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0


async def test_click_sets_cursor_at_that_time() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        chart = gpu_panel(app).chart
        x = AXIS_WIDTH + 30
        await pilot.click(TimelineChart, offset=(x, 3))
        await pilot.pause()
        assert app.view.cursor == chart.x_to_time(x)
        assert not app.view.following


async def test_wheel_zooms_around_pointer_and_sideways_pans() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        chart = gpu_panel(app).chart
        await pilot.press("plus", "plus", "plus", "plus", "home")  # 3.75 s of a 6 s session
        span = app.view.span
        x = AXIS_WIDTH + 40
        t = chart.x_to_time(x)

        def wheel(cls):
            chart.post_message(cls(chart, x, 3, 0, 1, 0, False, False, False))

        wheel(events.MouseScrollUp)
        await pilot.pause()
        assert app.view.span == int(span * 0.8)
        # The time under the pointer stays under the pointer.
        assert abs(chart.x_to_time(x) - t) <= app.view.span // chart.plot_width
        wheel(events.MouseScrollDown)
        await pilot.pause()
        assert app.view.span == int(int(span * 0.8) * 1.25)
        end = app.view.end
        wheel(events.MouseScrollRight)
        await pilot.pause()
        later = app.view.end
        assert later > end
        wheel(events.MouseScrollLeft)
        await pilot.pause()
        assert app.view.end < later


async def test_command_palette_lists_every_action() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        titles = {c.title for c in app.get_system_commands(app.screen)}
        from gpuwatch.tui.actions import LIVE_ACTIONS as ACTIONS

        assert {a.title for a in ACTIONS if a.action != "quit"} <= titles
        assert "Theme" in " ".join(titles) or any("theme" in t.lower() for t in titles)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"Largest spike")

        def spike_highlighted() -> bool:
            # The palette searches in a worker and shows its hits in batches.
            option = app.screen.query_one(CommandList).highlighted_option
            return option is not None and "Largest spike" in str(option.prompt)

        assert await until(pilot, spike_highlighted)
        await pilot.press("enter")
        assert await until(pilot, lambda: app.view.cursor is not None)


async def test_chart_caches_strips_until_something_changes() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f")  # paused: nothing moves by itself
        await pilot.pause(0.3)
        chart = gpu_panel(app).chart
        # The panel's focus, given at mount, restyles the chart (its strips go) without a
        # redraw: draw once, so what is counted below is only what the redraws change.
        chart.refresh()
        await pilot.pause()
        builds = chart.build_count
        await pilot.pause(0.3)  # several redraw ticks with no change
        chart.refresh()
        await pilot.pause()
        assert chart.build_count == builds
        app.session.add_gpu_sample(
            KEY, {"t": END, "used": 70 * synthetic.GIB, "total": 80 * synthetic.GIB}
        )
        assert await until(pilot, lambda: chart.build_count > builds)
        assert chart.build_count == builds + 1


async def test_a_paused_view_shows_new_data_at_once_then_at_most_twice_a_second() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f")  # paused
        await pilot.pause(0.6)
        chart = gpu_panel(app).chart
        sample = {"t": END, "used": 70 * synthetic.GIB, "total": 80 * synthetic.GIB}
        builds = chart.build_count
        app.session.add_gpu_sample(KEY, sample)
        assert await until(pilot, lambda: chart.build_count > builds)
        assert chart.build_count == builds + 1  # the first change shows at once
        redraws = app.dashboard.redraws
        start = time.monotonic()
        for _ in range(20):  # a sampler's stream: each sample used to redraw every panel
            app.session.add_gpu_sample(KEY, sample)
            await pilot.pause(0.05)
        took = time.monotonic() - start
        assert app.dashboard.redraws - redraws <= took / (FOLLOW_FRAME_NS / 1e9) + 1
        # The last of them shows.
        assert await until(pilot, lambda: chart.data_version == app.session.version)


async def test_a_frame_repaints_the_panel_only_for_a_new_title(monkeypatch) -> None:
    # Setting a border title repaints the whole panel (chart and all) even when unchanged.
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f")
        await pilot.pause(0.3)
        panel = gpu_panel(app)
        repaints: list[object] = []
        refresh = panel.refresh

        def counted(*args, **kwargs):
            repaints.append(args)
            return refresh(*args, **kwargs)

        monkeypatch.setattr(panel, "refresh", counted)
        builds = panel.chart.build_count
        sample = {"t": END, "used": 70 * synthetic.GIB, "total": 80 * synthetic.GIB}
        app.session.add_gpu_sample(KEY, sample)
        assert await until(pilot, lambda: panel.chart.build_count > builds)
        assert panel.chart.build_count == builds + 1  # a frame was drawn
        assert repaints == []
        panel.device.name = "Renamed GPU"
        app.session.add_gpu_sample(KEY, sample)
        # Paused, a second change of data shows within FOLLOW_FRAME_NS.
        assert await until(pilot, lambda: bool(repaints) and "Renamed GPU" in panel.border_title)


@pytest.mark.parametrize("theme", ["gpuwatch-dark", "gpuwatch-light", "gpuwatch-contrast"])
async def test_every_theme_colours_the_lines(theme: str) -> None:
    app = make_app(theme_name=theme)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.theme == theme
        chart = gpu_panel(app).chart
        colours = {
            seg.style.color.name
            for strip in chart._strips
            for seg in strip
            if seg.style
            and seg.style.color
            and seg.text.strip("⠀ ")
            and any(0x2800 < ord(c) <= 0x28FF for c in seg.text)
        }
        expected = {
            app.theme_variables[f"gw-{r}"].lower() for r in ("nvml", "reserved", "allocated")
        }
        assert expected <= {c.lower() for c in colours}


async def test_theme_switch_rebuilds_chart() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f")
        await pilot.pause()
        chart = gpu_panel(app).chart
        builds = chart.build_count
        app.theme = "gpuwatch-light"
        assert await until(pilot, lambda: chart.build_count > builds)


async def test_one_band_row_per_rank_named_by_rank() -> None:
    from gpuwatch.protocol import Message

    session = synthetic.build(with_process=False)
    for rank, pid in ((0, 501), (1, 502)):
        session.ingest(
            Message(
                "hello",
                pid,
                0,
                0,
                body={
                    "rank": rank,
                    "world_size": 2,
                    "devices": [{"index": 0, "uuid": synthetic.UUID}],
                },
            )
        )
        for seq, (event, t) in enumerate((("begin", 100), ("end", 300)), start=1):
            session.ingest(
                Message(
                    "phase",
                    pid,
                    seq,
                    t * synthetic.MS,
                    body={"event": event, "name": "forward", "id": 1, "depth": 0},
                )
            )
    app = GpuwatchApp(session, clock=lambda: END)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert [r.label for r in gpu_panel(app).band.rows] == ["rank 0", "rank 1"]


async def test_without_colour_lines_and_segments_stay_apart(monkeypatch) -> None:
    # NO_COLOR turns every colour grey: the lines carry letters, the bar's segments fills.
    monkeypatch.setenv("NO_COLOR", "1")
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.no_color
        panel = gpu_panel(app)
        chart = "\n".join(s.text for s in panel.chart._strips)
        for letter in "NRAP":
            assert letter in chart, (letter, chart)
        legend = str(panel.legend.render())
        for swatch in ("N nvidia-smi", "R reserved", "A allocated", "P predicted"):
            assert swatch in legend, legend
        bar, labels = panel.bar.render().plain.split("\n")
        assert "W" in bar and "O" in bar and "Wweights" in labels and "Ooptim" in labels
        # Each segment one fill: the weights and the optimizer state do not merge.
        assert bar.index("W") != bar.index("O")


@pytest.mark.parametrize("size", [(80, 24), (140, 45)])
async def test_notes_are_lines_and_a_cut_one_says_so(size) -> None:
    # Before: notes joined by a literal `\n`, and at 80x24 cut at the edge with no `…`.
    session = synthetic.build()
    session.note("the first note: " + "long words " * 12)
    session.note("the second note")
    app = GpuwatchApp(session, clock=lambda: END)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        bar = app.dashboard.notes_bar
        shown = [bar.render_line(y).text.rstrip() for y in range(bar.size.height)]
        text = "\n".join(shown)
        assert "\\n" not in text, text
        if size[1] < 36:  # one line: both notes joined, the cut marked
            assert len(shown) == 1 and shown[0].endswith("…"), shown
        else:
            assert any(line.strip() == "the second note" for line in shown), shown


async def test_a_stop_asked_before_the_app_took_the_signal_quits_on_mount() -> None:
    # gpuwatch run: a SIGTERM whose exception was swallowed before the app installed its
    # own handler (the launcher records it) must still end the dashboard.
    asked: list[bool] = []

    def quit_if() -> bool:
        asked.append(True)
        return True

    app = make_app(quit_if=quit_if)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert asked and not app.is_running
    kept = make_app(quit_if=lambda: False)
    async with kept.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert kept.is_running
