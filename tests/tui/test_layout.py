"""The first screen: replay opens on the data, figures at the cursor, the band, 80x24."""

from __future__ import annotations

from pathlib import Path

import pytest
import synthetic
from conftest import ROOT, FakeClock, until

from gpuwatch.fmt import fmt_bytes
from gpuwatch.protocol import Message
from gpuwatch.session import HOST, Session, gpu_key
from gpuwatch.store import Player, open_recording, open_session, save_session
from gpuwatch.store.player import open_replay
from gpuwatch.tui._text import Part, fit, fit_ranked
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.band import BandMarker, BandRow, fold_rows, label_width, span_cells
from gpuwatch.tui.keys import Key, KeyBar
from gpuwatch.tui.replay import replay_app

MS = synthetic.MS
END = synthetic.end_time()
KEY = gpu_key(synthetic.UUID)
SAMPLES = ROOT / "samples"
SPIKE = SAMPLES / "gpt-2.7b-h100-adamw-spike.gpuwatch"
CPU = SAMPLES / "tiny-gpt-cpu-sdpa.gpuwatch"


def gpu_panel(app: GpuwatchApp):
    return next(p for p in app.dashboard.panels if p.key == KEY)


def add_process(session: Session, pid: int, t0_ms: int, t1_ms: int, *, bye: bool = True) -> None:
    """A process on the synthetic GPU with one forward phase, gone at ``t1_ms``."""
    body = {"devices": [{"index": 0, "uuid": synthetic.UUID}]}
    session.ingest(Message("hello", pid, 0, t0_ms * MS, body=body))
    for seq, (event, t) in enumerate((("begin", t0_ms), ("end", t1_ms - 10)), start=1):
        phase = {"event": event, "name": "forward", "id": 1, "depth": 0}
        session.ingest(Message("phase", pid, seq, t * MS, body=phase))
    if bye:
        session.ingest(Message("bye", pid, 3, t1_ms * MS, body={}))


# --------------------------------------------------------------------------- opening


def test_a_long_recording_opens_on_its_training_part() -> None:
    player = open_replay(SPIKE)
    try:
        first, last = player.bounds()
        opening = player.opening()
        t0, t1 = opening.window
        # 55 s recorded, the first 48 s building the model: the window is the training.
        assert (last - first) / 1e9 > 52
        assert 5 < (t1 - t0) / 1e9 < 9 and (t0 - first) / 1e9 > 45
        # The playback position is the cursor's time (the scrubber and cursor agree).
        assert opening.position == opening.cursor and not player.playing
        # The cursor sits inside an optimizer.step that peaked at exactly 53.61 GiB.
        (proc,) = player.session.processes.values()
        span = player.session.span_at(proc, opening.cursor)
        assert span["name"] == "optimizer.step"
        assert fmt_bytes(span["peak_alloc"]) == "53.61 GiB"
    finally:
        player.close()


def test_a_recording_that_is_mostly_training_opens_whole(tmp_path: Path) -> None:
    path = save_session(synthetic.build(), tmp_path / "s.gpuwatch")
    player = open_replay(path)
    try:
        assert player.opening().window == player.bounds()
    finally:
        player.close()


def test_a_recording_without_processes_opens_whole(tmp_path: Path) -> None:
    path = save_session(synthetic.build(with_process=False), tmp_path / "s.gpuwatch")
    player = open_replay(path)
    try:
        opening = player.opening()
        assert opening.window == player.bounds()
        assert opening.cursor is not None  # the highest NVML reading
    finally:
        player.close()


async def test_replay_first_screen_is_the_spike() -> None:
    player = open_replay(SPIKE)
    try:
        app = replay_app(player, subtitle="replay spike")
        async with app.run_test(size=(200, 60)) as pilot:
            await pilot.pause()
            opening = player.opening()
            assert app.view.window(app.now()) == opening.window
            assert app.view.cursor == opening.cursor
            legend = gpu_legend(app)
            assert "peak in phase 53.61 GiB" in legend and "optimizer.step" in legend
            assert "REPLAY paused" in app.dashboard.status_bar.text
    finally:
        player.close()


def gpu_legend(app: GpuwatchApp) -> str:
    panel = next(p for p in app.dashboard.panels if not p.is_host)
    return panel.legend.text


# --------------------------------------------------------------------------- figures


