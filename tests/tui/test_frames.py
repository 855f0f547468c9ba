"""Issue 38: an idle dashboard wakes only when a frame is due (issue 53: tested as a unit).

Following live, the frame key changes when the clock enters the next step (a chart column,
at least ``FOLLOW_FRAME_NS``): the dashboard looks for a frame then, not 20 times a second
in between. What no key follows is still seen: data a paused view held back shows when its
interval is over. :class:`FrameClock` holds that timing; here it runs on a test's clock
and timers, without the app, and one short test shows the app drawing by it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import many_gpus
import synthetic
from conftest import until
from textual.content import Content
from textual.strip import Strip

from gpuwatch.session.frame import FrameState, WindowOf
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.frame_clock import FOLLOW_FRAME_NS, FRAME_SLACK, REDRAW_HZ, FrameClock
from gpuwatch.tui.time_window import TimeWindow

MS = 1_000_000


@dataclass
class Timer:
    """A timer of :class:`Clock`: fires at ``at`` (ns) unless stopped."""

    at: int
    call: Callable[[], None]
    stopped: bool = False

    def stop(self) -> None:
        self.stopped = True


@dataclass
class Clock:
    """A test's monotonic clock and the timers armed on it."""

    ns: int = 10**12
    timers: list[Timer] = field(default_factory=list)
    looks: list[int] = field(default_factory=list)

    def set_timer(self, wait: float, call: Callable[[], None]) -> Timer:
        timer = Timer(self.ns + round(wait * 1e9), call)
        self.timers.append(timer)
        return timer

    def armed(self) -> list[Timer]:
        return [t for t in self.timers if not t.stopped]

    def run_until(self, ns: int) -> None:
        """Move the clock to ``ns``, firing each timer on the way at its time (a stopped
        timer's callback still comes if it fired before: as Textual's queue has it)."""
        while True:
            due = sorted((t for t in self.armed() if t.at <= ns), key=lambda t: t.at)
            if not due:
                break
            timer = due[0]
            self.ns = max(self.ns, timer.at)
            self.timers.remove(timer)
            timer.call()
        self.ns = ns


def frames(
    clock: Clock, view: TimeWindow, plot_width: int = 100
) -> tuple[Callable[[], None], list[int]]:
    """The tick of a frame clock whose looks draw (key the frame, record when) and
    schedule the next, as the main screen's tick does; and the times frames were drawn."""
    drawn: list[int] = []
    shown: list[object] = [None]

    def tick() -> None:
        clock.looks.append(clock.ns)
        fc.due = None
        key, _ = fc.key(view, clock.ns, plot_width, version=0)
        if key != shown[0]:
            shown[0] = key
            drawn.append(clock.ns)
        fc.schedule(False, lambda t: (t - clock.ns) / 1e9)  # the transport's clock: ours

    fc = FrameClock(clock.set_timer, tick, clock=lambda: clock.ns)
    return tick, drawn


def test_following_a_frame_is_keyed_on_its_column_step_and_due_at_the_next() -> None:
    clock = Clock()
    fc = FrameClock(clock.set_timer, lambda: None, clock=lambda: clock.ns)
    view = TimeWindow(span=60 * 10**9)  # following; 100 columns: 600 ms a column
    step = 600 * MS
    now = 1000 * step + 123
    key, at = fc.key(view, now, 100, version=7)
    assert at == 1000 * step and fc.due == ("clock", 1001 * step)
    assert fc.key(view, now + step - 124, 100, version=8)[0] == key  # same column, new data
    assert fc.key(view, 1001 * step, 100, version=8)[0] != key
    # A narrow window's column is shorter than FOLLOW_FRAME_NS: whole columns, at least that.
    narrow = TimeWindow(span=10**9)  # 10 ms a column
    fc.key(narrow, 0, 100, version=0)
    assert fc.due == ("clock", FOLLOW_FRAME_NS)


def test_following_an_idle_dashboard_looks_once_a_frame_not_twenty_times_a_second() -> None:
    clock = Clock()
    tick, drawn = frames(clock, TimeWindow(span=60 * 10**9))
    tick()
    start = clock.ns
    clock.run_until(start + 10 * 10**9)
    # A frame each 600 ms column; each look draws one (20 a second was 200 looks).
    assert 16 <= len(drawn) <= 18, len(drawn)
    assert len(clock.looks) <= len(drawn) + 2, (len(clock.looks), len(drawn))
    assert len(clock.armed()) == 1  # one look pending, never more


def test_a_wide_step_still_looks_once_a_second() -> None:
    clock = Clock()
    fc = FrameClock(clock.set_timer, lambda: None, clock=lambda: clock.ns)
    fc.key(TimeWindow(span=3600 * 10**9), 0, 100, version=0)  # 36 s a column
    assert fc.wait(False, lambda t: t / 1e9) == 1.0
    assert fc.wait(True, lambda t: t / 1e9) == 1 / REDRAW_HZ  # a replay polls
    fc.due = None
    assert fc.wait(False, lambda t: t / 1e9) == FOLLOW_FRAME_NS / 1e9  # nothing due
    fc.due = ("clock", 250 * MS)
    assert fc.wait(False, lambda t: t / 1e9) == 0.25 + FRAME_SLACK


