"""SVG snapshots of the main views at a fixed terminal size, in every theme.

Regenerate after an intended change with ``python -m pytest tests/tui/test_snapshots.py
--snapshot-update`` and look at the report before committing.
"""

from __future__ import annotations

import many_gpus
import pytest
import rank_session
import synthetic
from conftest import ROOT, screen_text, until

from gpuwatch.store.player import open_replay
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.marks import MarksTable
from gpuwatch.tui.replay import replay_app

SIZE = (140, 45)
# Zoom to the six seconds of data and put the cursor inside an optimizer.step.
ZOOMED = ("plus", "plus", "plus", "home", "m", "left", "left", "left", "left")


async def zoomed(pilot) -> None:
    """:data:`ZOOMED`, then the toast `m` raises goes (it would cover the legend)."""
    await pilot.press(*ZOOMED)
    pilot.app.clear_notifications()
    await pilot.pause()


def app(theme: str = "gpuwatch-dark") -> GpuwatchApp:
    return GpuwatchApp(synthetic.build(), theme_name=theme, clock=lambda: synthetic.end_time())


@pytest.mark.parametrize("theme", ["gpuwatch-dark", "gpuwatch-light", "gpuwatch-contrast"])
def test_timelines(snap_compare, theme: str) -> None:
    assert snap_compare(app(theme), run_before=zoomed, terminal_size=SIZE)


async def peaks(pilot) -> None:
    """The Peaks tab, once its OOMs' answers are planned (a thread worker) and shown."""
    await pilot.press("2")
    # A plan starts when a row first describes its OOM, which may come after the key has
    # been handled: asking for each answer here starts any plan not started yet (a
    # second ask starts none), so that waiting for the workers waits for every plan,
    # however long a loaded machine makes it. Each worker ends after its answer is in
    # the table (call_from_thread waits for the UI thread).
    table = pilot.app.query_one(MarksTable)
    ooms = list(pilot.app.session.ooms)
    assert ooms
    for oom in ooms:
        table.answer(oom)
    await pilot.app.workers.wait_for_complete()
    assert len(table.answers) == len(ooms)
    # The rows hold the answers now; the screen shows them after its next refresh.
    said = [table.describe(oom).rpartition("; ")[2] for oom in ooms]
    assert await until(pilot, lambda: all(s in screen_text(pilot.app) for s in said))
    await pilot.pause()


def test_peaks_table(snap_compare) -> None:
    assert snap_compare(app(), run_before=peaks, terminal_size=SIZE)


def test_process_table(snap_compare) -> None:
    assert snap_compare(app(), press=("3",), terminal_size=SIZE)


async def first_frame(pilot) -> None:
    """The dashboard behind the help has drawn its first frame (a loaded machine may handle
    the key before it, and the help would then cover a half-drawn screen)."""
    assert await until(pilot, lambda: bool(pilot.app.dashboard.redraws))
    await pilot.pause()


def test_help_screen(snap_compare) -> None:
    assert snap_compare(
        app(), press=("question_mark",), run_before=first_frame, terminal_size=SIZE
    )


# The two sizes the layout is held to: a laptop's 80x24 (one panel at a time, tab steps)
# and a large 200x60 terminal (every panel stacked).
SIZES = {"80x24": (80, 24), "200x60": (200, 60)}


@pytest.mark.parametrize("size", SIZES)
def test_live_at_each_size(snap_compare, size: str) -> None:
    assert snap_compare(app(), run_before=zoomed, terminal_size=SIZES[size])


SPIKE = ROOT / "samples" / "gpt-2.7b-h100-adamw-spike.gpuwatch"


def replay_first_screen(theme: str) -> GpuwatchApp:
    """``gpuwatch replay samples/gpt-2.7b-h100-adamw-spike.gpuwatch``, README's first command.

    The player stays open for the app's life: the snapshot plugin runs the app itself.
    """
    return replay_app(open_replay(SPIKE), theme_name=theme, subtitle=f"replay {SPIKE.name}")


@pytest.mark.parametrize("theme", ["gpuwatch-dark", "gpuwatch-light", "gpuwatch-contrast"])
def test_replay_first_screen_of_the_spike(snap_compare, theme: str) -> None:
    assert snap_compare(replay_first_screen(theme), terminal_size=SIZES["200x60"])


def test_replay_first_screen_of_the_spike_at_80x24(snap_compare) -> None:
    assert snap_compare(replay_first_screen("gpuwatch-dark"), terminal_size=SIZES["80x24"])


def test_ranks_tab_at_80x24(snap_compare) -> None:
    # A 4-rank job: rank 0 high in eval, rank 2 with a context on GPU 0; both flagged.
    session = rank_session.build()
    ranks = GpuwatchApp(session, clock=lambda: session.time_range()[1])
    assert snap_compare(ranks, press=("5",), terminal_size=SIZES["80x24"])


@pytest.mark.parametrize("theme", ["gpuwatch-dark", "gpuwatch-light", "gpuwatch-contrast"])
def test_overview_of_eight_gpus_at_80x24(snap_compare, theme: str) -> None:
    # Issue 38: 8 GPUs do not fit as panels, so the first screen is the overview; the
    # clock inside a forward, so the instrumented GPUs name their phase.
    session = many_gpus.build(8, mig=True)
    overview = GpuwatchApp(session, theme_name=theme, clock=lambda: 3300 * many_gpus.MS)
    assert snap_compare(overview, terminal_size=SIZES["80x24"])