async def test_header_figures_are_those_at_the_cursor() -> None:
    app = GpuwatchApp(synthetic.build(), clock=lambda: END)
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.pause()
        panel = gpu_panel(app)
        # The newest sample: reserved's high-water mark plus the context, 53.5 GiB.
        assert "53.50 GiB / 80.00 GiB" in panel.header.text
        app.view = app.view.with_cursor(50 * MS, app.now())  # the first 100 ms: 13.5 GiB
        app.dashboard.redraw()
        await pilot.pause()
        assert "13.50 GiB / 80.00 GiB" in panel.header.text
        assert "53.50" not in panel.header.text
        assert "10 Hz" in panel.header.text  # the rate around that time, from the samples


async def test_replay_header_follows_the_play_position(tmp_path: Path) -> None:
    path = save_session(synthetic.build(), tmp_path / "s.gpuwatch")
    rec = open_recording(path)
    session, loader = open_session(rec)
    loader.load_all()
    clock = FakeClock(100.0)
    player = Player(session, loader, playing=False, clock=clock)
    try:
        app = replay_app(player)
        async with app.run_test(size=(140, 45)) as pilot:
            await pilot.press("escape", "home")  # no cursor; play position at the start
            await pilot.pause()
            header = gpu_panel(app).header.text
            assert "13.50 GiB / 80.00 GiB" in header, header
            await pilot.press("end")
            await pilot.pause()
            assert "53.50 GiB / 80.00 GiB" in gpu_panel(app).header.text
    finally:
        rec.close()


async def test_the_process_count_is_the_bands() -> None:
    session = synthetic.build()
    add_process(session, 777, 500, 1500)  # a second process, gone after 1.5 s
    app = GpuwatchApp(session, clock=lambda: END)
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.pause()
        panel = gpu_panel(app)
        assert len(panel.band.rows) == 2 and "2 instrumented" in app.dashboard.status_bar.text
        await pilot.press(*["plus"] * 5)  # the last 1.9 s: the second one is long gone
        await pilot.pause()
        assert [r.label for r in panel.band.rows] == ["pid 4242"]
        assert "1 instrumented" in app.dashboard.status_bar.text


async def test_recorded_notes_read_as_the_recordings() -> None:
    player = open_replay(CPU)
    try:
        app = replay_app(player)
        async with app.run_test(size=(140, 45)) as pilot:
            await pilot.pause()
            notes = str(app.dashboard.notes_bar.render())
            assert notes.startswith("recorded on vm: no NVIDIA driver found"), notes
    finally:
        player.close()


# --------------------------------------------------------------------------- band


def test_adjacent_spans_share_no_cell_and_short_ones_keep_one() -> None:
    scale = 1 / 10  # 10 ns a cell
    a = span_cells(0, 73, 0, scale, 100)  # 7.3 cells
    b = span_cells(73, 150, 0, scale, 100)
    assert a == (0, 6) and b == (7, 14)
    assert span_cells(40, 42, 0, scale, 100) == (4, 4)  # a fifth of a cell: still one
    assert span_cells(2000, 3000, 0, scale, 100) is None


def test_many_processes_fold_and_keep_their_ooms() -> None:
    rows = [BandRow(f"pid {i}", [], []) for i in range(9)]
    rows[8].markers.append(BandMarker(5, "oom"))
    folded = fold_rows(rows, 6)
    assert [r.label for r in folded] == [*(f"pid {i}" for i in range(5)), "+4 more"]
    assert folded[-1].markers == [BandMarker(5, "oom")]
    assert fold_rows(rows[:6], 6) == rows[:6]


async def test_long_pids_are_not_cut_and_the_axes_stay_aligned() -> None:
    session = synthetic.build()
    add_process(session, 4194304, 100, 5000, bye=False)
    app = GpuwatchApp(session, clock=lambda: END)
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.pause()
        panel = gpu_panel(app)
        assert label_width(panel.band.rows) == len("pid 4194304") + 1
        assert panel.band.axis_width == panel.chart.axis_width == 12
        lines = [panel.band.render_line(y).text for y in range(len(panel.band.rows))]
        assert any(line.startswith("pid 4194304 ") for line in lines), lines
        # The chart's y axis moved with it: the plot starts in the same column.
        assert panel.chart.render_line(0).text[11] in "┤│"