def test_held_back_data_in_a_paused_view_shows_when_its_interval_is_over() -> None:
    clock = Clock()
    fc = FrameClock(clock.set_timer, lambda: None, clock=lambda: clock.ns)
    paused = TimeWindow(span=60 * 10**9, end=0)
    assert not paused.following
    key, _ = fc.key(paused, 0, 100, version=1)
    assert key == ("paused", 1) and fc.due is None  # new data: shown at once
    clock.ns += 100 * MS
    assert fc.key(paused, 0, 100, version=2)[0] == ("paused", 1)  # held back
    assert fc.due == ("monotonic", clock.ns - 100 * MS + FOLLOW_FRAME_NS)
    assert abs(fc.wait(False, lambda t: 0.0) - (0.4 + FRAME_SLACK)) < 1e-9
    clock.ns += 400 * MS
    assert fc.key(paused, 0, 100, version=2)[0] == ("paused", 2)  # its interval is over


def test_a_sooner_look_replaces_a_later_one_and_a_stopped_one_is_ignored() -> None:
    clock = Clock()
    looks: list[int] = []
    fc = FrameClock(clock.set_timer, lambda: looks.append(clock.ns), clock=lambda: clock.ns)
    fc.look_in(0.5)
    fc.look_in(0.8)  # later than the pending one: it stands
    assert len(clock.armed()) == 1
    later = clock.armed()[0]
    fc.look_in(0.05)  # sooner: replaces it
    assert later.stopped and len(clock.armed()) == 1
    later.call()  # a stopped timer's callback that was already queued
    assert looks == []
    clock.run_until(clock.ns + 10**9)
    assert looks == [clock.ns - 10**9 + 50 * MS]


def test_data_wakes_the_screen_at_most_once_per_frame_interval_and_not_while_following() -> None:
    clock = Clock()
    fc = FrameClock(clock.set_timer, lambda: None, clock=lambda: clock.ns)
    assert not fc.data_wakes(following=True)  # following: the timer draws it
    assert fc.data_wakes(following=False)
    assert not fc.data_wakes(following=False)  # not seen yet: one message at a time
    fc.data_seen()
    assert not fc.data_wakes(following=False)  # seen, but within 1 / REDRAW_HZ
    clock.ns += 10**9 // REDRAW_HZ + 1
    assert fc.data_wakes(following=False)


async def test_the_app_draws_its_frames_by_its_frame_clock() -> None:
    # The dashboard keys its frames, and sleeps between them, by its FrameClock: following
    # a moving clock frames come, a look armed for each.
    start = time.monotonic_ns()
    app = GpuwatchApp(
        synthetic.build(), clock=lambda: synthetic.end_time() + time.monotonic_ns() - start
    )
    async with app.run_test(size=(140, 45)) as pilot:
        screen = app.dashboard
        assert isinstance(screen.frames, FrameClock) and app.view.following
        redraws = screen.redraws
        assert await until(pilot, lambda: screen.redraws >= redraws + 2, timeout=10)
        assert screen.frames.due is not None and screen.frames.due[0] == "clock"


async def test_the_overview_lines_are_what_content_renders() -> None:
    # A frame draws the overview's lines from runs with styles resolved once per theme and
    # focus; each must be the strip a Content of the same runs renders: the selected row,
    # a MIG instance's dim figures, every theme, with and without focus.
    session = many_gpus.build(2, mig=True)
    app = GpuwatchApp(session, clock=lambda: many_gpus.END_MS * many_gpus.MS)
    async with app.run_test(size=(100, 30)) as pilot:
        overview = app.dashboard.overview
        # The layout chooses the overview, and a frame gives it its rows.
        assert await until(
            pilot,
            lambda: app.dashboard.overview_shown and any(r.util is None for r in overview.rows),
        )
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


async def test_a_frame_reads_the_session_once_and_draws_from_what_it_read() -> None:
    # Issue 53: the main screen and its status line draw from one FrameState a frame, read
    # under the session's lock; the session changing after it leaves that frame as read.
    session = synthetic.build()
    reads: list[FrameState] = []
    take = session.frame_state

    def counted(window_of: WindowOf) -> FrameState:
        reads.append(take(window_of))
        return reads[-1]

    session.frame_state = counted  # type: ignore[method-assign]
    app = GpuwatchApp(session, clock=lambda: synthetic.end_time())
    async with app.run_test(size=(140, 45)) as pilot:
        screen = app.dashboard
        assert await until(pilot, lambda: screen.redraws >= 1, timeout=10)
        for _ in range(3):
            await pilot.pause()
            reads.clear()
            redraws = screen.redraws
            screen.redraw()
            assert screen.redraws == redraws + 1 and reads == [screen.state]
        state = screen.state
        assert "1 instrumented" in str(screen.status_bar.render())
        session.count_reject("oversized")
        session.note("a new note")
        assert screen.state is state and state.rejects == 0 and not state.notes
        screen._update_status()  # the status line says what the frame read, not the session
        assert "rejected" not in str(screen.status_bar.render())
        screen.redraw()
        assert screen.state.rejects == 1 and screen.state.notes == ("a new note",)
        assert await until(pilot, lambda: "1 rejected" in str(screen.status_bar.render()))