async def test_many_processes_fold_into_more_on_screen() -> None:
    session = synthetic.build()
    for i in range(8):
        add_process(session, 9000 + i, 100, 5000, bye=False)
    app = GpuwatchApp(session, clock=lambda: END)
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.pause()
        labels = [r.label for r in gpu_panel(app).band.rows]
        assert len(labels) == 6 and labels[-1] == "+4 more"
        assert "9 instrumented" in app.dashboard.status_bar.text  # all of them, folded or not


async def test_phase_names_and_a_key_for_the_colours() -> None:
    app = GpuwatchApp(synthetic.build(), clock=lambda: END)
    async with app.run_test(size=(140, 45)) as pilot:
        # The last 1.9 s in view, 14 ms a cell; paused, so the window ends at the end.
        await pilot.press(*["plus"] * 5, "f")
        await pilot.pause()
        band = gpu_panel(app).band
        row = band.render_line(0).text
        # forward (300 ms) and backward (340 ms) have room; optimizer.step (100 ms, 7
        # cells) gets its short name.
        assert "forward" in row and "backward" in row and " opt " in row, row
        key = band.render_line(1).text
        assert key.startswith("phases") and "zero_grad" in key and "✖ OOM" in key
        assert "optimizer.step" in key
        await pilot.press("plus", "plus")  # 0.47 s: optimizer.step (100 ms) fits whole
        await pilot.pause()
        assert "optimizer.step" in band.render_line(0).text


# --------------------------------------------------------------------------- sizes


async def test_80x24_shows_one_panel_at_a_time_and_keeps_help_and_quit() -> None:
    app = GpuwatchApp(synthetic.build(), clock=lambda: END, subtitle="socket /run/user/1000/x")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.screen.has_class("-short")
        panels = app.dashboard.panels
        view = app.dashboard.panel_list.scrollable_content_region.height
        assert all(p.outer_size.height == view for p in panels)
        # The place in the title comes with the frame after the short layout is known
        # (one pause was not always enough on a busy machine).
        assert await until(pilot, lambda: "1/2" in panels[0].border_title)
        gpu = panels[0]
        assert gpu.chart.size.height >= 10  # five rows before the compact layout
        keys = app.dashboard.key_bar.render().plain
        assert "? Help" in keys and "q Quit" in keys and "tab Next panel" in keys
        status = app.dashboard.status_bar.text
        assert "1 instrumented" in status and len(status) <= 78
        await pilot.press("tab")
        await pilot.pause()
        assert app.dashboard.focused_panel() is panels[1]
        assert panels[1].region.y == app.dashboard.panel_list.region.y  # scrolled into view
        legend = gpu.legend.text
        assert "reserved" in legend and "allocated" in legend


async def test_200x60_shows_every_panel() -> None:
    app = GpuwatchApp(synthetic.build(), clock=lambda: END)
    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.pause()
        assert not app.screen.has_class("-short")
        gpu, host = app.dashboard.panels
        assert gpu.region.height > 30 and host.region.height == 12
        assert gpu.region.bottom <= host.region.y
        assert "tab Next panel" not in app.dashboard.key_bar.render().plain


def test_fit_keeps_the_first_parts_whole() -> None:
    parts = ["gpuwatch · LIVE", "window 1:00", "2 instrumented", "socket /run/user/1000/gw.sock"]
    line = fit(parts, 60).plain
    assert line.startswith("gpuwatch · LIVE · window 1:00 · 2 instrumented · socket")
    assert line.endswith("…") and len(line) == 60
    # Too little room left for a useful piece of the last part: it goes whole.
    assert fit(parts, 50).plain == "gpuwatch · LIVE · window 1:00 · 2 instrumented"
    two = fit(["aaaa", "bbbb", "cccc"], 10, "  ", max_lines=2).plain
    assert two == "aaaa  bbbb\ncccc"


def test_fit_ranked_gives_way_in_its_own_order() -> None:
    # Shown in order, given way by rank: the mark is cut to its floor first, then the
    # count and the window go, then the subtitle is cut; the warning never goes.
    mark = "◆ 0:17 step 10: loss 10.956, eval 10.948 and more text"
    parts = [
        Part("gpuwatch · LIVE"),
        Part("NOT RECORDING (disk full)"),
        Part("cursor 0:17", keep=6),
        Part(mark, keep=5, floor=24),
        Part("window 1:00", keep=2),
        Part("2 instrumented", keep=1),
        Part("replay a-long-file-name.gpuwatch", keep=3, floor=16),
    ]
    full = fit_ranked(parts, 400).plain
    assert full == " · ".join(str(p.text) for p in parts)
    line = fit_ranked(parts, 140).plain  # the mark and subtitle cut, the rest whole
    assert len(line) == 140 and "window 1:00 · 2 instrumented · replay a-long-f…" in line
    assert mark[:20] in line and mark not in line
    line = fit_ranked(parts, 100).plain
    assert "window" not in line and "instrumented" not in line and len(line) <= 100
    assert "NOT RECORDING (disk full) · cursor 0:17" in line
    assert mark[:20] in line and line.endswith("replay a-lon…")
    narrow = fit_ranked(parts, 40).plain
    assert narrow.startswith("gpuwatch · LIVE · NOT RECORDING (disk") and len(narrow) <= 40


@pytest.mark.parametrize("width", [30, 60, 200])
def test_key_bar_always_keeps_help_and_quit(width: int) -> None:
    bar = KeyBar()
    bar.keys = [
        Key("space", "Play / pause", "toggle_play"),
        Key("s", "Largest spike", "jump"),
        Key("w", "Whole session", "whole"),
        Key("?", "Help", "help"),
        Key("q", "Quit", "quit"),
    ]
    shown = [k.key for k in bar.shown(width)]
    assert shown[-2:] == ["?", "q"]
    assert shown == ["?", "q"] if width == 30 else shown[0] == "space"


async def test_clicking_a_key_on_the_bar_runs_it() -> None:
    app = GpuwatchApp(synthetic.build(), clock=lambda: END)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        text = app.dashboard.key_bar.render().plain
        await pilot.click(KeyBar, offset=(text.index("? Help") + 1, 0))
        await pilot.pause()
        assert type(app.screen).__name__ == "HelpScreen"
        assert app.dashboard.panels[0].key == KEY and HOST in app.dashboard.panel_list.by_key


async def test_phase_names_on_the_band_never_touch() -> None:
    # Before: `backward` filled its 8 cells and `opt` began in the next: `backwardopt`.
    from textual.app import App

    from gpuwatch.tui.band import BandSpan, PhaseBand

    spans = [
        BandSpan("forward", 0, 100, 0),
        BandSpan("backward", 100, 180, 0),  # 8 cells: its name only without a gap
        BandSpan("optimizer.step", 180, 240, 0),
        BandSpan("zero_grad", 240, 340, 0),  # 10 cells: its name and a gap
        BandSpan("eval", 340, 400, 0),
    ]

    class One(App):
        def compose(self):
            yield PhaseBand(lambda t0, t1, n: [BandRow("pid 1", spans, [])])

    app = One()
    async with app.run_test(size=(9 + 40, 5)) as pilot:
        band = app.query_one(PhaseBand)
        band.update_view((0, 400), None, 1)
        await pilot.pause()
        line = band.render_line(0).text
        assert "backwardopt" not in line and "zero_gradev" not in line, line
        assert "bwd" in line and "opt" in line and "zero_grad" in line, line


@pytest.mark.parametrize(
    ("sample", "cause"),
    [
        # AdamW's foreach temporary: what the phase held above the figure at the cursor
        # (its explanation's, as `info` gives it)
        ("gpt-2.7b-h100-adamw-spike.gpuwatch", "▲+tmp 10.7G "),
        ("gpt2-small-h100.gpuwatch", "■act "),
        ("gpt2-small-h100-oom.gpuwatch", "■act "),
    ],
)
async def test_at_80x24_the_first_screen_shows_the_cause_free_and_the_exact_peaks(
    sample: str, cause: str
) -> None:
    # Before: the legend ran out at `■optim 21.…` (bar order, cut mid-number), so the
    # spike's cause and free never showed; the exact-peak dashes hid under other lines.
    from rich.color import Color

    player = open_replay(SAMPLES / sample)
    try:
        app = replay_app(player)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            panel = app.dashboard.panels[0]
            legend = panel.bar.render().plain.split("\n")[1]
            assert cause in legend and "░free " in legend, legend
            # Whole items only: every shown figure ends with its unit.
            for item in legend.rstrip(" …").split(" "):
                assert not item[-1:].isdigit() and not item.endswith("."), legend
            peak = Color.parse(app.theme_variables["gw-peak"])
            cells = sum(
                len(seg.text)
                for strip in panel.chart._strips
                for seg in strip
                if seg.style is not None and seg.style.color == peak
            )
            assert cells >= 20, cells  # the exact peak of each phase in view shows
    finally:
        player.close()
